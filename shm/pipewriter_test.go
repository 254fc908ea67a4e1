//go:build linux

package shm

import (
	"errors"
	"os"
	"runtime"
	"testing"
)

// TestPipeWriter: TryWrite fills a pipe and then refuses at once instead of
// waiting, writes again once the reader made room, and reports a reader
// that is gone and a file that is closed.
func TestPipeWriter(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pw, err := NewPipeWriter(w)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	total := 0
	for {
		n, err := pw.TryWrite(chunk)
		total += n
		if errors.Is(err, ErrWouldBlock) {
			break
		}
		if err != nil {
			t.Fatalf("after %d bytes: %v", total, err)
		}
		if total > 64<<20 {
			t.Fatalf("a pipe took %d bytes without filling up", total)
		}
	}
	if total == 0 {
		t.Fatal("an empty pipe took nothing")
	}
	if _, err := r.Read(make([]byte, len(chunk))); err != nil {
		t.Fatal(err)
	}
	if n, err := pw.TryWrite([]byte{1}); n != 1 || err != nil {
		t.Errorf("a write after the reader made room: %d, %v", n, err)
	}
	r.Close()
	if _, err := pw.TryWrite([]byte{1}); !errors.Is(err, ErrBrokenPipe) {
		t.Errorf("a write without a reader: %v, want ErrBrokenPipe", err)
	}
	w.Close()
	if _, err := pw.TryWrite([]byte{1}); !errors.Is(err, os.ErrClosed) {
		t.Errorf("a write to a closed file: %v, want os.ErrClosed", err)
	}
}

// TestYield: Yield returns to its caller, a thousand times in a row, on
// two threads at once.
func TestYield(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for range 1000 {
			Yield()
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for range 1000 {
		Yield()
	}
	<-done
}
