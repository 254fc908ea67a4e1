package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/ubkit-io/ubkit/transport/internal/deadline"
)

// On the ub and tcp paths a connection is a sequence of packets, each with
// a kind, over a link that delivers them whole, reliably and in order.
const (
	pkData     byte = 1 // stream bytes
	pkEOF      byte = 2 // CloseWrite: no more stream bytes
	pkMsgFirst byte = 3 // a message's first fragment: its 8-byte length, then bytes
	pkMsgMore  byte = 4 // a message's next fragment
	pkClose    byte = 5 // Close: nothing more of either kind
)

// link carries packets for a pktConn.
type link interface {
	// mtu is the largest packet payload.
	mtu() int
	// send transmits one packet, waiting for flow-control credit until the
	// write deadline passes (os.ErrDeadlineExceeded) or interrupt is called
	// (net.ErrClosed). Concurrent calls send whole packets one after the
	// other. nil means the packet will be delivered unless the connection
	// breaks.
	send(kind byte, p []byte) error
	setWriteDeadline(t time.Time)
	// interrupt makes blocked and later sends fail, for Close.
	interrupt()
	// goodbye ends the connection gracefully: what was sent is delivered,
	// then the peer's recv returns errPeerClosed. It waits at most timeout
	// and may finish delivering in the background.
	goodbye(timeout time.Duration) error
	// recv returns the next packet (errPeerClosed after the peer's
	// goodbye); p stays valid until the next call. One goroutine calls it.
	recv() (kind byte, p []byte, err error)
	// shutdown makes recv fail for good; release frees the link once recv's
	// caller has returned.
	shutdown()
	release()
}

// pktQueue bounds the stream bytes, and separately the message bytes, that
// arrived but were not yet read: beyond it the connection stops taking
// packets from its link, which holds the peer's writes back.
const pktQueue = 4 << 20

// closeLinger bounds how long Close waits to deliver what was written.
const closeLinger = time.Second

// maxMessage is the largest message on any path.
const maxMessage = 1 << 30

// errPeerClosed ends a connection whose peer said goodbye.
var errPeerClosed = errors.New("transport: peer closed the connection")

// pktConn is a Conn on the ub or tcp path.
type pktConn struct {
	l             link
	local, remote Addr

	wmu, smu    sync.Mutex // stream writes; message sends
	writeClosed bool       // (wmu)

	mu         sync.Mutex
	in         []byte // stream bytes not yet read, from inOff
	inOff      int
	eof        bool // the peer closed its writing side
	msgs       []*Msg
	msgBytes   int
	peerClosed bool
	err        error         // why the link ended, once the queues are drained
	changed    chan struct{} // closed at the next change, made when a waiter needs one (mu)
	waiters    int           // Reads and Recvs waiting on changed (mu)
	room       chan struct{} // a reader consumed something

	rmu, rmmu  sync.Mutex
	rdl, wdl   *deadline.Deadline
	closing    chan struct{}
	closeOnce  sync.Once
	readerDone chan struct{}
}

func newPktConn(l link, local, remote Addr) *pktConn {
	c := &pktConn{l: l, local: local, remote: remote, room: make(chan struct{}, 1),
		rdl: deadline.New(), wdl: deadline.New(), closing: make(chan struct{}), readerDone: make(chan struct{})}
	go c.readLoop()
	return c
}

func (c *pktConn) LocalAddr() net.Addr  { return c.local }
func (c *pktConn) RemoteAddr() net.Addr { return c.remote }

func (c *pktConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *pktConn) SetReadDeadline(t time.Time) error { c.rdl.Set(t); return nil }

func (c *pktConn) SetWriteDeadline(t time.Time) error {
	c.wdl.Set(t)
	c.l.setWriteDeadline(t)
	return nil
}

func (c *pktConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "ub", Source: c.local, Addr: c.remote, Err: err}
}

// changedLocked wakes every waiter (mu held). A change with no waiter
// makes no channel: most packets of a busy connection find none.
func (c *pktConn) changedLocked() {
	if c.changed != nil {
		close(c.changed)
		c.changed = nil
	}
}

// changedChanLocked returns the channel the next change closes (mu held).
func (c *pktConn) changedChanLocked() chan struct{} {
	if c.changed == nil {
		c.changed = make(chan struct{})
	}
	return c.changed
}

// deliveredUnlock wakes the waiters for what the read loop just queued,
// releases mu, and lets a reader it woke run first: that reader is what
// the caller waits for, and the read loop's own next steps (looking at the
// link, going back to sleep on it) can come after.
func (c *pktConn) deliveredUnlock() {
	woke := c.waiters > 0
	c.changedLocked()
	c.mu.Unlock()
	if woke {
		runtime.Gosched()
	}
}

func (c *pktConn) consumed() {
	select {
	case c.room <- struct{}{}:
	default:
	}
}

