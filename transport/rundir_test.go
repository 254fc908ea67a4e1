package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/rundir"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

// The test binary run as another user squats a runtime directory
// (TestRuntimeDirSquattedByAnotherUser); these variables tell it how and
// where.
const (
	squatEnv     = "UBKIT_TRANSPORT_SQUAT" // "dir", "symlink" or "file"
	squatPathEnv = "UBKIT_TRANSPORT_SQUAT_PATH"
	// runUserEnv points rundir.RunUser elsewhere in a child of the test
	// binary, so that no /run/user/<uid> of the host takes precedence.
	runUserEnv = "UBKIT_TRANSPORT_TEST_RUN_USER"
)

func init() {
	if v := os.Getenv(runUserEnv); v != "" {
		rundir.RunUser = v
	}
}

// Another user creates the directory a user's processes would use as
// their registry, <tmp>/ubkit-<uid>, before they do, in each way it can;
// the user's Listen and Dial, from two processes, still meet (in the
// fallback directory).
func TestRuntimeDirSquattedByAnotherUser(t *testing.T) {
	if how := os.Getenv(squatEnv); how != "" {
		if err := squatDir(how, os.Getenv(squatPathEnv)); err != nil {
			t.Fatal(err)
		}
		return
	}
	u := testenv.OtherUser(t)
	for _, how := range []string{"dir", "symlink", "file"} {
		t.Run(how, func(t *testing.T) {
			tmp, home := stickyDir(t), shortTempDir(t)
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
			defer func() { rundir.RunUser = saved }()

			squatted := filepath.Join(tmp, "ubkit-"+strconv.Itoa(os.Geteuid()))
			out, err := u.Command(t, "^TestRuntimeDirSquattedByAnotherUser$", squatEnv+"="+how, squatPathEnv+"="+squatted).CombinedOutput()
			if err != nil {
				t.Fatalf("the squatter: %v\n%s", err, out)
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(squatted, &st); err != nil || int(st.Uid) != u.UID {
				t.Fatalf("%s after the squatter: owner %d, %v; want the squatter's (%d)", squatted, st.Uid, err, u.UID)
			}

			e, err := NewEndpoint(Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if want := filepath.Join(home, ".cache", "ubkit", "run"); e.dir != want {
				t.Errorf("registry in %s, want the fallback %s", e.dir, want)
			}
			svc := fmt.Sprintf("squat-%d-%s", os.Getpid(), how)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := e.Listen(ctx, "ub:///"+svc)
			if err != nil {
				t.Fatalf("Listen with %s squatted (a %s): %v", squatted, how, err)
			}
			defer l.Close()
			// Another process of the user, with its own default endpoint,
			// finds the listener (child in conn_test.go writes until the
			// connection closes).
			child := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), "TRANSPORT_TEST_CHILD=1", "TRANSPORT_TEST_ADDR=ub:///"+svc)
			var stderr strings.Builder
			child.Stderr = &stderr
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			accepted := make(chan error, 1)
			go func() {
				c, err := l.Accept()
				if err == nil {
					_, err = io.ReadFull(c, make([]byte, 4096))
					c.Close()
				}
				accepted <- err
			}()
			select {
			case err = <-accepted:
			case <-ctx.Done():
				err = ctx.Err()
			}
			if werr := child.Wait(); err != nil || werr != nil {
				t.Fatalf("a dialer in another process: accept and read %v; dialer %v; stderr: %s", err, werr, stderr.String())
			}
			c, err := e.Dial(ctx, "ub:///"+svc)
			if err != nil {
				t.Fatalf("Dial in this process: %v", err)
			}
			c.Close()
		})
	}
}

// squatDir makes path, the way how says, as the squatter.
func squatDir(how, path string) error {
	if os.Geteuid() == 0 {
		return errors.New("the squatter runs as root")
	}
	switch how {
	case "dir":
		if err := os.Mkdir(path, 0o777); err != nil {
			return err
		}
		return os.Chmod(path, 0o777)
	case "symlink":
		return os.Symlink(os.TempDir(), path)
	case "file":
		return os.WriteFile(path, nil, 0o666)
	}
	return fmt.Errorf("unknown squat %q", how)
}

// stickyDir makes a world-writable sticky directory, as /tmp is, for
// TMPDIR: the test must not touch the real /tmp/ubkit-<uid>.
func stickyDir(t *testing.T) string {
	t.Helper()
	dir := shortTempDir(t)
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shortTempDir is t.TempDir with a short path, so that the registry's
// sockets fit in a unix socket's address.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ubkit-t")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestRegistryDirTooLong: a registry directory too long for its sockets
// fails Listen with an error that says how to fix it.
func TestRegistryDirTooLong(t *testing.T) {
	dir := filepath.Join(shortTempDir(t), strings.Repeat("d", rundir.SocketPathMax))
	e, err := NewEndpoint(Config{RuntimeDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = e.Listen(context.Background(), "ub:///x")
	if err == nil || !strings.Contains(err.Error(), "too long") || !strings.Contains(err.Error(), rundir.Env) {
		t.Fatalf("Listen in a registry of %d bytes: %v; want an error that names %s", len(dir), err, rundir.Env)
	}
}
