//go:build linux

package shm_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// The ways another user can take the file of a victim's segment name before
// the victim creates it.
var squats = []string{"lure", "open", "symlink", "fifo", "dir"}

func init() {
	// Run as the other user: squat args[2:] of victim uid args[0], and its
	// runtime directory under temporary directory args[1].
	shm.RegisterChild("squat", func(args []string) error {
		if os.Geteuid() == 0 {
			return errors.New("the squatter runs as root")
		}
		victim, tmp, base := args[0], args[1], args[2]
		if err := os.Mkdir(filepath.Join(tmp, "ubkit-"+victim), 0o777); err != nil {
			return err
		}
		for _, how := range squats {
			path := filepath.Join(shm.ShmDir, shm.NamePrefix+victim+"-"+base+"-"+how)
			var err error
			switch how {
			case "lure": // a valid segment of the squatter's, under the victim's name
				var s *shm.Segment
				if s, err = shm.CreateSegment(base+"-lure", 4096, &shm.SegmentConfig{Keep: true}); err == nil {
					copy(s.Data(), "lure")
					own := filepath.Join(shm.ShmDir, s.File())
					s.Close()
					if err = os.Link(own, path); err == nil {
						err = os.Remove(own)
					}
				}
			case "open":
				err = os.WriteFile(path, make([]byte, 2*shm.HeaderSize), 0o666)
				if err == nil {
					err = os.Chmod(path, 0o666)
				}
			case "symlink":
				err = os.Symlink("/etc/shadow", path)
			case "fifo":
				err = syscall.Mkfifo(path, 0o666)
			case "dir":
				err = os.Mkdir(path, 0o777)
			}
			if err != nil {
				return fmt.Errorf("squat %s: %w", path, err)
			}
		}
		// Alive until the test ends, so that no Sweep takes the lure
		// (its creator is this process).
		fmt.Println("squatted")
		_, err := io.Copy(io.Discard, os.Stdin)
		return err
	})
	// Open segment args[0], check that it holds args[1] and write args[2]
	// after it.
	shm.RegisterChild("open-reply", func(args []string) error {
		s, err := shm.OpenSegment(args[0])
		if err != nil {
			return err
		}
		defer s.Close()
		if !bytes.HasPrefix(s.Data(), []byte(args[1])) {
			return fmt.Errorf("segment %s holds %q, want %q", args[0], s.Data()[:len(args[1])], args[1])
		}
		copy(s.Data()[len(args[1]):], args[2])
		return nil
	})
}

// Another user takes the files of a victim's segment names (and its
// runtime directory) first, in every way it can; the victim's processes
// still create and share the segments, and never open the other user's.
func TestCreateSegmentSquattedByAnotherUser(t *testing.T) {
	u := testenv.OtherUser(t)
	tmp, home := testenv.IsolateRuntimeDir(t)
	base := fmt.Sprintf("test-squat-%d-%d", os.Getpid(), time.Now().UnixNano())
	victim := strconv.Itoa(os.Geteuid())
	for _, how := range squats {
		path := filepath.Join(shm.ShmDir, shm.UserPrefix()+base+"-"+how)
		t.Cleanup(func() { os.Remove(path) })
	}
	defer startSquatter(t, u, shm.ChildArgs(victim, tmp, base))()
	if owner := fileOwner(t, filepath.Join(tmp, "ubkit-"+victim)); owner != u.UID {
		t.Fatalf("the runtime directory under TMPDIR belongs to %d, not to the squatter", owner)
	}
	for _, how := range squats {
		t.Run(how, func(t *testing.T) {
			name := base + "-" + how
			squat := filepath.Join(shm.ShmDir, shm.UserPrefix()+name)
			if owner := fileOwner(t, squat); owner != u.UID {
				t.Fatalf("%s is owned by %d, not by the squatter %d", squat, owner, u.UID)
			}
			if s, err := shm.OpenSegment(name); !errors.Is(err, os.ErrNotExist) {
				if err == nil {
					s.Close()
				}
				t.Fatalf("OpenSegment(%q) before it was created: %v, want an error wrapping os.ErrNotExist", name, err)
			}
			s, err := shm.CreateSegment(name, 4096, &shm.SegmentConfig{Keep: true})
			if err != nil {
				t.Fatalf("CreateSegment(%q) beside the squatter's file: %v", name, err)
			}
			defer s.Close()
			defer s.Unlink()
			if s.Name() != name || s.File() == filepath.Base(squat) {
				t.Fatalf("segment %q in file %s", s.Name(), s.File())
			}
			// The runtime directory under TMPDIR is the squatter's too: the
			// record went to the fallback in HOME.
			rec := filepath.Join(home, ".cache", "ubkit", "run", "@shm", name+".seg")
			if target, err := os.Readlink(rec); err != nil || target != s.File() {
				t.Fatalf("record %s: %q, %v; want it to name %s", rec, target, err, s.File())
			}
			copy(s.Data(), "ping")
			if err := shm.StartChild(t, "open-reply", name, "ping", "pong").Wait(); err != nil {
				t.Fatalf("another process of this user opening %s: %v", name, err)
			}
			if got := string(s.Data()[:8]); got != "pingpong" {
				t.Fatalf("the other process's write is not in the segment: %q", got)
			}
			o, err := shm.OpenSegment(name)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			if o.ID() != s.ID() {
				t.Errorf("OpenSegment(%q) opened segment %x, want %x", name, o.ID(), s.ID())
			}
			if owner := fileOwner(t, squat); owner != u.UID {
				t.Errorf("the squatter's file now belongs to %d", owner)
			}
		})
	}
}

// startSquatter runs the squatter as u, with args (shm.ChildArgs), and
// returns once it has squatted, with the function that ends it (before the
// test ends, which would kill it).
func startSquatter(t *testing.T, u *testenv.User, args string) (stop func()) {
	t.Helper()
	cmd := u.Child(t, "squat", args)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the squatter: %v; stderr: %s", err, stderr.String())
		}
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "squatted\n" {
		stop()
		t.Fatalf("the squatter did not squat: %q, %v", line, err)
	}
	return stop
}

func fileOwner(t *testing.T, path string) int {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

func init() {
	shm.RegisterChild("sweep", func([]string) error {
		_, err := shm.Sweep()
		return err
	})
}

// Another user's stale leftover in the sticky /dev/shm, which this user
// may read but not remove: Sweep run by this user leaves it alone instead
// of failing on it.
func TestSweepSkipsAnotherUsersFiles(t *testing.T) {
	u := testenv.OtherUser(t)
	path := filepath.Join(shm.ShmDir, fmt.Sprintf("%stest-sweep-foreign-%d-%d", shm.UserPrefix(), os.Getpid(), time.Now().UnixNano()))
	if err := os.WriteFile(path, make([]byte, 64), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	if out, err := u.Child(t, "sweep").CombinedOutput(); err != nil {
		t.Fatalf("Sweep as uid %d beside uid %d's stale %s: %v\n%s", u.UID, os.Geteuid(), path, err, out)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("%s after the other user's Sweep: %v", path, err)
	}
}
