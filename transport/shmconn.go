package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport/internal/deadline"
)

// streamWriterWait is how a same-host writer waits for room in a full
// ring: a short spin, then asleep until half the ring is free. A writer
// finds the ring full when its reader is the slower side, so a long spin
// only takes the CPU the reader needs (on a machine short of CPUs, a
// 1 MiB gRPC stream fell to TCP's speed), and a wake-up per record freed
// costs the reader a system call each.
var streamWriterWait = shm.Wait{Spin: 2 * time.Microsecond, Room: ringCapacity / 2}

// Ring geometry of a same-host connection: one ring each way.
const (
	ringCapacity = 1 << 20
	maxChunk     = 64 << 10
)

// ringOffsets lays out a connection's segment: ring a (dialer to listener),
// ring b (listener to dialer), then one cache line per ring holding the
// "reader is parked" word its writer checks after each commit.
func ringOffsets() (a, b, ctl, size int) {
	ring := shm.SPSCSize(ringCapacity)
	return 0, ring, 2 * ring, 2*ring + 256
}

// Parked-reader states.
const (
	readerActive   = 0
	readerParked   = 1 // waiting on its notification pipe
	readerNotified = 2 // a byte is on its way
)

// shmConn is the same-node path of a Conn: two shared-memory rings.
type shmConn struct {
	seg    *shm.Segment
	prod   *shm.Producer
	cons   *shm.Consumer
	local  Addr
	remote Addr

	// A reader with nothing to read parks on notifyIn, a pipe its peer's
	// writer writes a byte to (notifyOut on that side) when it finds the
	// reader's word parked. The pipe also tells of the peer's death: its
	// write end closes with the process.
	waitIn, waitOut     *atomic.Uint32
	notifyIn, notifyOut *os.File
	notifyW             *shm.PipeWriter // notifyOut's, to write without waiting
	peerGone            bool
	// The peer's writer writes one byte per wait of ours it finds parked,
	// so the bytes read from notifyIn never outnumber the waits (rmu): a
	// peer that writes more breaks the protocol (a flood would keep the
	// reader busy), and the connection ends.
	parks, wakes uint64
	broken       atomic.Pointer[error] // why the peer's misbehaviour ended the connection
	brokenCh     chan struct{}         // closed with broken set: wakes blocked calls
	poll         poller                // when Read polls an empty ring (rmu)
	// Since Read last waited: bytes Read returned (rmu), bytes Write
	// committed, and whether a Write found the peer's reader parked.
	readSince  int
	wroteSince atomic.Int64
	wokePeer   atomic.Bool
	samePID    bool // the peer is this process

	msgs       *messages
	live       int  // messages loaned or received, not yet sent or released (mmu)
	unmapLater bool // Close left the unmapping to the last Release (mmu)
	// rmu and wmu serialize stream reads and writes; rmmu and mmu message
	// receives and sends.
	rmu, wmu, rmmu, mmu sync.Mutex
	rec                 []byte // unread rest of the current record
	readDeadline        *deadline.Deadline
	writeDeadline       *deadline.Deadline
	closing             chan struct{}
	closeOnce           sync.Once
	writeClosed         bool
}

var _ net.Conn = (*shmConn)(nil)

func newConn(seg *shm.Segment, prod *shm.Producer, cons *shm.Consumer, waitIn, waitOut *atomic.Uint32, notifyIn, notifyOut *os.File, local, remote Addr) (*shmConn, error) {
	w, err := shm.NewPipeWriter(notifyOut)
	if err != nil {
		return nil, err
	}
	return &shmConn{seg: seg, prod: prod, cons: cons, local: local, remote: remote,
		waitIn: waitIn, waitOut: waitOut, notifyIn: notifyIn, notifyOut: notifyOut, notifyW: w,
		readDeadline: deadline.New(), writeDeadline: deadline.New(), closing: make(chan struct{}), brokenCh: make(chan struct{})}, nil
}

func (c *shmConn) LocalAddr() net.Addr  { return c.local }
func (c *shmConn) RemoteAddr() net.Addr { return c.remote }

func (c *shmConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	c.writeDeadline.Set(t)
	return nil
}

func (c *shmConn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Set(t)
	// A reader parked on the pipe wakes when this deadline passes.
	c.notifyIn.SetReadDeadline(t)
	return nil
}
func (c *shmConn) SetWriteDeadline(t time.Time) error { c.writeDeadline.Set(t); return nil }

