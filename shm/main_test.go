//go:build linux

package shm

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Multi-process tests re-execute the test binary with UBKIT_SHM_CHILD naming
// one of these functions; the child runs it and exits with its status.
var children = map[string]func(args []string) error{}

func TestMain(m *testing.M) {
	if name := os.Getenv("UBKIT_SHM_CHILD"); name != "" {
		f, ok := children[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "unknown child %q\n", name)
			os.Exit(2)
		}
		if err := f(strings.Split(os.Getenv("UBKIT_SHM_ARGS"), "\x1f")); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", name, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	before := ubkitNames()
	code := m.Run()
	if code == 0 {
		if n := openSegments.Load(); n != 0 {
			fmt.Fprintf(os.Stderr, "FAIL: %d segments still mapped after the tests\n", n)
			code = 1
		}
		if leaked := slices.DeleteFunc(ubkitNames(), func(n string) bool { return slices.Contains(before, n) }); len(leaked) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: tests left %v in %s\n", leaked, ShmDir)
			code = 1
		}
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: leaked goroutines: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// ubkitNames lists the segments these tests name (other packages' tests,
// and other runs of these, may run at the same time with segments of their
// own: testName puts this process's pid in every name).
func ubkitNames() []string {
	entries, _ := os.ReadDir(ShmDir)
	var out []string
	mine := fmt.Sprintf("-%d-", os.Getpid())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), userPrefix()+"test-") && strings.Contains(e.Name(), mine) {
			out = append(out, e.Name())
		}
	}
	return out
}

// startChild runs child function name in a new process. The test's cleanup
// kills it if it still runs and reaps it.
func startChild(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv(name, args...)...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", name, err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// childEnv is the environment that makes the test binary run child
// function name with args.
func childEnv(name string, args ...string) []string {
	return []string{"UBKIT_SHM_CHILD=" + name, "UBKIT_SHM_ARGS=" + strings.Join(args, "\x1f")}
}

// testName returns a segment name unique to this test and process.
func testName(t testing.TB) string {
	n := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, t.Name())
	return fmt.Sprintf("test-%s-%d-%d", n, os.Getpid(), time.Now().UnixNano())
}

func newSegment(t testing.TB, size int) *Segment {
	t.Helper()
	s, err := CreateSegment(testName(t), size, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
