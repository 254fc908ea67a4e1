//go:build linux

package shm

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Multi-process tests re-execute the test binary as one of these
// functions, with the args of childArgs; the child runs it and exits with
// its status.
var children = map[string]func(args []string) error{}

// childArgsEnv carries a child function's args.
const childArgsEnv = "UBKIT_SHM_ARGS"

// childCommand is testenv.Child, which TestMain (in package shm_test:
// internal/testenv imports shm, so these tests cannot) hands over with
// UseTestenv.
var childCommand func(t testing.TB, role string, env ...string) *exec.Cmd

// runChild is child function f as a testenv child role.
func runChild(name string, f func(args []string) error) func() int {
	return func() int {
		if err := f(strings.Split(os.Getenv(childArgsEnv), "\x1f")); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", name, err)
			return 1
		}
		return 0
	}
}

// startChild runs child function name in a new process. The test's cleanup
// kills it if it still runs and reaps it.
func startChild(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := childCommand(t, name, childArgs(args...))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", name, err)
	}
	return cmd
}

// childArgs is the environment entry that gives a child function args.
func childArgs(args ...string) string { return childArgsEnv + "=" + strings.Join(args, "\x1f") }

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

// hangGuard bounds the waits of tests for what takes microseconds when
// the code works: only a hang waits that long, and it fails the test.
const hangGuard = 10 * time.Second

// waitParked is testenv.WaitParked, handed over with UseTestenv.
var waitParked func(t testing.TB, n int, state string, fns ...string)

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
