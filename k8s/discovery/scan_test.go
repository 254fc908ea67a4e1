package discovery

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestScanGPU(t *testing.T) {
	r, err := Scan(ScanOptions{Root: fixture(t, "gpu-a100"), Topology: dev4(t), TopologyNode: "n1",
		Versions: map[DeviceKind]VersionPolicy{GPU: {Exact: "550.54.15"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("errors: %v", r.Errors)
	}
	want := []GPUDevice{
		{Address: "0000:07:00.0", DeviceID: "0x20b2", Model: "NVIDIA A100-SXM4-80GB", UUID: "GPU-4a3b2c1d-5e6f-7a8b-9c0d-1e2f3a4b5c60", VBIOS: "92.00.45.00.06", Minor: 0},
		{Address: "0000:0f:00.0", DeviceID: "0x20b2", Model: "NVIDIA A100-SXM4-80GB", UUID: "GPU-4a3b2c1d-5e6f-7a8b-9c0d-1e2f3a4b5c61", VBIOS: "92.00.45.00.06", Minor: 1},
	}
	if !slices.Equal(r.GPUs, want) {
		t.Errorf("GPUs\n got %+v\nwant %+v", r.GPUs, want)
	}
	if r.Drivers[GPU] != "550.54.15" {
		t.Errorf("driver %q", r.Drivers[GPU])
	}
	if len(r.NPUs) != 0 || len(r.KAE) != 0 {
		t.Errorf("NPUs %v, KAE %v on a GPU host", r.NPUs, r.KAE)
	}
	if want := []HugePagePool{{PageSize: 2 << 20, Total: 1024, Free: 1000}, {PageSize: 1 << 30}}; !slices.Equal(r.HugePages, want) {
		t.Errorf("huge pages %+v, want %+v", r.HugePages, want)
	}
	if len(r.NUMA) != 2 || len(r.NUMA[0].CPUs) != 64 || r.NUMA[1].CPUs[0] != 32 || r.NUMA[0].MemTotal != 1056467848<<10 || r.NUMA[0].MemFree != 1012345678<<10 {
		t.Errorf("NUMA %+v", r.NUMA)
	}
	wantLabels := map[string]string{
		LabelSuperNode: "dev4", LabelNode: "n1",
		LabelPrefix + "gpu.count": "2", LabelPrefix + "gpu.driver": "550.54.15", LabelPrefix + "gpu.driver-match": "true",
		LabelPrefix + "gpu.model": "NVIDIA_A100-SXM4-80GB", LabelPrefix + "hugepages-2Mi": "1024", LabelPrefix + "numa.count": "2",
	}
	if got := r.Labels(); !maps.Equal(got, wantLabels) {
		t.Errorf("labels\n got %v\nwant %v", got, wantLabels)
	}
	f := r.Features()
	if f["hugepages-2Mi.total"] != "1024" || f["numa.node1.cpus"] != "64" || f["gpu.count"] != "2" {
		t.Errorf("features %v", f)
	}
	if _, ok := f["hugepages-2Mi.free"]; ok {
		t.Errorf("free huge pages published: %v", f)
	}
}

// The driver version from the kernel module when /proc has none (a
// container that mounts /sys but not the driver's /proc files).
func TestScanGPUModuleVersion(t *testing.T) {
	root := fixture(t, "gpu-a100")
	if err := os.Remove(filepath.Join(root, "proc/driver/nvidia/version")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "sys/module/nvidia/version"), []byte("535.161.08\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Drivers[GPU] != "535.161.08" || len(r.Errors) != 0 {
		t.Errorf("driver %q, errors %v", r.Drivers[GPU], r.Errors)
	}
}

func TestScanNPUAndKAE(t *testing.T) {
	r, err := Scan(ScanOptions{Root: fixture(t, "ascend-910b-kunpeng"), Topology: dev4(t), TopologyNode: "n2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("errors: %v", r.Errors)
	}
	if len(r.NPUs) != 8 || r.NPUs[7].Index != 7 {
		t.Errorf("NPUs %v", r.NPUs)
	}
	if r.Drivers[NPU] != "24.1.rc2" || r.Firmware[NPU] != "7.5.0.1.129" || r.Drivers[KAE] != "2.3.2" {
		t.Errorf("drivers %v, firmware %v", r.Drivers, r.Firmware)
	}
	if len(r.KAE) != 6 {
		t.Fatalf("KAE %+v", r.KAE)
	}
	hpre := KAEEngine{Name: "hisi_hpre-0", Class: "hpre", API: "hisi_qm_v2", Algorithms: []string{"rsa", "dh", "ecdh", "x25519", "x448", "ecdsa", "sm2"}, AvailableInstances: 1024, Flags: 1}
	if got := r.KAE[0]; got.Name != hpre.Name || got.Class != hpre.Class || got.API != hpre.API || !slices.Equal(got.Algorithms, hpre.Algorithms) || got.AvailableInstances != 1024 || got.Flags != 1 {
		t.Errorf("KAE[0] %+v, want %+v", got, hpre)
	}
	if r.KAE[2].Class != "sec" || r.KAE[5].Class != "zip" {
		t.Errorf("classes %+v", r.KAE)
	}
	if len(r.HugePages) != 4 || r.HugePages[0].PageSize != 64<<10 || r.HugePages[1].Total != 4096 {
		t.Errorf("huge pages %+v", r.HugePages)
	}
	if len(r.NUMA) != 4 || len(r.NUMA[3].CPUs) != 48 || r.NUMA[3].CPUs[0] != 144 {
		t.Errorf("NUMA %+v", r.NUMA)
	}
	l := r.Labels()
	for k, v := range map[string]string{
		"npu.count": "8", "npu.driver": "24.1.rc2", "npu.firmware": "7.5.0.1.129",
		"kae.count": "6", "kae.hpre": "true", "kae.sec": "true", "kae.zip": "true", "kae.driver": "2.3.2",
		"numa.count": "4", "hugepages-2Mi": "4096", "node": "n2",
	} {
		if l[LabelPrefix+k] != v {
			t.Errorf("label %s = %q, want %q", k, l[LabelPrefix+k], v)
		}
	}
	if _, ok := l[LabelPrefix+"npu.driver-match"]; ok {
		t.Errorf("driver-match label without a policy: %v", l)
	}
	f := r.Features()
	if f["kae.hpre.algorithms"] != "dh,ecdh,ecdsa,rsa,sm2,x25519,x448" {
		t.Errorf("features %v", f)
	}
	if _, ok := f["kae.zip.instances"]; ok {
		t.Errorf("free KAE queues published: %v", f)
	}
	if got := r.Devices(); len(got) != 14 || got[0] != "KAE hisi_hpre-0" || got[13] != "NPU davinci7" {
		t.Errorf("devices %v", got)
	}
}

func TestScanBroken(t *testing.T) {
	r, err := Scan(ScanOptions{Root: fixture(t, "broken"), Topology: dev4(t), TopologyNode: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	// What was readable is there.
	if len(r.GPUs) != 1 || r.GPUs[0].Address != "0000:0f:00.0" || r.GPUs[0].Model != "NVIDIA H100 80GB HBM3" || r.GPUs[0].Minor != -1 {
		t.Errorf("GPUs %+v", r.GPUs)
	}
	if len(r.NPUs) != 2 || len(r.KAE) != 1 || r.KAE[0].Name != "hisi_hpre-3" {
		t.Errorf("NPUs %v, KAE %+v", r.NPUs, r.KAE)
	}
	if len(r.HugePages) != 1 || r.HugePages[0].PageSize != 1<<30 || len(r.NUMA) != 1 || r.NUMA[0].ID != 1 {
		t.Errorf("huge pages %+v, NUMA %+v", r.HugePages, r.NUMA)
	}
	// Every broken thing is one error that names it.
	want := []string{
		"GPU 0000:07:00.0: /sys/bus/pci/devices/0000:07:00.0/vendor: not a 0x-prefixed hexadecimal number",
		"GPU 0000:1f:00.0: /sys/bus/pci/devices/0000:1f:00.0/class: not a 0x-prefixed",
		"GPU 0000:0f:00.0: /proc/driver/nvidia/gpus/0000:0f:00.0/information: bad Device Minor \"minus-one\"",
		"GPU 0000:2a:00.0: /proc/driver/nvidia/gpus/0000:2a:00.0/information: missing",
		"GPU: /proc/driver/nvidia/version: no \"NVRM version:\" line",
		"NPU: /dev/davinci_manager: missing: the Ascend driver is not (fully) loaded",
		"NPU: /usr/local/Ascend/driver/version.info: no Version= line",
		"KAE hisi_hpre-2: /sys/class/uacce/hisi_hpre-2/flags: missing",
		"KAE hisi_sec2-1: /sys/class/uacce/hisi_sec2-1/available_instances: not a non-negative number: \"-3\\n\"",
		"KAE hisi_zip-0: /sys/class/uacce/hisi_zip-0/algorithms: no algorithms",
		"hugepages hugepages-2048kB: /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages: not a non-negative number",
		"numa node0: /sys/devices/system/node/node0/cpulist: bad CPU list",
	}
	var got []string
	for _, e := range r.Errors {
		got = append(got, e.Error())
	}
	if len(got) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, "discovery: "+w) }) {
			t.Errorf("no error %q in\n%s", w, strings.Join(got, "\n"))
		}
	}
	if f := r.Features(); f["scan.errors"] != "12" {
		t.Errorf("scan.errors = %q", f["scan.errors"])
	}
}

// A file that cannot be read is its device's error, as a malformed one is
// (a directory in its place: reading it fails even for root).
func TestScanUnreadable(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	p := filepath.Join(root, "sys/class/uacce/hisi_zip-4/available_instances")
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) != 1 || r.Errors[0].Device != "hisi_zip-4" || r.Errors[0].Path != "sys/class/uacce/hisi_zip-4/available_instances" || len(r.KAE) != 5 {
		t.Errorf("errors %v, KAE %d", r.Errors, len(r.KAE))
	}
}

func TestScanVersionConditions(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	for _, tc := range []struct {
		name           string
		policy         VersionPolicy
		status, reason string
		message        string
	}{
		{"none", VersionPolicy{}, ConditionTrue, "NoPolicy", "NPU driver 24.1.rc2; no version expected"},
		{"exact", VersionPolicy{Exact: "24.1.rc2"}, ConditionTrue, "VersionMatches", "NPU driver 24.1.rc2 as expected"},
		{"mismatch", VersionPolicy{Exact: "24.1.rc1"}, ConditionFalse, "VersionMismatch", "NPU driver 24.1.rc2, expected 24.1.rc1: install the expected driver or change the policy"},
		{"minimum", VersionPolicy{Minimum: "23.0.3"}, ConditionTrue, "VersionMatches", "NPU driver 24.1.rc2, at least 23.0.3 as expected"},
		{"too old", VersionPolicy{Minimum: "25.0"}, ConditionFalse, "VersionTooOld", "NPU driver 24.1.rc2 is older than the minimum 25.0: upgrade the driver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0", Versions: map[DeviceKind]VersionPolicy{NPU: tc.policy}})
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(r.Conditions, func(c Condition) bool { return c.Type == "NPUDriverVersion" })
			if i < 0 {
				t.Fatalf("no NPUDriverVersion in %+v", r.Conditions)
			}
			want := Condition{Type: "NPUDriverVersion", Status: tc.status, Reason: tc.reason, Message: tc.message}
			if r.Conditions[i] != want {
				t.Errorf("got  %+v\nwant %+v", r.Conditions[i], want)
			}
			if tc.reason != "NoPolicy" {
				if got, want := r.Labels()[LabelPrefix+"npu.driver-match"], map[bool]string{true: "true", false: "false"}[tc.status == ConditionTrue]; got != want {
					t.Errorf("npu.driver-match = %q, want %q", got, want)
				}
			}
		})
	}
	// A driver that exposes no version, against a policy: Unknown.
	if err := os.Remove(filepath.Join(root, "usr/local/Ascend/driver/version.info")); err != nil {
		t.Fatal(err)
	}
	r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0", Versions: map[DeviceKind]VersionPolicy{NPU: {Minimum: "23"}}})
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(r.Conditions, func(c Condition) bool { return c.Type == "NPUDriverVersion" }); i < 0 || r.Conditions[i].Status != ConditionUnknown || r.Conditions[i].Reason != "VersionUnknown" {
		t.Errorf("conditions %+v", r.Conditions)
	}
}

