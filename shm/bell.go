//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A bell lets the consumer of an MPMC ring wait for a push in Go's
// netpoller instead of a futex. A goroutine asleep on a futex holds its
// thread in a system call, and waking it means waking that thread, which
// on a virtual machine costs tens of microseconds when it sleeps on another
// CPU; a goroutine parked in the netpoller is picked up by whichever of the
// runtime's threads is running or spinning, as for a socket. The bell is a
// FIFO next to the ring's segment in ShmDir; a consumer that sleeps counts
// itself in a word of the ring's header, and a producer that finds the
// count non-zero after a push writes a byte into the FIFO.
type bell struct {
	path    string
	armed   *atomic.Uint32 // sleepers on the bell, in the ring's header
	written *atomic.Uint32 // a producer wrote into the FIFO since the consumer emptied it (header)

	// Consumer side (the handle that enabled the bell).
	rd   *os.File
	raw  syscall.RawConn // rd's, to park in the netpoller without a read
	fd   int             // rd's descriptor, to tell whether the FIFO at path is still ours
	rdMu sync.Mutex      // one sleeper on the file at a time; others use the futex

	// Producer side: the FIFO opened for writing, once needed.
	wmu     sync.Mutex
	wfd     int
	wfailed time.Time // last failed open: retried after bellRetry

	closed atomic.Bool
}

// localBells maps the path of every bell a consumer in this process
// listens on to its bell: a producer in the same process wakes the sleeper
// by moving its read deadline to now, which the runtime turns into a
// wake-up without a system call, instead of writing into the FIFO.
var localBells sync.Map // string -> *bell

// bellSuffix joins a segment's file name and a ring's offset into the
// FIFO's.
const bellSuffix = ".bell-"

// bellRetry is how long a producer that could not open a bell waits before
// trying again (the consumer's sleeps are bounded, so it loses at most that
// much latency meanwhile).
const bellRetry = time.Millisecond

func bellPath(seg *Segment, off int) string {
	if seg.file == "" {
		return "" // anonymous segments have no place for a bell
	}
	return filepath.Join(ShmDir, seg.file+bellSuffix+strconv.Itoa(off))
}

func newBell(path string, armed, written *atomic.Uint32) *bell {
	return &bell{path: path, armed: armed, written: written, wfd: -1}
}

// EnableBell makes WaitNotEmpty on this handle sleep in Go's netpoller,
// woken by producers' pushes, instead of on a futex. Call it on the
// consumer's handle of a ring in a named segment; Close removes the bell.
func (r *MPMC) EnableBell() error {
	if r.bell == nil || r.bell.path == "" {
		return errors.New("shm: a bell needs a ring in a named segment")
	}
	b := r.bell
	if b.rd != nil {
		return nil
	}
	for attempt := 0; ; attempt++ {
		if attempt == 3 {
			return fmt.Errorf("shm: create bell %s: it keeps disappearing", b.path)
		}
		err := unix.Mkfifo(b.path, 0o600)
		if err != nil {
			if !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("shm: create bell %s: %w", b.path, err)
			}
			// A bell already there: only a stale one of ours (a FIFO
			// nobody reads) may go; a live one belongs to another
			// consumer.
			if live, err := bellLive(b.path); err != nil || live {
				if err == nil {
					err = errors.New("another consumer listens on it")
				}
				return fmt.Errorf("shm: create bell %s: %w", b.path, err)
			}
			unix.Unlink(b.path)
			continue
		}
		// Read-write: the FIFO always has a writer, so it never reads as
		// closed, and opening it does not block.
		fd, err := unix.Open(b.path, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // removed meanwhile (a Sweep took it for stale)
		}
		// Still the FIFO at the path? A Sweep may have removed the one we
		// made between Mkfifo and Open, and another may be there now.
		if !sameFile(fd, b.path) {
			unix.Close(fd)
			continue
		}
		b.fd = fd
		break
	}
	fd := b.fd
	rd := os.NewFile(uintptr(fd), b.path)
	raw, err := rd.SyscallConn()
	if err != nil {
		rd.Close()
		unix.Unlink(b.path)
		return fmt.Errorf("shm: bell %s: %w", b.path, err)
	}
	b.rd, b.raw = rd, raw
	localBells.Store(b.path, b)
	return nil
}

// ring writes a byte into the bell if a consumer sleeps on it. Producers
// call it after publishing a record.
func (b *bell) ring() {
	if b == nil || b.path == "" || b.armed.Load() == 0 {
		return
	}
	if v, ok := localBells.Load(b.path); ok {
		// The sleeper set its deadline before it last looked at the
		// ring, and our record came after that look: this deadline is
		// the later one, and its Read returns.
		v.(*bell).rd.SetReadDeadline(time.Now())
		return
	}
	b.wmu.Lock()
	defer b.wmu.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if b.wfd < 0 {
			if !b.wfailed.IsZero() && time.Since(b.wfailed) < bellRetry {
				return
			}
			fd, err := openBellForWriting(b.path)
			if err != nil {
				b.wfailed = time.Now()
				return
			}
			b.wfd, b.wfailed = fd, time.Time{}
		}
		_, err := unix.Write(b.wfd, []byte{1})
		if err == nil || errors.Is(err, unix.EAGAIN) {
			// Rung, or bytes already wait to be read. Said after the
			// write: a consumer that sees it empties the FIFO.
			b.written.Store(1)
			return
		}
		// EPIPE: the FIFO we hold was replaced (its consumer closed it);
		// open the current one.
		unix.Close(b.wfd)
		b.wfd = -1
	}
}

