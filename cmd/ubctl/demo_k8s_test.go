package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

// TestDemoK8s runs `ubctl demo k8s` on the real binaries, etcd missing
// from its cache: it builds etcd (seconds with the Go caches warm from
// `make prereqs`) saying so, then shows the SuperNode table from the
// apiserver, Ready, then Degraded naming the lost node, then Ready again.
func TestDemoK8s(t *testing.T) {
	real, missing, err := k8sBinaries()
	if err != nil || len(missing) > 0 {
		t.Fatalf("the Kubernetes binaries (make prereqs builds them): missing %v, %v", missing, err)
	}
	dir := t.TempDir()
	for _, d := range []string{"kubernetes-" + k8stest.KubernetesVersion, "kwok-" + k8stest.KwokVersion} {
		if err := os.Symlink(filepath.Join(real, d), filepath.Join(dir, d)); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(k8stest.EnvBinDir, dir)
	var out bytes.Buffer
	if err := demoCmd([]string{"k8s"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{"not cached in " + dir + " (missing etcd-" + k8stest.EtcdVersion + "/etcd)",
		"  k8stest: building etcd " + k8stest.EtcdVersion, "  built in "} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	tables := strings.Split(text, "$ kubectl get supernodes\n")
	if len(tables) != 4 {
		t.Fatalf("want 3 tables:\n%s", text)
	}
	for i, want := range []string{"cm384 48 48 Ready 72Ti 384", "cm384 48 47 Degraded 72192Gi 376", "cm384 48 48 Ready 72Ti 384"} {
		// The apiserver's table, as kubectl prints it: the CRD's columns
		// of priority 0, the age last.
		lines := strings.Split(tables[i+1], "\n")
		var row []string
		if len(lines) > 1 {
			row = strings.Fields(lines[1])
		}
		if len(lines) < 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME MEMBERS READY STATUS MEMORY NPUS AGE" ||
			len(row) != 7 || strings.Join(row[:6], " ") != want || !strings.HasSuffix(row[6], "s") {
			t.Errorf("table %d, want the row %q:\n%s", i+1, want, tables[i+1])
		}
	}
	for _, want := range []string{"node cm384-node24 fails", "Degraded: ", "member cm384-node24: NotReady", "node cm384-node24 recovers"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}

// Without the binaries, the whole demo says in one line how to get its
// Kubernetes part, and the benchmark names what builds them.
func TestDemoK8sNotCached(t *testing.T) {
	t.Setenv(k8stest.EnvBinDir, t.TempDir())
	var out bytes.Buffer
	if err := demoK8sIfCached(&out); err != nil || strings.Count(out.String(), "\n") != 2 || !strings.Contains(out.String(), "`ubctl demo k8s` builds them") {
		t.Errorf("the whole demo's k8s line: %q, %v", out.String(), err)
	}
	if _, err := suites["k8s"](&benchOpts{}); !errors.Is(err, errK8sBinaries) || !strings.Contains(err.Error(), "ubctl demo k8s") {
		t.Errorf("bench k8s without the binaries: err %v, want one naming ubctl demo k8s", err)
	}
	if err := demoCmd([]string{"nosuch"}, &bytes.Buffer{}); err == nil {
		t.Error("demo nosuch succeeded")
	}
}