func TestScanIdentity(t *testing.T) {
	root := fixture(t, "gpu-a100")
	t.Setenv("UB_TOPOLOGY", "example:dev4")
	t.Setenv("UB_NODE", "n3")
	r, err := Scan(ScanOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if r.SuperNode != "dev4" || r.Node != "n3" || r.Conditions[0] != (Condition{Type: "Identity", Status: ConditionTrue, Reason: "Found", Message: "node n3 of super node dev4"}) {
		t.Errorf("identity %q %q, %+v", r.SuperNode, r.Node, r.Conditions)
	}
	t.Setenv("UB_NODE", "n9")
	r, err = Scan(ScanOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	c := r.Conditions[0]
	if r.SuperNode != "" || c.Status != ConditionFalse || c.Reason != "NotFound" || !strings.Contains(c.Message, `UB_NODE=n9: topology: unknown node "n9"`) {
		t.Errorf("identity %q, %+v", r.SuperNode, c)
	}
	if _, ok := r.Labels()[LabelSuperNode]; ok || len(r.GPUs) != 2 {
		t.Errorf("labels %v with no identity, %d GPUs", r.Labels(), len(r.GPUs))
	}
}

func TestScanRoot(t *testing.T) {
	if _, err := Scan(ScanOptions{Root: filepath.Join(t.TempDir(), "nope")}); err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing root: %v", err)
	}
	// An empty root is a node without devices, not an error.
	r, err := Scan(ScanOptions{Root: t.TempDir(), Topology: dev4(t), TopologyNode: "n0"})
	if err != nil || len(r.Errors) != 0 || len(r.Devices()) != 0 {
		t.Errorf("empty root: %v, %+v", err, r)
	}
}
