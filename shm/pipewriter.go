//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrWouldBlock reports a PipeWriter's write that found the pipe full and
// did not wait for room.
var ErrWouldBlock = errors.New("shm: the pipe is full")

// PipeWriter writes to the write end of a pipe without ever waiting for
// room, in Go's netpoller or in the kernel: for wake-up bytes, which a
// full pipe already holds enough of, and which must not stall the writer
// when the reader stops reading. Make it once per pipe; it is safe for
// concurrent use.
type PipeWriter struct {
	raw syscall.RawConn
}

// NewPipeWriter returns a PipeWriter for f, the write end of a pipe open
// in non-blocking mode (as os.Pipe and ReceivePipes return them). f stays
// the caller's to close.
func NewPipeWriter(f *os.File) (*PipeWriter, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("shm: pipe writer: %w", err)
	}
	return &PipeWriter{raw: raw}, nil
}

// TryWrite writes b with one write(2) and returns how many bytes went in.
// A full pipe takes none and TryWrite returns ErrWouldBlock; a pipe whose
// read end is closed returns an error matching ErrBrokenPipe, and a
// closed file os.ErrClosed.
func (w *PipeWriter) TryWrite(b []byte) (int, error) {
	var n int
	var werr error
	err := w.raw.Write(func(fd uintptr) bool {
		n, werr = unix.Write(int(fd), b)
		return true // whatever happened: never wait for room
	})
	if err != nil {
		// The only failure of a write that never waits: f is closed.
		return 0, fmt.Errorf("shm: write to pipe: %w", os.ErrClosed)
	}
	if errors.Is(werr, unix.EAGAIN) {
		return 0, ErrWouldBlock
	}
	if werr != nil {
		return max(n, 0), fmt.Errorf("shm: write to pipe: %w", werr)
	}
	return n, nil
}