// openBellForWriting opens a bell for writing, refusing anything but a
// FIFO of our own user.
func openBellForWriting(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO || int(st.Uid) != os.Geteuid() {
		unix.Close(fd)
		return -1, fmt.Errorf("shm: %s is not our bell", path)
	}
	return fd, nil
}

// sleep waits on the bell until ready holds, ctx ends, or d passes. It
// reports false, having waited for nothing, when another goroutine
// already sleeps on the bell.
func (b *bell) sleep(ctx context.Context, ready func() bool, d time.Duration) bool {
	if b.closed.Load() || !b.rdMu.TryLock() {
		return false // closed, or another goroutine sleeps on it: the futex
	}
	defer b.rdMu.Unlock()
	b.armed.Add(1)
	defer b.armed.Add(^uint32(0))
	now := time.Now()
	dl := now.Add(d)
	if cdl, ok := ctx.Deadline(); ok && cdl.Before(dl) {
		if !cdl.After(now) {
			return true // the caller's time is up (its timer may not have fired yet)
		}
		dl = cdl
	}
	b.rd.SetReadDeadline(dl)
	// Look again after announcing ourselves and setting the deadline: a
	// producer either sees the count (and writes the FIFO, or, in this
	// process, moves the deadline after this Set) or we see its record.
	if ready() {
		return true
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { b.rd.SetReadDeadline(time.Now()) })
		defer stop()
	}
	// Park in the netpoller without reading: in this process a producer
	// wakes us by moving the deadline, and no read is needed at all. The
	// first call looks at the ring once more, after the poller forgot
	// earlier readiness; a later one means a producer of another process
	// wrote, and the FIFO is emptied.
	first := true
	b.raw.Read(func(fd uintptr) bool {
		if first {
			first = false
			// Bytes a producer of another process wrote (it says so
			// after its write) and no wake-up took: empty the FIFO
			// before parking, or they could hide the next write.
			if b.written.Load() != 0 {
				b.drain(int(fd))
			}
			return ready()
		}
		b.drain(int(fd))
		return true
	})
	return true
}

// drain empties the FIFO at fd (the sleeper's lock held), so that the next
// write makes it readable again whatever the kernel's wake-up rules for a
// pipe that already holds bytes.
func (b *bell) drain(fd int) {
	b.written.Store(0)
	var buf [64]byte
	for {
		n, err := unix.Read(fd, buf[:])
		if err != nil || n < len(buf) {
			return
		}
	}
}

// close closes the bell's files, and removes the FIFO if this handle made
// it (enabled the bell).
func (b *bell) close() {
	if b == nil {
		return
	}
	b.wmu.Lock()
	if b.wfd >= 0 {
		unix.Close(b.wfd)
		b.wfd = -1
	}
	b.wmu.Unlock()
	if b.rd != nil && b.closed.CompareAndSwap(false, true) {
		localBells.CompareAndDelete(b.path, b)
		// Remove the FIFO only if it is still ours. rd stays set: a
		// sleeper may still hold it, and its Read fails.
		if sameFile(b.fd, b.path) {
			unix.Unlink(b.path)
		}
		b.rd.Close()
	}
}

// bellLive reports whether a process has the FIFO at path open for
// reading (its consumer is alive). Anything but our own FIFO is an error.
func bellLive(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO || int(st.Uid) != os.Geteuid() {
		return false, errors.New("a file that is not our FIFO is in the way")
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err == nil {
		unix.Close(fd)
		return true, nil
	}
	if errors.Is(err, unix.ENXIO) {
		return false, nil
	}
	return false, err
}

// sameFile reports whether fd is the file at path.
func sameFile(fd int, path string) bool {
	var a, b unix.Stat_t
	if unix.Fstat(fd, &a) != nil || unix.Lstat(path, &b) != nil {
		return false
	}
	return a.Dev == b.Dev && a.Ino == b.Ino
}

// bellSweepAge is how old a bell beside its segment must be before Sweep
// may take it for stale: a consumer opens its bell just after making it.
const bellSweepAge = time.Minute

// sweepBell removes a bell (name in ShmDir) that no process listens on.
func sweepBell(name string) (bool, error) {
	if !strings.HasPrefix(name, NamePrefix) || !strings.Contains(name, bellSuffix) {
		return false, nil
	}
	path := filepath.Join(ShmDir, name)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, nil
	}
	// Its segment gone, a bell is an orphan; beside a segment, only an old
	// one may be stale (a consumer opens its bell just after making it).
	seg := filepath.Join(ShmDir, name[:strings.LastIndex(name, bellSuffix)])
	if _, err := os.Lstat(seg); err == nil && time.Since(time.Unix(st.Mtim.Unix())) < bellSweepAge {
		return false, nil
	}
	if live, err := bellLive(path); err != nil || live {
		return false, nil
	}
	if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("shm: sweep %s: %w", path, err)
	}
	return true, nil
}

// mkfifo makes a FIFO of mode 0600 (for tests).
func mkfifo(path string) error { return unix.Mkfifo(path, 0o600) }
