//go:build linux

package osproc

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Roles the test binary plays in a child process, by the value of envRole.
const envRole = "OSPROC_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "parent":
		// Start a grandchild that dies with this process, holding the
		// write end of the test's pipe (descriptor 3), and end.
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"=grandchild")
		cmd.Stdin = os.Stdin
		cmd.ExtraFiles = []*os.File{os.NewFile(3, "pipe")}
		DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("started\n")
		os.Exit(0)
	case "grandchild":
		// Live until killed: nothing ever arrives on the standard
		// input, whose other end the test holds.
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDieWithParent: a grandchild started with DieWithParent ends when the
// child that started it ends, which the test sees as the end of a pipe the
// grandchild held open.
func TestDieWithParent(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	stdin, hold, err := os.Pipe() // the grandchild's standard input, held open
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), envRole+"=parent", "GORACE=atexit_sleep_ms=0")
	parent.ExtraFiles = []*os.File{w}
	parent.Stdin = stdin
	parent.Stderr = os.Stderr
	out, err := parent.Output()
	w.Close()
	stdin.Close()
	if err != nil || strings.TrimSpace(string(out)) != "started" {
		t.Fatalf("the parent: %q, %v", out, err)
	}
	r.SetReadDeadline(time.Now().Add(time.Minute))
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("the grandchild outlived its parent: %v", err)
	}
}

// TestRunAs: a child started with RunAs runs as that user and group, with
// no supplementary groups; bad ids are refused.
func TestRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestRunAs starts a process as uid 65534: run it as root (`make test` does)")
	}
	cmd := exec.Command("/bin/sh", "-c", "id -u; id -G")
	if err := RunAs(cmd, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("id as uid 65534: %v (the id command comes with coreutils)", err)
	}
	if got := strings.Fields(string(out)); len(got) != 2 || got[0] != "65534" || got[1] != "65534" {
		t.Errorf("the child's user and groups: %q, want 65534 and only 65534", out)
	}
	if err := RunAs(exec.Command("true"), -1, 0); err == nil {
		t.Error("RunAs took uid -1")
	}
}

// TestSignals: NotifyStop relays SIGTERM, and NotifyStart relays what
// SignalStart sends.
func TestSignals(t *testing.T) {
	stop := make(chan os.Signal, 1)
	NotifyStop(stop)
	defer signal.Stop(stop)
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := <-stop; got != syscall.SIGTERM {
		t.Errorf("NotifyStop relayed %v", got)
	}
	start := make(chan os.Signal, 1)
	NotifyStart(start)
	defer signal.Stop(start)
	if err := SignalStart(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	<-start
	if err := SignalStart(1 << 30); err == nil {
		t.Error("SignalStart to no process succeeded")
	}
}
