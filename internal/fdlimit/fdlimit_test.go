//go:build linux

package fdlimit

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
)

func TestHint(t *testing.T) {
	emfile := &os.PathError{Op: "open", Path: "/dev/shm/x", Err: syscall.EMFILE}
	h := Hint(fmt.Errorf("shmprov: import segment: %w", emfile))
	if !errors.Is(h, syscall.EMFILE) || !strings.Contains(h.Error(), "fd limit") || !strings.Contains(h.Error(), "ulimit -n") {
		t.Errorf("EMFILE: %v", h)
	}
	if again := Hint(fmt.Errorf("transport: dial: %w", h)); strings.Count(again.Error(), "fd limit") != 1 {
		t.Errorf("hinted twice: %v", again)
	}
	if h := Hint(syscall.ENFILE); !errors.Is(h, syscall.ENFILE) || !strings.Contains(h.Error(), "fs.file-max") {
		t.Errorf("ENFILE: %v", h)
	}
	peer := fmt.Errorf("node n0 refused: %w", Peer(int(syscall.EMFILE)))
	if h := Hint(peer); h != peer || !errors.Is(h, syscall.EMFILE) {
		t.Errorf("a peer's limit: %v (want it unchanged, matching EMFILE)", h)
	}
	for _, err := range []error{nil, syscall.ENOENT, errors.New("other")} {
		if got := Hint(err); got != err {
			t.Errorf("Hint(%v) = %v, want it unchanged", err, got)
		}
	}
}

// TestPeer: only a peer's EMFILE and ENFILE become causes, matching the
// errno.
func TestPeer(t *testing.T) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE} {
		if err := Peer(int(errno)); !errors.Is(err, errno) || !strings.Contains(err.Error(), "peer") {
			t.Errorf("Peer(%d): %v", errno, err)
		}
	}
	for _, n := range []int{0, int(syscall.ENOENT), -1, 1 << 30} {
		if err := Peer(n); err != nil {
			t.Errorf("Peer(%d) = %v, want nil", n, err)
		}
	}
	if !errors.Is(Peer(int(syscall.EMFILE)), ErrProcessLimit) || !errors.Is(Peer(int(syscall.ENFILE)), ErrSystemLimit) {
		t.Error("a peer's cause does not match ErrProcessLimit or ErrSystemLimit")
	}
}

// TestSetLimit: a limit set is the limit read, opening descriptors past
// it fails with ErrProcessLimit, and a limit above the hard one is refused.
func TestSetLimit(t *testing.T) {
	orig, err := Limit()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := SetLimit(orig); err != nil {
			t.Fatal(err)
		}
	}()
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, f)
	low := uint64(f.Fd()) + 1 // no descriptor free below the limit
	if err := SetLimit(low); err != nil {
		t.Fatal(err)
	}
	if got, err := Limit(); got != low || err != nil {
		t.Errorf("Limit() = %d, %v after SetLimit(%d)", got, err, low)
	}
	// Descriptors below the limit that were free open; the next fails.
	for opened := 0; ; opened++ {
		f, err := os.Open(os.DevNull)
		if err != nil {
			if !errors.Is(err, ErrProcessLimit) {
				t.Errorf("an open past the limit: %v, want ErrProcessLimit", err)
			}
			break
		}
		files = append(files, f)
		if f.Fd() >= uintptr(low) || uint64(opened) >= low {
			t.Fatalf("descriptor %d opened under a limit of %d", f.Fd(), low)
		}
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Max != ^uint64(0) {
		if err := SetLimit(rl.Max + 1); err == nil || !strings.Contains(err.Error(), "hard limit") {
			t.Errorf("a limit above the hard one: %v", err)
		}
	}
}
