package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/rundir"
)

// TestIsolateRuntimeDir's child reports the runtime directory it finds.
func init() {
	RegisterChild("lookup", func() int {
		fmt.Printf("lookup %s %s\n", rundir.Lookup(), rundir.RunUser)
		return 0
	})
}

// IsolateRuntimeDir's choice holds in this process and in a child of the
// test binary, and the host's /run/user plays no part.
func TestIsolateRuntimeDir(t *testing.T) {
	tmp, home := IsolateRuntimeDir(t)
	want := filepath.Join(tmp, "ubkit-"+strconv.Itoa(os.Geteuid()))
	if got := rundir.Lookup(); got != want {
		t.Errorf("Lookup() = %q, want %q", got, want)
	}
	if fi, err := os.Stat(tmp); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("TMPDIR %s: %v, %v; want a sticky 0777 directory", tmp, fi.Mode(), err)
	}
	if os.Getenv("HOME") != home || !strings.HasPrefix(rundir.RunUser, tmp) {
		t.Errorf("HOME %q, RunUser %q", os.Getenv("HOME"), rundir.RunUser)
	}
	out, err := Child(t, "lookup").CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if line := "lookup " + want + " " + rundir.RunUser + "\n"; !strings.Contains(string(out), line) {
		t.Errorf("the child reports\n%s\nwant a line %q", out, line)
	}
}
