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
	peer := fmt.Errorf("node n0 refused: %w", Peer(syscall.EMFILE))
	if h := Hint(peer); h != peer || !errors.Is(h, syscall.EMFILE) {
		t.Errorf("a peer's limit: %v (want it unchanged, matching EMFILE)", h)
	}
	for _, err := range []error{nil, syscall.ENOENT, errors.New("other")} {
		if got := Hint(err); got != err {
			t.Errorf("Hint(%v) = %v, want it unchanged", err, got)
		}
	}
}