// readLoop takes packets off the link into the stream and message queues.
func (c *pktConn) readLoop() {
	defer close(c.readerDone)
	var asm []byte // the message being assembled
	want := 0
	for {
		kind, p, err := c.l.recv()
		if err == errPeerClosed {
			c.mu.Lock()
			c.eof, c.peerClosed = true, true
			c.changedLocked()
			c.mu.Unlock()
		}
		if err != nil {
			c.fail(err)
			return
		}
		switch kind {
		case pkData:
			if !c.waitRoom(func() bool { return len(c.in)-c.inOff < pktQueue }) {
				return
			}
			if c.eof {
				c.mu.Unlock()
				c.fail(errors.New("transport: malformed packets: stream bytes after the end of the stream"))
				return
			}
			// Compact only when the read part is at least half: each byte
			// moves a bounded number of times.
			if c.inOff > 0 && c.inOff >= len(c.in)-c.inOff {
				c.in = c.in[:copy(c.in, c.in[c.inOff:])]
				c.inOff = 0
			}
			c.in = append(c.in, p...)
			c.deliveredUnlock()
		case pkEOF:
			c.mu.Lock()
			c.eof = true
			c.changedLocked()
			c.mu.Unlock()
		case pkMsgFirst:
			if asm != nil || len(p) < 8 {
				c.fail(errors.New("transport: malformed packets: bad message start"))
				return
			}
			n := binary.LittleEndian.Uint64(p)
			if n > maxMessage || uint64(len(p)-8) > n {
				c.fail(fmt.Errorf("transport: malformed packets: a message of %d bytes", n))
				return
			}
			// Grown as fragments arrive: a claimed length costs nothing.
			want = int(n)
			asm = append(make([]byte, 0, len(p)-8), p[8:]...)
		case pkMsgMore:
			if asm == nil || len(asm)+len(p) > want {
				c.fail(errors.New("transport: malformed packets: a message fragment that belongs to no message"))
				return
			}
			asm = append(asm, p...)
		default:
			c.fail(fmt.Errorf("transport: malformed packets: unknown kind %d", kind))
			return
		}
		if asm != nil && len(asm) == want {
			if !c.waitRoom(func() bool { return c.msgBytes < pktQueue }) {
				return
			}
			c.msgs = append(c.msgs, &Msg{heap: true, pc: c, data: asm})
			c.msgBytes += len(asm)
			c.deliveredUnlock()
			asm = nil
		}
	}
}

// waitRoom returns with mu held once ok() holds, or false (mu free) if the
// connection closes first.
func (c *pktConn) waitRoom(ok func() bool) bool {
	for {
		c.mu.Lock()
		if ok() {
			return true
		}
		c.mu.Unlock()
		select {
		case <-c.room:
		case <-c.closing:
			return false
		}
	}
}

// fail records why the link ended; queued bytes and messages stay readable.
func (c *pktConn) fail(err error) {
	if err != errPeerClosed && !deadline.IsClosed(c.closing) {
		if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
			// Keep the cause, but say what it means for the caller.
			err = fmt.Errorf("%w (%w)", syscall.ECONNRESET, err)
		} else if errors.Is(err, io.EOF) {
			err = fmt.Errorf("transport: connection ended without a goodbye: %w", syscall.ECONNRESET)
		}
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.changedLocked()
	c.mu.Unlock()
}

// waitUnlock is wait for a reader holding mu, which it releases; the read
// loop knows meanwhile that a reader waits.
func (c *pktConn) waitUnlock(ch chan struct{}, dl <-chan struct{}, ctx <-chan struct{}) error {
	c.waiters++
	c.mu.Unlock()
	err := c.wait(ch, dl, ctx)
	c.mu.Lock()
	c.waiters--
	c.mu.Unlock()
	return err
}

// wait blocks until the queues change, the deadline passes or the
// connection closes.
func (c *pktConn) wait(ch chan struct{}, dl <-chan struct{}, ctx <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-dl:
		return os.ErrDeadlineExceeded
	case <-ctx:
		return context.Canceled
	case <-c.closing:
		return net.ErrClosed
	}
}

func (c *pktConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if deadline.IsClosed(c.closing) {
			return 0, c.opError("read", net.ErrClosed)
		}
		dl := c.rdl.Wait()
		if deadline.IsClosed(dl) {
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			return 0, nil
		}
		c.mu.Lock()
		if c.inOff < len(c.in) {
			n := copy(b, c.in[c.inOff:])
			c.inOff += n
			if c.inOff == len(c.in) {
				c.in, c.inOff = c.in[:0], 0
			}
			c.mu.Unlock()
			c.consumed()
			return n, nil
		}
		if c.eof {
			c.mu.Unlock()
			return 0, io.EOF
		}
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return 0, c.opError("read", err)
		}
		if err := c.waitUnlock(c.changedChanLocked(), dl, nil); err != nil {
			return 0, c.opError("read", err)
		}
	}
}

