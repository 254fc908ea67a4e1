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
	if left := built(t, dir); len(left) != 1 || left[0] != "etcd-"+EtcdVersion {
		t.Errorf("the directory holds %v, want etcd's alone", left)
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
	if left := built(t, dir); len(left) != 0 {
		t.Errorf("a cancelled build left %v", left)
	}

	t.Setenv("PATH", t.TempDir())
	if err := Build(t.Context(), dir, nil, BuildEtcd); err == nil || !strings.Contains(err.Error(), "needs bash") {
		t.Errorf("without bash: err %v, want one naming it", err)
	}
}

// built lists what is in dir but the builds' lock files (.<set>.lock,
// which stay).
func built(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".lock") {
			names = append(names, e.Name())
		}
	}
	return names
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

// fakeGo puts on PATH a go command that does what the build script asks
// of it without building anything: it makes go.mod files, answers `mod
// download -json` with a go.mod naming one staging module, and for `build
// -o out pkg` writes an executable out, or fails if pkg ends in failing.
// Each build appends its package to builds.
func fakeGo(t *testing.T, failing string) (builds string) {
	t.Helper()
	bin := t.TempDir()
	builds = filepath.Join(bin, "builds")
	gomod := filepath.Join(bin, "kubernetes.mod")
	if err := os.WriteFile(gomod, []byte("module k8s.io/kubernetes\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/bash
case "$1 $2" in
"mod init") echo "module $3" > go.mod ;;
"mod download") printf '{\n\t"GoMod": "%s",\n}\n' "` + gomod + `" ;;
"mod edit") ;;
"list -m") mkdir -p "$PWD/kwoksrc/kustomize/stage"; echo "$PWD/kwoksrc" ;;
get*) ;;
build*)
	out= pkg=
	while [ $# -gt 0 ]; do case $1 in -o) out=$2; shift ;; -*) [ "$1" = -ldflags ] && shift ;; *) pkg=$1 ;; esac; shift; done
	echo "$pkg" >> ` + builds + `
	sleep 0.2 # long enough for a second build that does not wait its turn to start one too
	[ -n "` + failing + `" ] && [ "${pkg%` + failing + `}" != "$pkg" ] && { echo "fake go: $pkg fails" >&2; exit 1; }
	mkdir -p "$(dirname "$out")" && printf '#!/bin/sh\n' > "$out" && chmod +x "$out" ;;
*) echo "fake go: $*" >&2; exit 1 ;;
esac
`
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return builds
}

// A Kubernetes build whose first binary fails fails as a whole and puts
// nothing in place, though the binaries built after it succeed (the
// subshell of the script ignored set -e, so the last build decided).
func TestBuildKubernetesFailure(t *testing.T) {
	builds := fakeGo(t, "cmd/kube-apiserver")
	dir := t.TempDir()
	err := Build(t.Context(), dir, nil, BuildKubernetes)
	if err == nil || !strings.Contains(err.Error(), "kube-apiserver fails") {
		t.Fatalf("err %v, want the failure with the compiler's words", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "kubernetes-"+KubernetesVersion)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed build put kubernetes-%s in place (%v)", KubernetesVersion, err)
	}
	if left := built(t, dir); len(left) != 0 {
		t.Errorf("a failed build left %v", left)
	}
	if b, _ := os.ReadFile(builds); strings.Count(string(b), "\n") != 1 {
		t.Errorf("builds after the failing one: %q", b)
	}
}

// Two Builds of one set at once build it once; what an interrupted build
// left is removed.
func TestBuildOneAtATime(t *testing.T) {
	builds := fakeGo(t, "")
	dir := t.TempDir()
	stale := filepath.Join(dir, ".etcd-build.interrupted")
	if err := os.MkdirAll(filepath.Join(stale, "mod"), 0o755); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- Build(t.Context(), dir, nil, BuildEtcd) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(builds); string(b) != "go.etcd.io/etcd/server/v3\n" {
		t.Errorf("builds %q, want etcd's once", b)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the interrupted build's directory is still there (%v)", err)
	}
}
