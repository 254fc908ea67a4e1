package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
)

// Another user creates the directory a user's processes would use as
// their registry, <tmp>/ubkit-<uid>, before they do, in each way it can;
// the user's Listen and Dial, from two processes, still meet (in the
// fallback directory).
func TestRuntimeDirSquattedByAnotherUser(t *testing.T) {
	u := testenv.OtherUser(t)
	for _, how := range []string{"dir", "symlink", "file"} {
		t.Run(how, func(t *testing.T) {
			tmp, home := testenv.IsolateRuntimeDir(t)
			squatted := filepath.Join(tmp, "ubkit-"+strconv.Itoa(os.Geteuid()))
			out, err := u.Child(t, "squat", squatEnv+"="+how, squatPathEnv+"="+squatted).CombinedOutput()
			if err != nil {
				t.Fatalf("the squatter: %v\n%s", err, out)
			}
			fi, err := os.Lstat(squatted)
			if err != nil || rundir.Owner(fi) != u.UID {
				t.Fatalf("%s after the squatter: %v, %v; want it the squatter's (uid %d)", squatted, fi, err, u.UID)
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
			child := testenv.Child(t, "writer", "TRANSPORT_TEST_ADDR=ub:///"+svc)
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
				child.Process.Kill() // a hang guard
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

func init() {
	// The squatter of TestRuntimeDirSquattedByAnotherUser, run as another
	// user.
	testenv.RegisterChild("squat", func() int {
		if err := squatDir(os.Getenv(squatEnv), os.Getenv(squatPathEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	})
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

// TestRegistryDirTooLong: a registry directory too long for its sockets
// fails Listen with an error that says how to fix it.
func TestRegistryDirTooLong(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", rundir.SocketPathMax))
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

// TestServiceNameTooLong: a service whose socket path would not fit a unix
// socket fails Listen with an error that says so, not bind's "invalid
// argument".
func TestServiceNameTooLong(t *testing.T) {
	e, err := NewEndpoint(Config{RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = e.Listen(context.Background(), "ub:///"+strings.Repeat("s", rundir.SocketPathMax))
	if err == nil || !strings.Contains(err.Error(), "unix socket allows") {
		t.Fatalf("Listen on a service name of %d bytes: %v", rundir.SocketPathMax, err)
	}
}