func (c *pktConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for {
		if err := c.writable(); err != nil {
			return n, c.opError("write", err)
		}
		if len(b) == 0 {
			return 0, nil
		}
		chunk := min(len(b)-n, c.l.mtu())
		if err := c.l.send(pkData, b[n:n+chunk]); err != nil {
			return n, c.opError("write", c.sendError(err))
		}
		n += chunk
		if n == len(b) {
			return n, nil
		}
	}
}

// writable says why no more stream bytes can be written, if so.
func (c *pktConn) writable() error { return c.usable(true) }

// usable says why nothing more can be sent (stream: stream bytes, which
// CloseWrite ends too), if so.
func (c *pktConn) usable(stream bool) error {
	if deadline.IsClosed(c.closing) {
		return net.ErrClosed
	}
	if stream && c.writeClosed {
		return syscall.EPIPE
	}
	if deadline.IsClosed(c.wdl.Wait()) {
		return os.ErrDeadlineExceeded
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peerClosed {
		return syscall.EPIPE
	}
	return c.err
}

func (c *pktConn) sendError(err error) error {
	switch {
	case deadline.IsClosed(c.closing):
		return net.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return os.ErrDeadlineExceeded
	}
	return err
}

func (c *pktConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if deadline.IsClosed(c.closing) {
		return c.opError("close", net.ErrClosed)
	}
	if c.writeClosed {
		return nil
	}
	if err := c.l.send(pkEOF, nil); err != nil {
		return c.opError("close", c.sendError(err))
	}
	c.writeClosed = true
	return nil
}

func (c *pktConn) Loan(n int) (*Msg, error) {
	if deadline.IsClosed(c.closing) {
		return nil, c.opError("loan", net.ErrClosed)
	}
	if n < 0 || n > maxMessage {
		return nil, ErrMessageTooLarge
	}
	return &Msg{heap: true, pc: c, data: make([]byte, n)}, nil
}

func (c *pktConn) Send(m *Msg) error {
	if m == nil || m.pc != c || m.data == nil {
		return errors.New("transport: Send takes a message loaned from this connection, once")
	}
	c.smu.Lock()
	defer c.smu.Unlock()
	if err := c.sendable(); err != nil {
		return c.opError("send", err)
	}
	data := m.data
	first := min(len(data), c.l.mtu()-8)
	p := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+first), uint64(len(data)))
	p = append(p, data[:first]...)
	if err := c.l.send(pkMsgFirst, p); err != nil {
		return c.opError("send", c.sendError(err))
	}
	// Once the first fragment is out the message is committed: should a
	// later one miss the deadline, the connection cannot go on.
	for off := first; off < len(data); {
		k := min(len(data)-off, c.l.mtu())
		if err := c.l.send(pkMsgMore, data[off:off+k]); err != nil {
			err = c.sendError(err)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.fail(errors.New("transport: the write deadline passed in the middle of a message; the connection is broken"))
				c.l.shutdown()
			}
			return c.opError("send", err)
		}
		off += k
	}
	m.pc, m.data = nil, nil
	return nil
}

func (c *pktConn) sendable() error { return c.usable(false) }

func (c *pktConn) Recv(ctx context.Context) (*Msg, error) {
	c.rmmu.Lock()
	defer c.rmmu.Unlock()
	for {
		if deadline.IsClosed(c.closing) {
			return nil, c.opError("recv", net.ErrClosed)
		}
		c.mu.Lock()
		if len(c.msgs) > 0 {
			m := c.msgs[0]
			c.msgs[0] = nil
			c.msgs = c.msgs[1:]
			c.msgBytes -= len(m.data)
			c.mu.Unlock()
			c.consumed()
			return m, nil
		}
		if err := c.err; err != nil {
			c.mu.Unlock()
			if err == errPeerClosed {
				return nil, io.EOF
			}
			return nil, c.opError("recv", err)
		}
		if err := c.waitUnlock(c.changedChanLocked(), nil, ctx.Done()); err != nil {
			if err == context.Canceled {
				err = ctx.Err()
			}
			return nil, c.opError("recv", err)
		}
	}
}

func (c *pktConn) Close() error {
	first := false
	c.closeOnce.Do(func() { first = true })
	if !first {
		return c.opError("close", net.ErrClosed)
	}
	// Wake blocked calls, then say goodbye after what was written: the
	// link delivers it (in the background if the peer reads slowly).
	close(c.closing)
	c.l.interrupt()
	c.wmu.Lock()
	c.smu.Lock()
	err := c.l.goodbye(closeLinger)
	c.smu.Unlock()
	c.wmu.Unlock()
	c.l.shutdown()
	<-c.readerDone
	c.l.release()
	c.mu.Lock()
	broken := c.err != nil && c.err != errPeerClosed
	c.mu.Unlock()
	if err != nil && !broken && !c.peerClosed {
		// The peer is alive but did not take what was written in time.
		return c.opError("close", err)
	}
	return nil
}
