package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// Path says how a connection's bytes travel.
type Path string

// Paths.
const (
	// PathShm is the same-host path: shared-memory rings.
	PathShm Path = "shm"
)

// Ring geometry of a same-host connection: one ring each way.
const (
	ringCapacity = 1 << 20
	maxChunk     = 64 << 10
)

func ringOffsets() (a, b, size int) {
	return 0, shm.SPSCSize(ringCapacity), 2 * shm.SPSCSize(ringCapacity)
}

// Conn is a connection over the bus. It is a net.Conn; CloseWrite
// half-closes it.
type Conn struct {
	seg    *shm.Segment
	prod   *shm.Producer
	cons   *shm.Consumer
	local  Addr
	remote Addr

	rmu, wmu      sync.Mutex
	rec           []byte // unread rest of the current record
	readDeadline  *deadline
	writeDeadline *deadline
	closing       chan struct{}
	closeOnce     sync.Once
	writeClosed   bool
}

var _ net.Conn = (*Conn)(nil)

func newConn(seg *shm.Segment, prod *shm.Producer, cons *shm.Consumer, local, remote Addr) *Conn {
	return &Conn{seg: seg, prod: prod, cons: cons, local: local, remote: remote,
		readDeadline: newDeadline(), writeDeadline: newDeadline(), closing: make(chan struct{})}
}

// Path reports how the connection's bytes travel.
func (c *Conn) Path() Path { return PathShm }

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

func (c *Conn) SetDeadline(t time.Time) error {
	c.readDeadline.set(t)
	c.writeDeadline.set(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error  { c.readDeadline.set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.writeDeadline.set(t); return nil }

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "ub", Source: c.local, Addr: c.remote, Err: err}
}

// blocking returns a context that ends when the deadline passes or the
// connection closes, for one blocking wait, and the deadline channel it
// watched (the deadline may be moved meanwhile; what counts is whether the
// one the wait saw passed).
func (c *Conn) blocking(dl *deadline) (context.Context, chan struct{}, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan struct{})
	ch := dl.wait()
	go func() {
		select {
		case <-ch:
		case <-c.closing:
		case <-stop:
		}
		cancel()
	}()
	return ctx, ch, func() { close(stop); cancel() }
}

// why turns the end of a wait into the error net.Conn users expect; seen is
// the deadline channel the wait watched (nil if it did not wait).
func (c *Conn) why(dl *deadline, seen chan struct{}, err error) error {
	switch {
	case isClosed(c.closing):
		return net.ErrClosed
	case seen != nil && isClosed(seen), isClosed(dl.wait()):
		return os.ErrDeadlineExceeded
	case errors.Is(err, shm.ErrPeerDead):
		return fmt.Errorf("transport: peer process died: %w", syscall.ECONNRESET)
	case errors.Is(err, context.Canceled):
		// The wait ended for a deadline that has since moved.
		return os.ErrDeadlineExceeded
	}
	return err
}

// Read reads from the current record, waiting for one if need be.
func (c *Conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if isClosed(c.closing) {
		return 0, c.opError("read", net.ErrClosed)
	}
	if isClosed(c.readDeadline.wait()) {
		return 0, c.opError("read", os.ErrDeadlineExceeded)
	}
	if len(b) == 0 {
		return 0, nil
	}
	for len(c.rec) == 0 {
		rec, err := c.cons.Next()
		var seen chan struct{}
		if err == shm.ErrRingEmpty {
			var ctx context.Context
			var done func()
			ctx, seen, done = c.blocking(c.readDeadline)
			rec, err = c.cons.NextWait(ctx)
			done()
		}
		if err != nil {
			if errors.Is(err, shm.ErrClosed) && !isClosed(c.closing) {
				return 0, io.EOF
			}
			return 0, c.opError("read", c.why(c.readDeadline, seen, err))
		}
		if len(rec) == 0 {
			c.cons.Release()
			continue
		}
		c.rec = rec
	}
	n := copy(b, c.rec)
	c.rec = c.rec[n:]
	if len(c.rec) == 0 {
		c.cons.Release()
	}
	return n, nil
}

// Write copies b into the ring in records of up to 64 KiB, waiting for room
// as the reader drains it.
func (c *Conn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if isClosed(c.closing) {
		return 0, c.opError("write", net.ErrClosed)
	}
	if c.writeClosed {
		return 0, c.opError("write", syscall.EPIPE)
	}
	n := 0
	for {
		if isClosed(c.writeDeadline.wait()) {
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
			if errors.Is(err, shm.ErrClosed) && !isClosed(c.closing) {
				err = syscall.EPIPE // the reader is gone
			}
			return n, c.opError("write", c.why(c.writeDeadline, seen, err))
		}
		copy(buf, b[n:n+chunk])
		c.prod.Commit()
		n += chunk
	}
}

// CloseWrite tells the peer no more data will come: its reads return
// io.EOF once it has read everything.
func (c *Conn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if isClosed(c.closing) {
		return c.opError("close", net.ErrClosed)
	}
	if !c.writeClosed {
		c.writeClosed = true
		c.prod.Close()
	}
	return nil
}

// Close closes both directions. Blocked reads and writes return
// net.ErrClosed.
func (c *Conn) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		close(c.closing)
	})
	if !first {
		return c.opError("close", net.ErrClosed)
	}
	// Wait for reads and writes in flight to notice.
	c.rmu.Lock()
	c.cons.Close()
	c.rmu.Unlock()
	c.wmu.Lock()
	c.prod.Close()
	c.wmu.Unlock()
	return c.seg.Close()
}