func (c *shmConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "ub", Source: c.local, Addr: c.remote, Err: err}
}

// blocking returns a context that ends when the deadline passes or the
// connection closes, for one blocking wait, and the deadline channel it
// watched (the deadline may be moved meanwhile; what counts is whether the
// one the wait saw passed).
func (c *shmConn) blocking(dl *deadline.Deadline) (context.Context, chan struct{}, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	ch := dl.Wait()
	go func() {
		select {
		case <-ch:
		case <-c.closing:
		case <-c.brokenCh:
		case <-stop:
		}
		cancel()
	}()
	return ctx, ch, func() { close(stop); cancel() }
}

// why turns the end of a wait into the error net.Conn users expect; seen is
// the deadline channel the wait watched (nil if it did not wait).
func (c *shmConn) why(dl *deadline.Deadline, seen chan struct{}, err error) error {
	if broken := c.broken.Load(); broken != nil && !deadline.IsClosed(c.closing) {
		return *broken
	}
	switch {
	case deadline.IsClosed(c.closing):
		return net.ErrClosed
	case seen != nil && deadline.IsClosed(seen), deadline.IsClosed(dl.Wait()):
		return os.ErrDeadlineExceeded
	case errors.Is(err, shm.ErrPeerDead):
		return fmt.Errorf("transport: peer process died: %w", shm.ErrConnReset)
	case errors.Is(err, context.Canceled):
		// The wait ended for a deadline that has since moved.
		return os.ErrDeadlineExceeded
	}
	return err
}

// Read reads from the current record, waiting for one if need be.
func (c *shmConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if deadline.IsClosed(c.closing) {
		return 0, c.opError("read", net.ErrClosed)
	}
	if deadline.IsClosed(c.readDeadline.Wait()) {
		return 0, c.opError("read", os.ErrDeadlineExceeded)
	}
	if len(b) == 0 {
		return 0, nil
	}
	var waitStart time.Time
	var ladder shm.Backoff
	polling, excused := false, false
	for len(c.rec) == 0 {
		rec, err := c.cons.Next()
		if err == shm.ErrRingEmpty {
			if waitStart.IsZero() {
				waitStart = time.Now()
				var share bool
				polling, share = c.poll.decide(c.readSince, c.wroteSince.Swap(0))
				ladder = pollLadder(share)
				excused = c.wokePeer.Swap(false)
				if excused && c.samePID && runtime.GOMAXPROCS(0) == 1 {
					// With one P, a peer goroutine of this process that
					// our write woke runs only once the netpoller sees its
					// pipe, which it does not while we poll: park at once.
					polling = false
				}
				c.readSince = 0
			}
			if polling && ladder.Pause() {
				continue
			}
			rec, err = c.park()
			if err == nil && rec == nil {
				continue
			}
		}
		if err != nil {
			if errors.Is(err, shm.ErrClosed) && !deadline.IsClosed(c.closing) {
				return 0, io.EOF
			}
			return 0, c.opError("read", c.why(c.readDeadline, nil, err))
		}
		if len(rec) == 0 {
			c.cons.Release()
			continue
		}
		if polling {
			c.poll.ended(time.Since(waitStart), excused)
		}
		c.rec = rec
	}
	n := copy(b, c.rec)
	c.rec = c.rec[n:]
	c.readSince += n
	if len(c.rec) == 0 {
		c.cons.Release()
	}
	return n, nil
}

// park waits on the notification pipe until the writer has committed
// something, the deadline passes, the connection closes or the peer dies.
// It returns a record if one arrived as it parked, nothing if woken (the
// caller looks again), or an error.
func (c *shmConn) park() ([]byte, error) {
	if err := c.broken.Load(); err != nil {
		return nil, *err
	}
	if c.peerGone {
		return nil, fmt.Errorf("transport: peer process died: %w", shm.ErrConnReset)
	}
	c.waitIn.Store(readerParked)
	c.parks++
	defer c.waitIn.Store(readerActive)
	// Look again after announcing: the writer either sees the word or we
	// see its commit.
	if rec, err := c.cons.Next(); err != shm.ErrRingEmpty {
		return rec, err
	}
	var buf [64]byte
	n, err := c.notifyIn.Read(buf[:])
	c.wakes += uint64(n)
	switch {
	case c.wakes > c.parks:
		return nil, c.fail(fmt.Errorf("transport: the peer wrote %d wake-ups to the notification pipe for %d waits; it breaks the protocol (a buggy or hostile process), so the connection is ended: %w",
			c.wakes, c.parks, shm.ErrConnReset))
	case err == nil:
		return nil, nil
	case deadline.IsClosed(c.closing):
		return nil, net.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return nil, os.ErrDeadlineExceeded
	case errors.Is(err, io.EOF):
		// The writer closed its end: a CloseWrite or Close (the ring then
		// says so), or its process died.
		c.peerGone = true
		return nil, nil
	}
	return nil, err
}

