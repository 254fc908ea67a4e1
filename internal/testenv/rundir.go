package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ubkit-io/ubkit/internal/rundir"
)

// runUserEnv carries IsolateRuntimeDir's rundir.RunUser to child processes
// of the test binary, which apply it when this package is initialised.
const runUserEnv = "UBKIT_TESTENV_RUN_USER"

func init() {
	if v := os.Getenv(runUserEnv); v != "" {
		rundir.RunUser = v
	}
}

// IsolateRuntimeDir makes the runtime directory that internal/rundir
// chooses for this process, and for the test binary's child processes
// started with its environment, the default one in fresh directories: it
// sets TMPDIR to tmp, a new world-writable sticky directory like /tmp (so
// that no test touches the real /tmp/ubkit-<uid>), and HOME to home, a new
// private one, unsets UBKIT_RUNTIME_DIR, XDG_RUNTIME_DIR and
// XDG_CACHE_HOME, and hides the host's /run/user. Both paths are short, so
// that sockets below them fit a unix socket's address. t.Cleanup undoes it
// all and removes the directories. Tests that call it must not be parallel
// (it uses t.Setenv).
func IsolateRuntimeDir(t testing.TB) (tmp, home string) {
	t.Helper()
	tmp, home = shortDir(t), shortDir(t)
	if err := os.Chmod(tmp, 0o777|os.ModeSticky); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Setenv("TMPDIR", tmp)
	t.Setenv("HOME", home)
	for _, v := range []string{rundir.Env, "XDG_RUNTIME_DIR", "XDG_CACHE_HOME"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	runUser := filepath.Join(tmp, "no-run-user")
	t.Setenv(runUserEnv, runUser)
	saved := rundir.RunUser
	rundir.RunUser = runUser
	t.Cleanup(func() { rundir.RunUser = saved })
	return tmp, home
}

// shortDir makes a directory under os.TempDir() with a short name, removed
// when the test ends.
func shortDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ubkit-t")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
