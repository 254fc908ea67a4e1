package discovery

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/ub/topology"
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
		LabelSuperNode: "dev4", LabelNode: "n1", LabelUBBandwidth: "5000000000",
		LabelPrefix + "gpu.count": "2", LabelPrefix + "gpu.driver": "550.54.15", LabelPrefix + "gpu.driver-match": "true",
		LabelPrefix + "gpu.firmware": "92.00.45.00.06",
		LabelPrefix + "gpu.model":    "NVIDIA_A100-SXM4-80GB", LabelPrefix + "hugepages-2Mi": "1024", LabelPrefix + "numa.count": "2",
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

// condition returns r's condition of type typ, failing the test if there
// is none.
func condition(t *testing.T, r *Report, typ string) Condition {
	t.Helper()
	i := slices.IndexFunc(r.Conditions, func(c Condition) bool { return c.Type == typ })
	if i < 0 {
		t.Fatalf("no %s in %+v", typ, r.Conditions)
	}
	return r.Conditions[i]
}

// Firmware is checked like drivers: the NPUs' firmware package and every
// GPU's VBIOS, against a policy per kind, reported as a condition and a
// firmware-match label.
func TestScanFirmwareConditions(t *testing.T) {
	npuRoot := fixture(t, "ascend-910b-kunpeng")
	for _, tc := range []struct {
		name           string
		policy         VersionPolicy
		status, reason string
		message        string
	}{
		{"none", VersionPolicy{}, ConditionTrue, "NoPolicy", "NPU firmware 7.5.0.1.129; no version expected"},
		{"exact", VersionPolicy{Exact: "7.5.0.1.129"}, ConditionTrue, "VersionMatches", "NPU firmware 7.5.0.1.129 as expected"},
		{"mismatch", VersionPolicy{Exact: "7.5.0.1.130"}, ConditionFalse, "VersionMismatch", "NPU firmware 7.5.0.1.129, expected 7.5.0.1.130: install the expected firmware or change the policy"},
		{"minimum", VersionPolicy{Minimum: "7.1"}, ConditionTrue, "VersionMatches", "NPU firmware 7.5.0.1.129, at least 7.1 as expected"},
		{"too old", VersionPolicy{Minimum: "7.7.0"}, ConditionFalse, "VersionTooOld", "NPU firmware 7.5.0.1.129 is older than the minimum 7.7.0: upgrade the firmware"},
	} {
		t.Run("NPU "+tc.name, func(t *testing.T) {
			r, err := Scan(ScanOptions{Root: npuRoot, Topology: dev4(t), TopologyNode: "n0", Firmware: map[DeviceKind]VersionPolicy{NPU: tc.policy}})
			if err != nil {
				t.Fatal(err)
			}
			want := Condition{Type: "NPUFirmwareVersion", Status: tc.status, Reason: tc.reason, Message: tc.message}
			if got := condition(t, r, "NPUFirmwareVersion"); got != want {
				t.Errorf("got  %+v\nwant %+v", got, want)
			}
			label, ok := r.Labels()[LabelPrefix+"npu.firmware-match"]
			if tc.reason == "NoPolicy" && ok || tc.reason != "NoPolicy" && label != strconv.FormatBool(tc.status == ConditionTrue) {
				t.Errorf("npu.firmware-match = %q (%v)", label, ok)
			}
		})
	}

	// GPUs: each one's VBIOS; one older than the rest fails the minimum
	// and is named, and the label shows the oldest.
	gpuRoot := fixture(t, "gpu-a100")
	p := filepath.Join(gpuRoot, "proc/driver/nvidia/gpus/0000:0f:00.0/information")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), "92.00.45.00.06", "92.00.19.00.01", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Scan(ScanOptions{Root: gpuRoot, Topology: dev4(t), TopologyNode: "n0", Firmware: map[DeviceKind]VersionPolicy{GPU: {Minimum: "92.00.40"}}})
	if err != nil {
		t.Fatal(err)
	}
	want := Condition{Type: "GPUFirmwareVersion", Status: ConditionFalse, Reason: "VersionTooOld",
		Message: "GPU firmware 92.00.19.00.01 is older than the minimum 92.00.40: upgrade the firmware"}
	if got := condition(t, r, "GPUFirmwareVersion"); got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if l := r.Labels(); l[LabelPrefix+"gpu.firmware-match"] != "false" || l[LabelPrefix+"gpu.firmware"] != "92.00.19.00.01" {
		t.Errorf("labels %v", l)
	}
	r, err = Scan(ScanOptions{Root: gpuRoot, Topology: dev4(t), TopologyNode: "n0", Firmware: map[DeviceKind]VersionPolicy{GPU: {Minimum: "92"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := condition(t, r, "GPUFirmwareVersion"); got.Status != ConditionTrue || got.Message != "GPU firmware 92.00.19.00.01, 92.00.45.00.06, at least 92 as expected" {
		t.Errorf("%+v", got)
	}

	// KAE engines expose no firmware: with a policy, Unknown, and the
	// label says false; without, no condition at all.
	r, err = Scan(ScanOptions{Root: npuRoot, Topology: dev4(t), TopologyNode: "n0", Firmware: map[DeviceKind]VersionPolicy{KAE: {Minimum: "1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := condition(t, r, "KAEFirmwareVersion"); got.Status != ConditionUnknown || got.Reason != "VersionUnknown" || r.Labels()[LabelPrefix+"kae.firmware-match"] != "" {
		t.Errorf("%+v, labels %v", got, r.Labels())
	}
}

// The Ascend driver lists the firmware it works with
// (compatible_version_fw); a firmware outside those ranges is reported,
// not a crash.
func TestScanNPUFirmwareCompatible(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	want := Condition{Type: "NPUFirmwareCompatible", Status: ConditionTrue, Reason: "Compatible",
		Message: "NPU firmware 7.5.0.1.129 is in the range [7.0.0, 7.5.99] that driver 24.1.rc2 works with"}
	if got := condition(t, r, "NPUFirmwareCompatible"); got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if l := r.Labels()[LabelPrefix+"npu.firmware-compatible"]; l != "true" {
		t.Errorf("npu.firmware-compatible = %q", l)
	}
	driver := filepath.Join(root, "usr/local/Ascend/driver/version.info")
	b, err := os.ReadFile(driver)
	if err != nil {
		t.Fatal(err)
	}
	setRanges := func(ranges string) {
		t.Helper()
		if err := os.WriteFile(driver, []byte(strings.Replace(string(b), "compatible_version_fw=[7.0.0,7.5.99]", "compatible_version_fw="+ranges, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setRanges("[6.4.0,6.4.99],[7.6.0,7.7.99]")
	if r, err = Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0"}); err != nil {
		t.Fatal(err)
	}
	want = Condition{Type: "NPUFirmwareCompatible", Status: ConditionFalse, Reason: "Incompatible",
		Message: "NPU firmware 7.5.0.1.129 is not one driver 24.1.rc2 works with ([6.4.0, 6.4.99], [7.6.0, 7.7.99]): install a firmware in those ranges, or a driver that takes this firmware"}
	if got := condition(t, r, "NPUFirmwareCompatible"); got != want {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if l := r.Labels()[LabelPrefix+"npu.firmware-compatible"]; l != "false" {
		t.Errorf("npu.firmware-compatible = %q", l)
	}
	// A list that cannot be read is the driver file's error, and no check.
	setRanges("[7.5.99,7.0.0]")
	if r, err = Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0"}); err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) != 1 || !strings.Contains(r.Errors[0].Error(), "version.info: compatible_version_fw: version range [7.5.99,7.0.0] is reversed") || slices.ContainsFunc(r.Conditions, func(c Condition) bool { return c.Type == "NPUFirmwareCompatible" }) {
		t.Errorf("errors %v, conditions %+v", r.Errors, r.Conditions)
	}
}

// The kernel against a policy: its release compares number by number.
func TestScanKernelCondition(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	for _, tc := range []struct {
		policy         VersionPolicy
		status, reason string
	}{
		{VersionPolicy{Minimum: "5.10"}, ConditionTrue, "VersionMatches"},
		{VersionPolicy{Minimum: "5.10.0-182"}, ConditionTrue, "VersionMatches"},
		{VersionPolicy{Minimum: "5.10.0-216"}, ConditionFalse, "VersionTooOld"},
		{VersionPolicy{Minimum: "6.6"}, ConditionFalse, "VersionTooOld"},
		{VersionPolicy{Exact: "5.10.0-182.0.0.95.oe2203sp3.aarch64"}, ConditionTrue, "VersionMatches"},
	} {
		r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0", Kernel: tc.policy})
		if err != nil {
			t.Fatal(err)
		}
		c := condition(t, r, "KernelVersion")
		if c.Status != tc.status || c.Reason != tc.reason || !strings.Contains(c.Message, "kernel 5.10.0-182.0.0.95.oe2203sp3.aarch64") {
			t.Errorf("%+v: %+v", tc.policy, c)
		}
		if l := r.Labels()[LabelPrefix+"kernel.version-match"]; l != strconv.FormatBool(tc.status == ConditionTrue) {
			t.Errorf("%+v: kernel.version-match = %q", tc.policy, l)
		}
		if r.Kernel != "5.10.0-182.0.0.95.oe2203sp3.aarch64" || r.Features()["kernel.version"] != r.Kernel {
			t.Errorf("kernel %q, features %v", r.Kernel, r.Features())
		}
	}
	// No policy, no condition; no osrelease, Unknown.
	r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0"})
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(r.Conditions, func(c Condition) bool { return c.Type == "KernelVersion" }) {
		t.Errorf("a kernel check without a policy: %+v", r.Conditions)
	}
	if err := os.Remove(filepath.Join(root, "proc/sys/kernel/osrelease")); err != nil {
		t.Fatal(err)
	}
	r, err = Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n0", Kernel: VersionPolicy{Minimum: "5.10"}})
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(t, r, "KernelVersion"); c.Status != ConditionUnknown || c.Message != "kernel exposes no version; expected >= 5.10" || len(r.Errors) != 0 {
		t.Errorf("%+v, errors %v", c, r.Errors)
	}
}

// validSuperNodeID is the SuperNode controller's rule for the id label
// (k8s/supernode's validID): a DNS-1123 subdomain of at most 63
// characters.
func validSuperNodeID(id string) bool {
	return id != "" && len(validation.IsDNS1123Subdomain(id)) == 0 && len(id) <= 63
}

// idHash is the suffix superNodeID adds to a name it changed.
func idHash(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "-" + hex.EncodeToString(sum[:4])
}

// A name that is a DNS-1123 label is its own id; any other is made one
// and gets a hash of the name, so that names made alike (CM384_A and
// cm384-a, names equal in their first 63 characters) keep ids of their
// own, each at most 63 characters and one the SuperNode controller takes.
func TestSuperNodeID(t *testing.T) {
	long := strings.Repeat("a", 70)
	for in, want := range map[string]string{
		"dev4": "dev4", "cm384": "cm384", "cm384-a": "cm384-a", "a.b": "a-b" + idHash("a.b"),
		"CM384": "cm384" + idHash("CM384"), "CM384_Rack.A": "cm384-rack-a" + idHash("CM384_Rack.A"),
		"CM384_A": "cm384-a" + idHash("CM384_A"), "a__b": "a--b" + idHash("a__b"),
		"-x-": "x" + idHash("-x-"), "_Pod 7_": "pod-7" + idHash("_Pod 7_"), "é1": "1" + idHash("é1"),
		"___": "", "": "", "ÉÉ": "",
		strings.Repeat("a", 63):        strings.Repeat("a", 63),
		long:                           strings.Repeat("a", 54) + idHash(long),
		long + "b":                     strings.Repeat("a", 54) + idHash(long+"b"),
		strings.Repeat("a", 53) + "_b": strings.Repeat("a", 53) + idHash(strings.Repeat("a", 53)+"_b"),
	} {
		got := superNodeID(in)
		if got != want {
			t.Errorf("superNodeID(%q) = %q, want %q", in, got, want)
		}
		if got != "" && (len(validation.IsDNS1123Label(got)) > 0 || !validSuperNodeID(got)) {
			t.Errorf("superNodeID(%q) = %q, which the SuperNode controller ignores", in, got)
		}
	}
	for _, pair := range [][2]string{{"CM384_A", "cm384-a"}, {"cm384_a", "CM384-A"}, {long, long + "b"}, {"a.b", "a-b"}} {
		if a, b := superNodeID(pair[0]), superNodeID(pair[1]); a == b {
			t.Errorf("super nodes %q and %q share the id %q", pair[0], pair[1], a)
		}
	}
}

// A topology whose name is no SuperNode name is published under one that
// is, and the Identity condition and the agent's log say so; a name with
// nothing usable publishes no id.
func TestScanSuperNodeID(t *testing.T) {
	root := fixture(t, "gpu-a100")
	topo := func(name string) *topology.Topology {
		t.Helper()
		tp, err := topology.New(name, []topology.Node{{Name: "Node_0"}, {Name: "n1"}}, []topology.Link{{A: "Node_0", B: "n1", Bandwidth: 5e9}})
		if err != nil {
			t.Fatal(err)
		}
		return tp
	}
	r, err := Scan(ScanOptions{Root: root, Topology: topo("CM384_Rack.A"), TopologyNode: "Node_0"})
	if err != nil {
		t.Fatal(err)
	}
	l := r.Labels()
	if id := l[LabelSuperNode]; id != "cm384-rack-a"+idHash("CM384_Rack.A") || !validSuperNodeID(id) {
		t.Errorf("id label %q", id)
	}
	if r.SuperNode != "CM384_Rack.A" || l[LabelNode] != "Node_0" {
		t.Errorf("identity %q, labels %v", r.SuperNode, l)
	}
	want := Condition{Type: "Identity", Status: ConditionTrue, Reason: "Found",
		Message: "node Node_0 of super node CM384_Rack.A, published as supernode.ubkit.io/id=cm384-rack-a" + idHash("CM384_Rack.A") + " (a SuperNode's name is a DNS-1123 label)"}
	if c := condition(t, r, "Identity"); c != want {
		t.Errorf("got  %+v\nwant %+v", c, want)
	}
	log, rec := testenv.NewLogRecorder()
	a := New(Config{Scan: ScanOptions{Root: root, Topology: topo("CM384_Rack.A"), TopologyNode: "n1"}, Logger: log})
	if _, err := a.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, "level=WARN", "super node name changed", "supernode=CM384_Rack.A", `label="supernode.ubkit.io/id=cm384-rack-a`+idHash("CM384_Rack.A")+`"`)

	r, err = Scan(ScanOptions{Root: root, Topology: topo("___"), TopologyNode: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Labels()[LabelSuperNode]; ok {
		t.Errorf("an id label from %q: %v", r.SuperNode, r.Labels())
	}
	if c := condition(t, r, "Identity"); c.Status != ConditionFalse || c.Reason != "InvalidName" || !strings.Contains(c.Message, "rename the super node") {
		t.Errorf("%+v", c)
	}
}

// The node's UB link bandwidth, from the topology, by the name the
// SuperNode controller reads: a label it parses back to the same figure,
// and an annotation as ub/topology writes it.
func TestScanUBBandwidth(t *testing.T) {
	if LabelUBBandwidth != v1alpha1.LabelUBBandwidth {
		t.Fatalf("LabelUBBandwidth %q, the controller reads %q", LabelUBBandwidth, v1alpha1.LabelUBBandwidth)
	}
	root := t.TempDir()
	cm384, err := topology.Example("cm384")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		topo              *topology.Topology
		node              string
		label, annotation string
		bw                float64
	}{
		{dev4(t), "n1", "5000000000", "5GB/s", 5e9},
		{cm384, "node17", "392000000000", "392GB/s", 392e9},
	} {
		r, err := Scan(ScanOptions{Root: root, Topology: tc.topo, TopologyNode: tc.node})
		if err != nil {
			t.Fatal(err)
		}
		label, annotation := r.Labels()[LabelUBBandwidth], r.Annotations()[LabelUBBandwidth]
		if r.UBBandwidth != tc.bw || label != tc.label || annotation != tc.annotation {
			t.Errorf("%s %s: %g, label %q, annotation %q", tc.topo.Name, tc.node, r.UBBandwidth, label, annotation)
		}
		for _, v := range []string{label, annotation} {
			if bw, err := topology.ParseBandwidth(v); err != nil || bw != tc.bw {
				t.Errorf("%q parses as %g, %v", v, bw, err)
			}
		}
		if errs := validation.IsValidLabelValue(label); len(errs) > 0 {
			t.Errorf("label %q: %v", label, errs)
		}
	}
	// Without an identity, no bandwidth.
	r, err := Scan(ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n9"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Labels()[LabelUBBandwidth]; ok || len(r.Annotations()) != 0 {
		t.Errorf("labels %v, annotations %v", r.Labels(), r.Annotations())
	}
}
