//go:build linux

package shm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// descriptorKit opens the kinds of file a hostile sender may pass instead
// of the ones expected, each closed when the test ends.
type descriptorKit struct {
	t *testing.T
}

func (k descriptorKit) pipe() (r, w int) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

func (k descriptorKit) open(path string, flags int) int {
	fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0o600)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func (k descriptorKit) regular() int {
	return k.open(filepath.Join(k.t.TempDir(), "f"), unix.O_RDWR|unix.O_CREAT)
}

func (k descriptorKit) socket() int {
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0]
}

// memfd makes a memfd segment of size, sealed with seals.
func (k descriptorKit) memfd(size, seals int) int {
	s, err := CreateMemfd("kit", size, nil)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { s.Close() })
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(s.fd), unix.F_ADD_SEALS, seals); err != nil {
			k.t.Fatal(err)
		}
	}
	return s.fd
}

// sendRaw sends one byte, tag, carrying fds, as a hostile sender may.
func sendRaw(t *testing.T, c *net.UnixConn, tag byte, fds ...int) {
	t.Helper()
	if _, _, err := c.WriteMsgUnix([]byte{tag}, unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
}

// expectRefused sends fds with tag, and checks that receive (which closes
// whatever it accepts) refuses them with ErrBadDescriptor and leaves no
// received descriptor open.
func expectRefused(t *testing.T, tag byte, fds []int, receive func(*net.UnixConn) error) {
	t.Helper()
	a, b := socketPair(t)
	before := openFDs(t)
	sendRaw(t, a, tag, fds...)
	if err := receive(b); !errors.Is(err, ErrBadDescriptor) {
		t.Fatalf("%v, want ErrBadDescriptor", err)
	}
	if n := openFDs(t); n != before {
		t.Errorf("%d descriptors open after the refusal, %d before", n, before)
	}
}

// TestReceivePipesChecksDescriptors: ReceivePipes takes exactly the pipe
// ends it is told to, each of another pipe, and refuses anything else with
// ErrBadDescriptor, leaving no received descriptor open.
func TestReceivePipesChecksDescriptors(t *testing.T) {
	k := descriptorKit{t}
	r1, w1 := k.pipe()
	r2, w2 := k.pipe()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	fifoRW := k.open(fifo, unix.O_RDWR)
	many := []int{r1, w2}
	for range 20 {
		many = append(many, w1)
	}
	for _, c := range []struct {
		name string
		tag  byte
		fds  []int
	}{
		{"/dev/zero as the read end", 'F', []int{k.open("/dev/zero", unix.O_RDONLY), w2}},
		{"/dev/zero as the write end", 'F', []int{r1, k.open("/dev/zero", unix.O_WRONLY)}},
		{"a regular file", 'F', []int{k.regular(), w2}},
		{"a socket", 'F', []int{r1, k.socket()}},
		{"a memfd", 'F', []int{k.memfd(4096, 0), w2}},
		{"the ends swapped", 'F', []int{w1, r2}},
		{"a FIFO open read-write", 'F', []int{fifoRW, w2}},
		{"both ends of one pipe", 'F', []int{r1, w1}},
		{"one descriptor", 'F', []int{r1}},
		{"one descriptor too many", 'F', []int{r1, w2, w1}},
		{"a truncated control message", 'F', many},
		{"no descriptors", 'F', nil},
		{"another message", 'S', []int{r1, w2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			expectRefused(t, c.tag, c.fds, func(b *net.UnixConn) error {
				files, err := ReceivePipes(b, PipeReadEnd, PipeWriteEnd)
				for _, f := range files {
					f.Close()
				}
				return err
			})
		})
	}
	t.Run("two pipes", func(t *testing.T) {
		a, b := socketPair(t)
		sendRaw(t, a, 'F', r1, w2)
		files, err := ReceivePipes(b, PipeReadEnd, PipeWriteEnd)
		if err != nil {
			t.Fatal(err)
		}
		defer files[0].Close()
		defer files[1].Close()
		// Non-blocking and in the netpoller: a deadline ends a read.
		files[0].SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := files[0].Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("read of an empty pipe: %v, want a deadline error", err)
		}
		if _, err := files[1].Write([]byte("x")); err != nil {
			t.Error(err)
		}
	})
}

// TestReceiveSegmentChecksDescriptors: ReceiveSegment maps only a memfd
// sealed against resizing (not against writing), open read-write, of the
// size asked for; anything else is refused with ErrBadDescriptor before it
// is mapped, leaving no received descriptor open.
func TestReceiveSegmentChecksDescriptors(t *testing.T) {
	k := descriptorKit{t}
	const size = 1 << 16
	const sealed = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	r, w := k.pipe()
	good := k.memfd(size, sealed)
	readOnly := k.open(fmt.Sprintf("/proc/self/fd/%d", k.memfd(size, sealed)), unix.O_RDONLY)
	for _, c := range []struct {
		name string
		fds  []int
	}{
		{"an unsealed memfd", []int{k.memfd(size, 0)}},
		{"a memfd sealed against shrinking only", []int{k.memfd(size, unix.F_SEAL_SHRINK)}},
		{"a memfd sealed against writing", []int{k.memfd(size, sealed|unix.F_SEAL_FUTURE_WRITE)}},
		{"a memfd too large", []int{k.memfd(2*size, sealed)}},
		{"a memfd too small", []int{k.memfd(size/2, sealed)}},
		{"a read-only memfd", []int{readOnly}},
		{"a regular file", []int{k.regular()}},
		{"/dev/zero", []int{k.open("/dev/zero", unix.O_RDWR)}},
		{"a pipe", []int{r}},
		{"two descriptors", []int{good, w}},
	} {
		t.Run(c.name, func(t *testing.T) {
			expectRefused(t, 'S', c.fds, func(b *net.UnixConn) error {
				s, err := ReceiveSegment(b, &ReceiveOptions{Size: size})
				if err == nil {
					s.Close()
				}
				return err
			})
		})
	}
	t.Run("a sealed memfd of the size", func(t *testing.T) {
		a, b := socketPair(t)
		sendRaw(t, a, 'S', good)
		s, err := ReceiveSegment(b, &ReceiveOptions{Size: size})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	})
}