// fail ends the connection for a peer that broke the protocol: reads and
// writes return err from now on, and the notification pipes close, so
// that nothing more the peer writes reaches this side and its reader sees
// the end. Close frees the rest.
func (c *shmConn) fail(err error) error {
	if c.broken.CompareAndSwap(nil, &err) {
		c.notifyIn.Close()
		c.notifyOut.Close()
		close(c.brokenCh)
	}
	return *c.broken.Load()
}

// notify wakes the peer's reader if it is parked. The byte goes without
// waiting: a full pipe already holds wake-ups its reader has yet to read,
// and a peer that stops reading its pipe must not stall this side's
// writes.
func (c *shmConn) notify() {
	if c.waitOut.CompareAndSwap(readerParked, readerNotified) {
		c.wokePeer.Store(true)
		// Written, or the pipe is full, or closed: nothing to do either way.
		c.notifyW.TryWrite(wakeUp[:])
	}
}

// wakeUp is what a writer writes into its peer's notification pipe.
var wakeUp = [1]byte{1}

// Write copies b into the ring in records of up to 64 KiB, waiting for room
// as the reader drains it.
func (c *shmConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if deadline.IsClosed(c.closing) {
		return 0, c.opError("write", net.ErrClosed)
	}
	if c.writeClosed {
		return 0, c.opError("write", shm.ErrBrokenPipe)
	}
	n := 0
	for {
		if err := c.broken.Load(); err != nil {
			return n, c.opError("write", *err)
		}
		if deadline.IsClosed(c.writeDeadline.Wait()) {
			return n, c.opError("write", os.ErrDeadlineExceeded)
		}
		if n == len(b) {
			return n, nil
		}
		chunk := min(len(b)-n, maxChunk)
		buf, err := c.prod.Claim(chunk)
		var seen chan struct{}
		if err == shm.ErrRingFull {
			var ctx context.Context
			var done func()
			ctx, seen, done = c.blocking(c.writeDeadline)
			buf, err = c.prod.ClaimWait(ctx, chunk)
			done()
		}
		if err != nil {
			if errors.Is(err, shm.ErrClosed) && !deadline.IsClosed(c.closing) {
				err = shm.ErrBrokenPipe // the reader is gone
			}
			return n, c.opError("write", c.why(c.writeDeadline, seen, err))
		}
		copy(buf, b[n:n+chunk])
		c.prod.Commit()
		// notify before counting: a Read that sees the count sees
		// whether this write woke the peer.
		c.notify()
		c.wroteSince.Add(int64(chunk))
		n += chunk
	}
}

// CloseWrite tells the peer no more data will come: its reads return
// io.EOF once it has read everything.
func (c *shmConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if deadline.IsClosed(c.closing) {
		return c.opError("close", net.ErrClosed)
	}
	if !c.writeClosed {
		c.writeClosed = true
		c.prod.Close()
		// The parked peer reader wakes on EOF and finds the ring closed.
		c.notifyOut.Close()
	}
	return nil
}

// Close closes both directions. Blocked reads and writes return
// net.ErrClosed.
func (c *shmConn) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		close(c.closing)
	})
	if !first {
		return c.opError("close", net.ErrClosed)
	}
	// Wake a parked reader, then wait for reads and writes in flight to
	// notice.
	c.notifyIn.Close()
	c.rmu.Lock()
	c.cons.Close()
	c.rmu.Unlock()
	c.wmu.Lock()
	c.prod.Close()
	c.notifyOut.Close()
	c.wmu.Unlock()
	c.rmmu.Lock()
	c.mmu.Lock()
	c.msgs.close()
	// Messages still held keep the memory they point into mapped.
	later := c.live > 0
	c.unmapLater = later
	c.mmu.Unlock()
	c.rmmu.Unlock()
	if later {
		return nil
	}
	return c.seg.Close()
}
