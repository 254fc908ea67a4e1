package discovery

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestFeatureFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "features.d")
	labels := map[string]string{LabelSuperNode: "dev4", LabelPrefix + "npu.count": "8", LabelPrefix + "kae.hpre": "true"}
	if err := WriteFeatureFile(dir, DefaultFeatureFile, labels); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, DefaultFeatureFile))
	if err != nil {
		t.Fatal(err)
	}
	want := "# Written by ubkit-discovery; rewritten on every change. Do not edit.\n" +
		"supernode.ubkit.io/id=dev4\nsupernode.ubkit.io/kae.hpre=true\nsupernode.ubkit.io/npu.count=8\n"
	if string(got) != want {
		t.Errorf("feature file\n%s\nwant\n%s", got, want)
	}
	// Rewriting leaves no temporary file behind for nfd-worker to read.
	if err := WriteFeatureFile(dir, DefaultFeatureFile, map[string]string{LabelSuperNode: "dev4"}); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil || len(ents) != 1 {
		t.Errorf("directory holds %v (%v), want the one file", ents, err)
	}
	if st, err := os.Stat(filepath.Join(dir, DefaultFeatureFile)); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, %v", st.Mode(), err)
	}
}

// An agent writes the features.d file; a device that disappears is logged
// and its labels leave the file.
func TestAgentFeatureFileRefresh(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	dir := t.TempDir()
	log, rec := testenv.NewLogRecorder()
	a := New(Config{Scan: ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n1"}, FeatureDir: dir, Logger: log})
	if _, err := a.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, DefaultFeatureFile)
	read := func() string {
		t.Helper()
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	first := read()
	for _, line := range []string{"supernode.ubkit.io/id=dev4\n", "supernode.ubkit.io/node=n1\n", "supernode.ubkit.io/npu.count=8\n", "supernode.ubkit.io/kae.zip=true\n"} {
		if !strings.Contains(first, line) {
			t.Errorf("no %q in\n%s", line, first)
		}
	}
	rec.WaitFor(t, "devices found", "NPU davinci7")

	// Nothing changed: the file is not rewritten.
	st, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o600); err != nil { // a rewrite would make it 0644 again
		t.Fatal(err)
	}
	if _, err := a.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st2, err := os.Stat(file); err != nil || st2.Mode().Perm() != 0o600 || !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("unchanged scan rewrote the file")
	}

	// An NPU and both ZIP engines go away.
	for _, p := range []string{"dev/davinci7", "sys/class/uacce/hisi_zip-4", "sys/class/uacce/hisi_zip-5"} {
		if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := a.Refresh(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.NPUs) != 7 || a.Last() != r {
		t.Errorf("%d NPUs", len(r.NPUs))
	}
	rec.WaitFor(t, "device disappeared", "NPU davinci7")
	rec.WaitFor(t, "device disappeared", "KAE hisi_zip-5")
	second := read()
	if !strings.Contains(second, "supernode.ubkit.io/npu.count=7\n") || strings.Contains(second, "kae.zip") || !strings.Contains(second, "kae.sec=true") {
		t.Errorf("after the loss:\n%s", second)
	}

	// A driver that does not match is logged once, as a failed check.
	a.cfg.Scan.Versions = map[DeviceKind]VersionPolicy{NPU: {Minimum: "25.0"}}
	if _, err := a.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, "check failed", "NPUDriverVersion", "VersionTooOld")
	if !strings.Contains(read(), "supernode.ubkit.io/npu.driver-match=false\n") {
		t.Errorf("no driver-match=false in\n%s", read())
	}
}

// Run refreshes at once, and returns when its context ends.
func TestAgentRun(t *testing.T) {
	log, rec := testenv.NewLogRecorder()
	a := New(Config{Scan: ScanOptions{Root: fixture(t, "gpu-a100"), Topology: dev4(t), TopologyNode: "n0"}, FeatureDir: t.TempDir(), Logger: log})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	rec.WaitFor(t, "devices found", "GPU 0000:07:00.0")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want context.Canceled", err)
	}
	if r := a.Last(); r == nil || len(r.GPUs) != 2 {
		t.Errorf("last report %+v", r)
	}
}

