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

// TestCPU: the process's own processor time grows while it computes, by
// about as much as it computed, and a stat line is read past a command
// holding spaces and parentheses.
func TestCPU(t *testing.T) {
	before, err := CPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Compute on this thread until the process counts 100 ms more, for
	// at most 20 s of wall time (a loaded machine gives less CPU).
	start := time.Now()
	x := uint64(1)
	for {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		now, err := CPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 100*time.Millisecond {
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("CPU went from %v to %v over %v of computing (x %d)", before, now, time.Since(start), x)
		}
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("100 ms of CPU counted after %v of wall time", took)
	}

	got, err := parseCPU([]byte("4242 (a b) (c)) S 1 4242 4242 0 -1 4194560 130 0 0 0 250 17 0 0 20 0 1 0 100 1000 10 18446744073709551615\n"))
	if err != nil || got != 2670*time.Millisecond {
		t.Errorf("parseCPU: %v, %v; want 2.67s", got, err)
	}
	for _, bad := range []string{"4242 no command", "4242 (x) S 1 2", "4242 (x) S 1 4242 4242 0 -1 4194560 130 0 0 0 -5 17 0"} {
		if _, err := parseCPU([]byte(bad)); err == nil {
			t.Errorf("parseCPU(%q): no error", bad)
		}
	}
}
