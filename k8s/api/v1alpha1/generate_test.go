package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestGeneratedUpToDate runs k8s/config/generate.sh (the pinned
// controller-gen, as `make generate` does) into a temporary directory and
// fails if the deepcopy functions, CRDs or RBAC checked in differ from
// what it makes, or if a file there is neither generated nor one of
// handWritten.
func TestGeneratedUpToDate(t *testing.T) {
	// Files beside the generated ones that are written by hand:
	// controller-gen makes roles, not their bindings.
	handWritten := map[string]bool{"k8s/config/rbac/binding.yaml": true}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	out := map[string]string{ // checked-in directory → generated one
		"k8s/api/v1alpha1": filepath.Join(tmp, "object"),
		"k8s/config/crd":   filepath.Join(tmp, "crd"),
		"k8s/config/rbac":  filepath.Join(tmp, "rbac"),
	}
	cmd := exec.CommandContext(t.Context(), "bash", "k8s/config/generate.sh",
		out["k8s/api/v1alpha1"], out["k8s/config/crd"], out["k8s/config/rbac"])
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, b)
	}
	for have, gen := range out {
		names, err := os.ReadDir(gen)
		if err != nil {
			t.Fatal(err)
		}
		if len(names) == 0 {
			t.Errorf("generate.sh made nothing for %s", have)
		}
		for _, e := range names {
			want, err := os.ReadFile(filepath.Join(gen, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(root, have, e.Name()))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s/%s is not what controller-gen makes now (%v): run make generate", have, e.Name(), err)
			}
		}
		if have == "k8s/api/v1alpha1" {
			continue // the package's own sources live there too
		}
		checkedIn, err := os.ReadDir(filepath.Join(root, have))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range checkedIn {
			if !handWritten[have+"/"+e.Name()] && !slices.ContainsFunc(names, func(g os.DirEntry) bool { return g.Name() == e.Name() }) {
				t.Errorf("%s/%s is not generated any more: run make generate and remove it", have, e.Name())
			}
		}
	}
}
