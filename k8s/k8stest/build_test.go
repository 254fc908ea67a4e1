package k8stest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Build builds what is missing (etcd here: with the Go caches warm from
// `make prereqs` it takes seconds), leaves nothing else in the directory,
// and a second Build keeps it.
func TestBuildEtcd(t *testing.T) {
	dir := t.TempDir()
	missing, err := Missing(dir)
	if err != nil || len(missing) != 6 {
		t.Fatalf("Missing of an empty directory: %v, %v; want all six", missing, err)
	}
	var progress bytes.Buffer
	if err := Build(t.Context(), dir, &progress, BuildEtcd); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "building etcd "+EtcdVersion) {
		t.Errorf("progress %q does not say it builds etcd", progress.String())
	}
	out, err := exec.Command(filepath.Join(dir, "etcd-"+EtcdVersion, "etcd"), "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "etcd Version: "+strings.TrimPrefix(EtcdVersion, "v")) {
		t.Fatalf("the etcd built: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 || entries[0].Name() != "etcd-"+EtcdVersion {
		t.Errorf("the directory holds %v (%v), want etcd's alone", entries, err)
	}
	missing, err = Missing(dir)
	if err != nil || slices.Contains(missing, filepath.Join("etcd-"+EtcdVersion, "etcd")) || len(missing) != 5 {
		t.Errorf("Missing after building etcd: %v, %v", missing, err)
	}
	built, err := os.Stat(filepath.Join(dir, "etcd-"+EtcdVersion, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	progress.Reset()
	if err := Build(t.Context(), dir, &progress, BuildEtcd); err != nil {
		t.Fatal(err)
	}
	again, err := os.Stat(filepath.Join(dir, "etcd-"+EtcdVersion, "etcd"))
	if err != nil || !again.ModTime().Equal(built.ModTime()) || strings.Contains(progress.String(), "building") {
		t.Errorf("a second Build rebuilt etcd (%v): %q", err, progress.String())
	}
}

// The binaries make prereqs built are all there, and Build of all of
// them returns without building.
func TestBuildNothingMissing(t *testing.T) {
	missing, err := Missing("")
	if err != nil || len(missing) != 0 {
		t.Fatalf("make prereqs builds the binaries; missing %v, %v", missing, err)
	}
	var progress bytes.Buffer
	if err := Build(t.Context(), "", &progress); err != nil || strings.Contains(progress.String(), "building") {
		t.Errorf("Build with nothing missing: %v, %q", err, progress.String())
	}
}

// An unknown set is refused before anything runs; a cancelled build
// stops, says why, and leaves nothing behind.
func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	if err := Build(t.Context(), dir, nil, "etcd", "nosuch"); err == nil || !strings.Contains(err.Error(), `"nosuch"`) {
		t.Errorf("an unknown set: err %v, want one naming it", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	// Cancel as the script says it starts the build: the go commands are
	// running or about to.
	w := writerFunc(func(p []byte) {
		if bytes.Contains(p, []byte("building etcd")) {
			cancel()
		}
	})
	err := Build(ctx, dir, w, BuildEtcd)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled build: err %v, want context.Canceled", err)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Errorf("a cancelled build left %v (%v)", entries, err)
	}

	t.Setenv("PATH", t.TempDir())
	if err := Build(t.Context(), dir, nil, BuildEtcd); err == nil || !strings.Contains(err.Error(), "needs bash") {
		t.Errorf("without bash: err %v, want one naming it", err)
	}
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }
