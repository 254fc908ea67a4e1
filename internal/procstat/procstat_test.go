package procstat

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestRead: an open file counts as one descriptor until it is closed, and
// Returned sees it go.
func TestRead(t *testing.T) {
	before, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if before.RSS <= 0 || before.Mappings == 0 || before.Goroutines == 0 {
		t.Fatalf("implausible usage: %v", before)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	open, _ := Read()
	if d := open.Sub(before).FDs; d != 1 {
		t.Errorf("an open file counts as %d descriptors", d)
	}
	if open.Within(before, Usage{}) {
		t.Error("Within ignores an extra descriptor")
	}
	if _, err := Returned(before, Usage{Goroutines: 1 << 20}, 10*time.Millisecond); err == nil {
		t.Error("Returned ignores an open file")
	}
	f.Close()
	if _, err := Returned(before, Usage{Goroutines: 1 << 20}, time.Second); err != nil {
		t.Errorf("after Close: %v", err)
	}
}

// TestOf: another process's usage (sleep's: stdin, stdout and stderr at
// least, and no goroutines).
func TestOf(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	u, err := Of(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if u.FDs < 3 || u.RSS <= 0 || u.Mappings == 0 || u.Goroutines != 0 {
		t.Fatalf("sleep holds %v", u)
	}
	if s := u.Add(u); s.FDs != 2*u.FDs || s.RSS != 2*u.RSS {
		t.Fatalf("twice %v is %v", u, s)
	}
}
