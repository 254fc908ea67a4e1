//go:build linux

package shm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func init() {
	// Create segment args[0] with Keep, or (args[1] set) open it and hold
	// it as args[1] says: "segment" (mapped and open), "map" (mapped, its
	// descriptor closed) or "fd" (open, not mapped). Then say so and wait
	// for stdin to close.
	children["hold"] = func(args []string) error {
		name := args[0]
		switch args[1] {
		case "create":
			if _, err := CreateSegment(name, 4096, &SegmentConfig{Keep: true}); err != nil {
				return err
			}
		case "segment", "map":
			s, err := OpenSegment(name)
			if err != nil {
				return err
			}
			if args[1] == "map" {
				unix.Close(s.fd)
				s.fd = -1
			}
		case "fd":
			if _, err := os.Open(filepath.Join(ShmDir, userPrefix()+name)); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown hold %q", args[1])
		}
		fmt.Println("holding")
		_, err := io.Copy(io.Discard, os.Stdin)
		return err
	}
}

// startHolder runs child "hold" and returns once it holds the segment.
func startHolder(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := childCommand(t, "hold", childArgs(args...))
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil { // closed by Wait, or when we exit
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "holding\n" {
		t.Fatalf("child hold %v: %q, %v", args, line, err)
	}
	return cmd
}

func kill(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Kill()
	if err := cmd.Wait(); err == nil {
		t.Fatalf("child %d was not killed", cmd.Process.Pid)
	}
}

// A Keep segment whose creator was killed stays while another process has
// it mapped or open, and goes once that process is gone.
func TestSweepKeepsSegmentsInUse(t *testing.T) {
	for _, hold := range []string{"segment", "map", "fd"} {
		t.Run(hold, func(t *testing.T) {
			name := testName(t)
			path := filepath.Join(ShmDir, userPrefix()+name)
			t.Cleanup(func() { os.Remove(path) })
			creator := startHolder(t, name, "create")
			user := startHolder(t, name, hold)
			kill(t, creator)
			start := time.Now()
			removed, err := Sweep()
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if slices.Contains(removed, name) {
				t.Fatalf("Sweep removed %s while process %d holds it (%s)", name, user.Process.Pid, hold)
			}
			if _, err := os.Lstat(path); err != nil {
				t.Fatalf("%s after the Sweep: %v", path, err)
			}
			kill(t, user)
			if removed, err = Sweep(); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(removed, name) {
				t.Errorf("Sweep removed %v, not %s, which nobody uses any more", removed, name)
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after its last user died: %v", path, err)
			}
			t.Logf("a Sweep that scanned /proc took %v", took)
		})
	}
}

// scanInUse sees this process's own mapping and descriptor of a segment,
// and not a file that nobody holds.
func TestScanInUse(t *testing.T) {
	s := newSegment(t, 4096)
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil {
		t.Fatal(err)
	}
	idle := filepath.Join(ShmDir, userPrefix()+testName(t)+"-idle")
	if err := os.WriteFile(idle, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(idle)
	var idleSt unix.Stat_t
	if err := unix.Lstat(idle, &idleSt); err != nil {
		t.Fatal(err)
	}
	used, err := scanInUse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !used[statID(&st)] {
		t.Errorf("scanInUse does not see this process's segment %s (%d files in use)", s.file, len(used))
	}
	if used[statID(&idleSt)] {
		t.Errorf("scanInUse counts %s, which nobody holds, as in use", idle)
	}
}

// Sweep never removes a name that an OpenSegment holds, whenever the open
// happens: while Sweep scans /proc (a free race), or after the scan, before
// Sweep removes the segment (then the opener must wait and find it gone).
func TestSweepRacesOpenSegment(t *testing.T) {
	const rounds = 40
	held, gone := 0, 0
	for i := range rounds {
		step := "scan"
		if i%2 == 1 {
			step = "scanned"
		}
		name := testName(t)
		path := filepath.Join(ShmDir, userPrefix()+name)
		t.Cleanup(func() { os.Remove(path) })
		s, err := CreateSegment(name, 4096, &SegmentConfig{Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		binary.LittleEndian.PutUint64(s.mem[segOffCreator:], 0) // as if its creator had died
		var st unix.Stat_t
		if err := unix.Fstat(s.fd, &st); err != nil {
			t.Fatal(err)
		}
		s.Close()
		var o *Segment
		var openErr error
		opened := make(chan struct{})
		var once sync.Once
		sweepHook = func(at string) {
			if at != step {
				return
			}
			once.Do(func() {
				go func() {
					defer close(opened)
					o, openErr = OpenSegment(name)
				}()
				if step == "scanned" {
					// Until the opener is done or waits for the lock.
					waitLockWaiter(t, &st, opened)
				}
			})
		}
		_, err = Sweep()
		sweepHook = nil
		if err != nil {
			t.Fatal(err)
		}
		<-opened
		switch {
		case openErr == nil:
			held++
			if !sameFile(o.fd, path) {
				t.Errorf("round %d (%s): Sweep removed %s while an OpenSegment held it", i, step, name)
			}
			o.Unlink()
			o.Close()
		case errors.Is(openErr, os.ErrNotExist):
			gone++
		default:
			t.Fatalf("round %d (%s): OpenSegment: %v", i, step, openErr)
		}
	}
	t.Logf("%d rounds: the opener held the segment in %d, found it swept in %d", rounds, held, gone)
}

// waitLockWaiter returns once a process waits for a flock on the file st
// describes (as /proc/locks shows) or done is closed. It may run outside
// the test's goroutine.
func waitLockWaiter(t *testing.T, st *unix.Stat_t, done <-chan struct{}) {
	waiter := fmt.Sprintf(" %02x:%02x:%d ", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-done:
			return
		default:
		}
		locks, err := os.ReadFile("/proc/locks")
		if err != nil {
			t.Error(err)
			return
		}
		for line := range strings.Lines(string(locks)) {
			if strings.Contains(line, "->") && strings.Contains(line, waiter) {
				return
			}
		}
		runtime.Gosched()
	}
	t.Errorf("nobody waited for the lock of inode %d, nor did the call finish, in 10 s", st.Ino)
}
