package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestDemoK8s runs `ubctl demo k8s` on the real binaries: the SuperNode
// table from the apiserver, Ready, then Degraded naming the lost node,
// then Ready again.
func TestDemoK8s(t *testing.T) {
	if _, missing, err := k8sBinaries(); err != nil || len(missing) > 0 {
		t.Fatalf("the Kubernetes binaries (make prereqs builds them): missing %v, %v", missing, err)
	}
	var out bytes.Buffer
	if err := demoCmd([]string{"k8s"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	tables := strings.Split(text, "$ kubectl get supernodes\n")
	if len(tables) != 4 {
		t.Fatalf("want 3 tables:\n%s", text)
	}
	for i, want := range []string{"cm384 48 48 Ready 72Ti 384", "cm384 48 47 Degraded 72192Gi 376", "cm384 48 48 Ready 72Ti 384"} {
		lines := strings.Split(tables[i+1], "\n")
		if len(lines) < 2 || strings.Join(strings.Fields(lines[0]), " ") != "NAME MEMBERS READY STATUS MEMORY NPUS" ||
			strings.Join(strings.Fields(lines[1]), " ") != want {
			t.Errorf("table %d, want the row %q:\n%s", i+1, want, tables[i+1])
		}
	}
	for _, want := range []string{"node cm384-node24 fails", "Degraded: ", "member cm384-node24: NotReady", "node cm384-node24 recovers"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}

func TestDemoK8sNotCached(t *testing.T) {
	t.Setenv("UBKIT_K8S_BIN", t.TempDir())
	err := demoCmd([]string{"k8s"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "make prereqs") || !strings.Contains(err.Error(), "not cached") {
		t.Fatalf("err %v, want one saying the binaries are not cached and naming make prereqs", err)
	}
	var out bytes.Buffer
	if err := demoK8sIfCached(&out); err != nil || strings.Count(out.String(), "\n") != 2 || !strings.Contains(out.String(), "make prereqs") {
		t.Errorf("the whole demo's k8s line: %q, %v", out.String(), err)
	}
	if err := demoCmd([]string{"nosuch"}, &bytes.Buffer{}); err == nil {
		t.Error("demo nosuch succeeded")
	}
}
