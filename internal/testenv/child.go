package testenv

import (
	"context"
	"fmt"
	"github.com/ubkit-io/ubkit/internal/osproc"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test binary, run again as a child process, plays a role that its
// package registered (RegisterChild) or runs one test (ChildTest). These
// variables carry what it needs.
const (
	// childEnv names the role a child plays.
	childEnv = "UBKIT_TESTENV_CHILD"
	// descendantsEnv names the file in which every process of the test
	// binary that a Main started, directly or not, writes its identity
	// when it starts (see descendants.go).
	descendantsEnv = "UBKIT_TESTENV_DESCENDANTS"
)

// ChildHangGuard bounds the life of every child that Child, ChildTest and
// their namespace and user variants start: a child still running after it
// is killed, so that a hung child fails its test instead of hanging the
// run. It is far longer than any child needs.
const ChildHangGuard = 5 * time.Minute

var roles = struct {
	sync.Mutex
	m map[string]func() int
}{m: map[string]func() int{}}

// RegisterChild makes f child role name: a test binary started with
// Child(t, name) runs f in Main, in place of the tests, and exits with the
// status f returns. Call it from an init function, or from TestMain before
// RunChildIfAsked or Main. A role registered twice is a bug: it panics.
func RegisterChild(name string, f func() int) {
	roles.Lock()
	defer roles.Unlock()
	if _, dup := roles.m[name]; dup {
		panic("testenv: child role " + name + " registered twice")
	}
	roles.m[name] = f
}

func role(name string) (func() int, bool) {
	roles.Lock()
	defer roles.Unlock()
	f, ok := roles.m[name]
	return f, ok
}

// RunChildIfAsked runs the role this process was started for with Child,
// and exits with its status; it returns at once in a process that plays no
// role. Main calls it first; call it yourself first in a TestMain that sets
// something up before Main, which a child must not do.
func RunChildIfAsked() {
	name := os.Getenv(childEnv)
	if name == "" {
		return
	}
	// The role's own children play their own roles, if any.
	os.Unsetenv(childEnv)
	f, ok := role(name)
	if !ok {
		fmt.Fprintf(os.Stderr, "testenv: this test binary has no child role %q (RegisterChild)\n", name)
		os.Exit(2)
	}
	os.Exit(f())
}

// Child returns a command that runs the test binary again as child role
// name (see RegisterChild), with this process's environment and env
// ("K=V") added. It fails the test if no such role is registered. Start
// it (or Run, Output) yourself; its standard streams are not connected.
// The child gets SIGKILL if this process dies, and is killed after
// ChildHangGuard. If the test has not waited for it when it ends, the
// test's cleanup kills and reaps it: a test that waits for it in another
// goroutine must let that Wait return before it ends.
func Child(t testing.TB, name string, env ...string) *exec.Cmd {
	t.Helper()
	exe, childEnv := childSetup(t, name)
	return startable(t, exe, []string{"-test.run=^$"}, append(append(os.Environ(), childEnv), env...))
}

// ChildTest returns a command that runs test t again, alone, in a child
// process of the test binary (-test.run matching exactly t's name,
// -test.v, -test.count=1), with this process's environment and env added:
// tell the test that it plays the child with an entry of env. It is
// otherwise like Child.
func ChildTest(t testing.TB, env ...string) *exec.Cmd {
	t.Helper()
	exe := testBinary(t)
	args := []string{"-test.run=" + exactRun(t.Name()), "-test.v", "-test.count=1"}
	return startable(t, exe, args, append(os.Environ(), env...))
}

// Child is Child for a child in namespace ns (p.A or p.B), run through
// `ip netns exec`.
func (p *NetnsPair) Child(t testing.TB, ns, name string, env ...string) *exec.Cmd {
	t.Helper()
	exe, childEnv := childSetup(t, name)
	path, err := ipPath()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return startable(t, path, []string{"netns", "exec", ns, exe, "-test.run=^$"}, append(append(os.Environ(), childEnv), env...))
}

// Child is Child for a child run as u: it is u.Command running no tests,
// with the environment that Command gives and env, playing role name.
func (u *User) Child(t testing.TB, name string, env ...string) *exec.Cmd {
	t.Helper()
	_, childEnv := childSetup(t, name)
	return u.Command(t, "^$", append([]string{childEnv}, env...)...)
}

// childSetup checks that role name exists, and returns the test binary
// and the environment entry that selects the role.
func childSetup(t testing.TB, name string) (exe, env string) {
	t.Helper()
	if _, ok := role(name); !ok {
		t.Fatalf("testenv: no child role %q is registered (RegisterChild)", name)
	}
	return testBinary(t), childEnv + "=" + name
}

func testBinary(t testing.TB) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("testenv: finding the test binary: %v", err)
	}
	return exe
}

// startable makes the command for Child and its variants: path with args,
// environment env, SIGKILL when this process dies, killed after
// ChildHangGuard, and reaped when the test ends.
func startable(t testing.TB, path string, args, env []string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), ChildHangGuard)
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	osproc.DieWithParent(cmd)
	t.Cleanup(func() {
		reap(cmd)
		cancel()
	})
	return cmd
}

// reap kills and waits for cmd if it was started and nobody waited for it
// (a wait also ends the goroutine exec.CommandContext watches it with),
// and notes whether a signal ended it.
func reap(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	if cmd.ProcessState == nil {
		cmd.Process.Kill()
		cmd.Wait()
	}
	noteKilled(cmd)
}

// exactRun is a -test.run pattern that matches test name (a subtest's
// name holds its parents', joined by slashes) and nothing else.
func exactRun(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