// Publishing follows what the node is, not how busy it is: a scan that
// differs from the last only in free huge pages, free KAE queues and free
// NUMA memory publishes nothing (no NodeFeature write, no feature file
// rewrite); a lost device publishes at once.
func TestAgentIgnoresCounters(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	dir := t.TempDir()
	client := kubefake.NewClientset()
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: NodeFeatureGVR.GroupVersion().String(),
		APIResources: []metav1.APIResource{{Name: NodeFeatureGVR.Resource, Namespaced: true, Kind: "NodeFeature"}},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{NodeFeatureGVR: "NodeFeatureList"})
	log, _ := testenv.NewLogRecorder()
	a := New(Config{Scan: ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n1"}, FeatureDir: dir,
		NodeName: "dev4-n1", Client: client, Dynamic: dyn, Logger: log})
	writes := func() int {
		n := 0
		for _, act := range dyn.Actions() {
			if act.GetResource() == NodeFeatureGVR && (act.GetVerb() == "create" || act.GetVerb() == "update") {
				n++
			}
		}
		return n
	}
	file := filepath.Join(dir, DefaultFeatureFile)
	// A rewrite makes the file 0644 again.
	rewritten := func() bool {
		t.Helper()
		st, err := os.Stat(file)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm() != 0o600
	}
	if _, err := a.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := writes(); n != 1 {
		t.Fatalf("%d NodeFeature writes on the first refresh, want 1", n)
	}
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}

	for p, v := range map[string]string{
		"sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages": "17\n",
		"sys/kernel/mm/hugepages/hugepages-64kB/free_hugepages":   "0\n",
		"sys/class/uacce/hisi_hpre-0/available_instances":         "3\n",
		"sys/class/uacce/hisi_zip-5/available_instances":          "0\n",
		"sys/devices/system/node/node0/meminfo":                   "Node 0 MemTotal:       394728428 kB\nNode 0 MemFree:        1 kB\n",
	} {
		if err := os.WriteFile(filepath.Join(root, p), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := a.Refresh(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// The scan saw the new counters...
	if i := slices.IndexFunc(r.HugePages, func(p HugePagePool) bool { return p.PageSize == 2<<20 }); i < 0 || r.HugePages[i].Free != 17 || r.KAE[0].AvailableInstances != 3 {
		t.Fatalf("the scan did not see the new counters: %+v %+v", r.HugePages, r.KAE[0])
	}
	// ...and published nothing.
	if n := writes(); n != 1 || rewritten() {
		t.Errorf("counters alone republished: %d NodeFeature writes, feature file rewritten %v", n, rewritten())
	}

	if err := os.Remove(filepath.Join(root, "dev/davinci7")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := writes(); n != 2 || !rewritten() {
		t.Errorf("a lost NPU: %d NodeFeature writes, feature file rewritten %v; want 2, true", n, rewritten())
	}
}

// A device that disappears is published at the next check, without
// waiting for the scan interval (an hour here): the test waits for the
// publication, not for a time.
func TestAgentRunCheck(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	dir := t.TempDir()
	log, rec := testenv.NewLogRecorder()
	a := New(Config{Scan: ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n1"}, FeatureDir: dir, Logger: log,
		Interval: time.Hour, CheckInterval: time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v, want context.Canceled", err)
		}
	}()
	rec.WaitFor(t, "msg=published", "devices=14")
	if err := os.Remove(filepath.Join(root, "dev/davinci7")); err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, "device disappeared", "NPU davinci7")
	rec.WaitFor(t, "msg=published", "devices=13")
	b, err := os.ReadFile(filepath.Join(dir, DefaultFeatureFile))
	if err != nil || !strings.Contains(string(b), "supernode.ubkit.io/npu.count=7\n") {
		t.Errorf("feature file after the loss: %q, %v", b, err)
	}
}

// The check's state changes when a device comes or goes or a huge page
// pool is resized, and not when counters move or other /dev nodes come.
func TestDeviceState(t *testing.T) {
	root := fixture(t, "ascend-910b-kunpeng")
	fsys := os.DirFS(root)
	base := deviceState(fsys)
	if !strings.Contains(base, "dev/davinci7\n") || !strings.Contains(base, "sys/class/uacce/hisi_zip-5\n") || !strings.Contains(base, "hugepages-2048kB/nr_hugepages=4096\n") {
		t.Fatalf("state:\n%s", base)
	}
	write := func(p, v string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "1\n")
	write("sys/class/uacce/hisi_hpre-0/available_instances", "2\n")
	write("dev/tty7", "")
	if got := deviceState(fsys); got != base {
		t.Errorf("counters and a tty changed the state:\n%s\nwas\n%s", got, base)
	}
	for _, change := range []func(){
		func() { write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "2048\n") },
		func() { write("dev/nvidia0", "") },
		func() { write("sys/class/uacce/hisi_zip-6/api", "hisi_qm_v2\n") },
		func() {
			if err := os.RemoveAll(filepath.Join(root, "sys/class/uacce/hisi_zip-4")); err != nil {
				t.Fatal(err)
			}
		},
		func() {
			if err := os.Remove(filepath.Join(root, "dev/davinci0")); err != nil {
				t.Fatal(err)
			}
		},
	} {
		before := deviceState(fsys)
		change()
		if deviceState(fsys) == before {
			t.Errorf("a change left the state as it was:\n%s", before)
		}
	}
}
