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
	"time"

	"github.com/ubkit-io/ubkit/shm"
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
	pkWindow   byte = 6 // the sender's windows (stream, messages): the most credit it gives
	pkCredit   byte = 7 // credit given: stream bytes, message bytes
	pkBlocked  byte = 8 // the sender waits for credit: stream bytes, message bytes it needs
)

// isFlowControl says whether packets of kind are flow control.
func isFlowControl(kind byte) bool { return kind >= pkWindow && kind <= pkBlocked }

// Credit kinds: the index of a window in the arrays below.
const (
	creditStream = iota
	creditMessages
)

// memCredit is a link that carries the connection's credit in memory,
// not in packets: the ub path's grants are one-sided adds to words in the
// peer's segment, which wake nothing there (a credit packet every
// megabyte cost a stream's sender side a wake-up each, and the ub-sim
// stream a tenth of its throughput).
type memCredit interface {
	// grant adds stream and message credit to the peer's words.
	grant(stream, messages int64) error
	// peerGrants returns what the peer added to this side's, in all.
	peerGrants() (stream, messages int64)
}

// memCreditPoll bounds how long a sender that waits for credit in memory
// sleeps between looks at it.
const memCreditPoll = 100 * time.Microsecond

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
	// sendControl is send for flow-control packets, which the write
	// deadline does not stop (a Read must return credit whatever the
	// writer's deadline) and which may overtake packets queued by send.
	sendControl(kind byte, p []byte) error
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
	in         streamBuf // stream bytes not yet read
	eof        bool      // the peer closed its writing side
	msgs       []*Msg
	peerClosed bool
	err        error         // why the link ended, once the queues are drained
	changed    chan struct{} // closed at the next change, made when a waiter needs one (mu)
	waiters    int           // Reads and Recvs waiting on changed (mu)

	// Flow control (mu; see credit.go): the credit this side gives, of
	// each kind, and the credit it was given.
	flow       *flowConfig
	recvWin    [2]recvWindow
	sendWin    [2]sendWindow
	asks       [2]int64      // credit a blocked sender waits for, to tell the peer
	peerWin    bool          // the peer's windows arrived
	credited   chan struct{} // closed at the next grant (or end), made when a sender waits
	kick       chan struct{} // the credit loop has work
	creditDone chan struct{}

	onClose func() // after Close, if set before the connection is shared

	rmu, rmmu  sync.Mutex
	rdl, wdl   *deadline.Deadline
	closing    chan struct{}
	closeOnce  sync.Once
	readerDone chan struct{}
}

// newPktConn starts a connection over l; flow is its endpoint's flow
// control (nil: the defaults, with a budget of its own).
func newPktConn(l link, local, remote Addr, flow *flowConfig) *pktConn {
	if flow == nil {
		flow = defaultFlow()
	}
	c := &pktConn{l: l, local: local, remote: remote, flow: flow,
		recvWin: [2]recvWindow{newRecvWindow(flow.streamWindow), newRecvWindow(flow.messageWindow)},
		sendWin: [2]sendWindow{newSendWindow(), newSendWindow()},
		kick:    make(chan struct{}, 1), creditDone: make(chan struct{}),
		rdl: deadline.New(), wdl: deadline.New(), closing: make(chan struct{}), readerDone: make(chan struct{})}
	go c.readLoop()
	go c.creditLoop()
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

// grantsLocked returns the credit due to the peer now (mu held).
func (c *pktConn) grantsLocked() (grants [2]int64) {
	for k := range c.recvWin {
		if w := &c.recvWin[k]; w.due() {
			grants[k] = w.grant(c.flow.budget, c.remote.Node, c.kick)
		}
	}
	c.in.fit(int(c.recvWin[creditStream].size))
	return grants
}

// consumedUnlock notes n bytes (credit) of kind the application took, and
// releases mu. A grant that is due goes to the peer at once if the link
// carries credit in memory (a one-sided add, which does not wait for the
// link), else through the credit loop.
func (c *pktConn) consumedUnlock(kind int, n int64) {
	if !c.recvWin[kind].consume(n) {
		c.mu.Unlock()
		return
	}
	mc, ok := c.l.(memCredit)
	if !ok {
		c.mu.Unlock()
		c.kickCredits()
		return
	}
	grants := c.grantsLocked()
	c.mu.Unlock()
	if grants != [2]int64{} {
		mc.grant(grants[0], grants[1]) // on failure the link ended: the read loop says why
	}
}

// kickCredits wakes the credit loop.
func (c *pktConn) kickCredits() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// creditedLocked wakes the senders waiting for credit (mu held).
func (c *pktConn) creditedLocked() {
	if c.credited != nil {
		close(c.credited)
		c.credited = nil
	}
}

// creditLoop tells the peer this side's windows, then gives it credit as
// the application consumes what arrived, and tells it when a sender of
// this side waits for credit. It is the only sender of flow-control
// packets, so a Read or Recv never waits for the link.
func (c *pktConn) creditLoop() {
	defer close(c.creditDone)
	defer c.flow.budget.forget(c.kick)
	var p [16]byte
	binary.LittleEndian.PutUint64(p[:], uint64(c.recvWin[creditStream].max))
	binary.LittleEndian.PutUint64(p[8:], uint64(c.recvWin[creditMessages].max))
	if c.l.sendControl(pkWindow, p[:]) != nil {
		return
	}
	for {
		select {
		case <-c.kick:
		case <-c.closing:
			return
		}
		var asks [2]int64
		c.mu.Lock()
		grants := c.grantsLocked()
		asks, c.asks = c.asks, [2]int64{}
		c.mu.Unlock()
		if mc, ok := c.l.(memCredit); ok && grants != [2]int64{} {
			if mc.grant(grants[0], grants[1]) != nil {
				return // the link ended: the read loop says why
			}
			grants = [2]int64{}
		}
		for _, pk := range []struct {
			kind byte
			n    [2]int64
		}{{pkCredit, grants}, {pkBlocked, asks}} {
			if pk.n == [2]int64{} {
				continue
			}
			binary.LittleEndian.PutUint64(p[:], uint64(pk.n[0]))
			binary.LittleEndian.PutUint64(p[8:], uint64(pk.n[1]))
			if c.l.sendControl(pk.kind, p[:]) != nil {
				return // the link ended: the read loop says why
			}
		}
	}
}

// violation ends the connection for a packet a correct peer never sends:
// the link is shut down at once, so nothing more of the peer's is read.
func (c *pktConn) violation(err error) {
	c.fail(err)
	c.l.shutdown()
}

// flowPacket handles the peer's flow-control packets; an error means it
// broke the protocol.
func (c *pktConn) flowPacket(kind byte, p []byte) error {
	if len(p) != 16 {
		return fmt.Errorf("transport: malformed packets: a flow-control packet of %d bytes", len(p))
	}
	n := [2]int64{int64(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch kind {
	case pkWindow:
		if c.peerWin || n[creditStream] < initialCredit || n[creditMessages] < initialCredit {
			return fmt.Errorf("transport: malformed packets: windows of %d and %d bytes", n[0], n[1])
		}
		c.peerWin = true
		for k := range c.sendWin {
			c.sendWin[k].max = n[k]
		}
	case pkCredit:
		for k := range c.sendWin {
			if !c.sendWin[k].add(n[k]) {
				return fmt.Errorf("transport: malformed packets: a grant of %d bytes: %w", n[k], ErrFlowControl)
			}
		}
	case pkBlocked:
		kick := false
		for k := range c.recvWin {
			if w := &c.recvWin[k]; n[k] > 0 {
				// A stream writer waits for any credit (takeCredit's need
				// of 1): a claim of more is held to that.
				if k == creditStream {
					n[k] = 1
				}
				w.need = min(n[k], w.max)
				kick = kick || w.due()
			}
		}
		if kick {
			c.kickCredits()
		}
		return nil
	}
	c.creditedLocked()
	return nil
}

// streamBuf holds the stream bytes not yet read: a ring that grows to at
// most the window as it is now (the unread bytes never exceed it), and is
// dropped once empty if the window shrank below it (fit). The unread bytes
// move to its start whenever they are no more than the read part before
// them (each byte read pays for at most one moved), which keeps a reader
// that keeps up at the start of the ring, in the cache, as a buffer that
// empties does.
type streamBuf struct {
	b    []byte
	head int // the first unread byte
	n    int // unread bytes
}

// push appends p; limit is the most the ring may grow to.
func (r *streamBuf) push(p []byte, limit int) {
	if len(p) == 0 {
		return
	}
	if r.head > 0 && r.n <= r.head && r.head+r.n <= len(r.b) {
		copy(r.b, r.b[r.head:r.head+r.n])
		r.head = 0
	}
	if r.n+len(p) > len(r.b) {
		grown := make([]byte, max(min(2*len(r.b), limit), r.n+len(p)))
		r.peek(grown)
		r.b, r.head = grown, 0
	}
	tail := (r.head + r.n) % len(r.b)
	k := copy(r.b[tail:], p)
	copy(r.b, p[k:])
	r.n += len(p)
}

// fit drops the ring if it is empty and larger than limit (the window
// now), so that a window given back to the endpoint's budget frees its
// memory too.
func (r *streamBuf) fit(limit int) {
	if r.n == 0 && len(r.b) > limit {
		r.b, r.head = nil, 0
	}
}

// peek copies the first unread bytes into p, and says how many.
func (r *streamBuf) peek(p []byte) int {
	k := copy(p, r.b[r.head:min(r.head+r.n, len(r.b))])
	if k < len(p) && k < r.n {
		k += copy(p[k:], r.b[:r.n-k])
	}
	return k
}

// read takes up to len(p) unread bytes.
func (r *streamBuf) read(p []byte) int {
	k := r.peek(p)
	r.n -= k
	r.head = (r.head + k) % len(r.b)
	if r.n == 0 {
		r.head = 0
	}
	return k
}

// readLoop takes packets off the link into the stream and message queues.
// It never waits for the application: the peer sends only what it has
// credit for, and a peer that sends more is cut off (violation).
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
			c.creditedLocked()
			c.mu.Unlock()
		}
		if err != nil {
			c.fail(err)
			return
		}
		if err := c.packet(kind, p, &asm, &want); err != nil {
			c.violation(err)
			return
		}
	}
}

// packet takes one packet from the peer; an error means the peer broke the
// protocol. asm and want are the message being assembled.
func (c *pktConn) packet(kind byte, p []byte, asm *[]byte, want *int) error {
	switch kind {
	case pkData:
		c.mu.Lock()
		if c.eof {
			c.mu.Unlock()
			return errors.New("transport: malformed packets: stream bytes after the end of the stream")
		}
		if w := &c.recvWin[creditStream]; !w.admit(int64(len(p))) {
			c.mu.Unlock()
			return fmt.Errorf("transport: %d stream bytes with %d of credit left: %w", len(p), w.granted-w.got, ErrFlowControl)
		}
		c.in.push(p, int(c.recvWin[creditStream].size))
		c.deliveredUnlock()
		return nil
	case pkEOF:
		c.mu.Lock()
		c.eof = true
		c.changedLocked()
		c.mu.Unlock()
		return nil
	case pkMsgFirst:
		if *asm != nil || len(p) < 8 {
			return errors.New("transport: malformed packets: bad message start")
		}
		n := binary.LittleEndian.Uint64(p)
		if n > maxMessage || uint64(len(p)-8) > n {
			return fmt.Errorf("transport: malformed packets: a message of %d bytes", n)
		}
		// The whole message is charged now, before its buffer is made.
		c.mu.Lock()
		w := &c.recvWin[creditMessages]
		if !w.admit(int64(n) + msgOverhead) {
			left := w.granted - w.got
			c.mu.Unlock()
			return fmt.Errorf("transport: a message of %d bytes with %d of credit left: %w", n, left, ErrFlowControl)
		}
		if uint64(len(p)-8) == n {
			// Whole in one packet: queued under the same lock.
			c.msgs = append(c.msgs, &Msg{heap: true, pc: c, data: append(make([]byte, 0, n), p[8:]...)})
			c.deliveredUnlock()
			return nil
		}
		c.mu.Unlock()
		*want = int(n)
		*asm = append(make([]byte, 0, n), p[8:]...)
	case pkMsgMore:
		if *asm == nil || len(*asm)+len(p) > *want {
			return errors.New("transport: malformed packets: a message fragment that belongs to no message")
		}
		*asm = append(*asm, p...)
	case pkWindow, pkCredit, pkBlocked:
		return c.flowPacket(kind, p)
	default:
		return fmt.Errorf("transport: malformed packets: unknown kind %d", kind)
	}
	if len(*asm) == *want {
		c.mu.Lock()
		c.msgs = append(c.msgs, &Msg{heap: true, pc: c, data: *asm})
		c.deliveredUnlock()
		*asm = nil
	}
	return nil
}

// fail records why the link ended; queued bytes and messages stay readable.
func (c *pktConn) fail(err error) {
	if err != errPeerClosed && !deadline.IsClosed(c.closing) {
		if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, shm.ErrConnReset) && !errors.Is(err, io.EOF) {
			// Keep the cause, but say what it means for the caller.
			err = fmt.Errorf("%w (%w)", shm.ErrConnReset, err)
		} else if errors.Is(err, io.EOF) {
			err = fmt.Errorf("transport: connection ended without a goodbye: %w", shm.ErrConnReset)
		}
	}
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.changedLocked()
	c.creditedLocked()
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
		if c.in.n > 0 {
			n := c.in.read(b)
			c.in.fit(int(c.recvWin[creditStream].size))
			c.consumedUnlock(creditStream, int64(n))
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
		chunk, err := c.takeCredit(creditStream, 1, int64(min(len(b)-n, c.l.mtu())))
		if err != nil {
			return n, c.opError("write", err)
		}
		if err := c.l.send(pkData, b[n:n+int(chunk)]); err != nil {
			c.giveBack(creditStream, chunk)
			return n, c.opError("write", c.sendError(err))
		}
		n += int(chunk)
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
		return shm.ErrBrokenPipe
	}
	if deadline.IsClosed(c.wdl.Wait()) {
		return os.ErrDeadlineExceeded
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peerClosed {
		return shm.ErrBrokenPipe
	}
	return c.err
}

// takeCredit waits until the peer's credit of kind covers need, then
// takes up to want of it. It honours the write deadline and Close, and
// fails once the connection ends. While it waits the peer is told (once
// per grant), so that it grows its window or gives back what is pending.
func (c *pktConn) takeCredit(kind int, need, want int64) (int64, error) {
	mc, _ := c.l.(memCredit)
	poll := time.Duration(0)
	for {
		c.mu.Lock()
		w := &c.sendWin[kind]
		if mc != nil {
			s, m := mc.peerGrants()
			c.sendWin[creditStream].inMemory(s)
			c.sendWin[creditMessages].inMemory(m)
			// Nothing wakes a sender when credit lands in memory: it
			// looks again, more and more slowly.
			poll = min(max(2*poll, 10*time.Microsecond), memCreditPoll)
		}
		if w.max > 0 && need > w.max {
			c.mu.Unlock()
			return 0, tooLarge(need, w.max)
		}
		if avail := w.avail(); avail >= need {
			k := min(avail, want)
			w.sent += k
			c.mu.Unlock()
			return k, nil
		}
		if err := c.endedLocked(); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if w.asked != w.total() {
			w.asked = w.total()
			c.asks[kind] = need
			c.kickCredits()
		}
		if err := c.waitCreditUnlock(poll); err != nil {
			return 0, err
		}
	}
}

// tooLarge is the error for a message that costs more credit than the
// peer's message window.
func tooLarge(cost, window int64) error {
	return fmt.Errorf("transport: a message of %d bytes is more than the peer takes on this path (%d bytes, its Config.MessageWindow): %w",
		cost-msgOverhead, window-msgOverhead, ErrMessageTooLarge)
}

// endedLocked says why nothing more can be sent, if the peer closed or
// the link ended (mu held).
func (c *pktConn) endedLocked() error {
	if c.peerClosed {
		return shm.ErrBrokenPipe
	}
	return c.err
}

// waitCreditUnlock waits, mu released, for the peer's next flow-control
// packet or the connection's end, honouring the write deadline and Close,
// or for poll if it is not zero.
func (c *pktConn) waitCreditUnlock(poll time.Duration) error {
	if c.credited == nil {
		c.credited = make(chan struct{})
	}
	ch := c.credited
	c.mu.Unlock()
	var look <-chan time.Time
	if poll > 0 {
		t := time.NewTimer(poll)
		defer t.Stop()
		look = t.C
	}
	select {
	case <-ch:
		return nil
	case <-look:
		return nil
	case <-c.wdl.Wait():
		return os.ErrDeadlineExceeded
	case <-c.closing:
		return net.ErrClosed
	}
}

// giveBack returns credit taken for a packet that was not sent.
func (c *pktConn) giveBack(kind int, n int64) {
	c.mu.Lock()
	c.sendWin[kind].sent -= n
	c.mu.Unlock()
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
	if cost := int64(n) + msgOverhead; cost > initialCredit {
		// Larger than what any peer takes: the peer's window says
		// whether it takes this one, before the buffer is made.
		most, err := c.peerMessageWindow()
		if err != nil {
			return nil, c.opError("loan", err)
		}
		if cost > most {
			return nil, tooLarge(cost, most)
		}
	}
	return &Msg{heap: true, pc: c, data: make([]byte, n)}, nil
}

// peerMessageWindow waits for the peer's windows (its first packet) and
// returns its message window, honouring the write deadline and Close.
func (c *pktConn) peerMessageWindow() (int64, error) {
	for {
		c.mu.Lock()
		if c.peerWin {
			most := c.sendWin[creditMessages].max
			c.mu.Unlock()
			return most, nil
		}
		if err := c.endedLocked(); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		if err := c.waitCreditUnlock(0); err != nil {
			return 0, err
		}
	}
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
	// The whole message's credit first: the peer then has room for all of
	// it, and the fragments never wait for the peer's application.
	cost := int64(len(data)) + msgOverhead
	if _, err := c.takeCredit(creditMessages, cost, cost); err != nil {
		return c.opError("send", err)
	}
	first := min(len(data), c.l.mtu()-8)
	p := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+first), uint64(len(data)))
	p = append(p, data[:first]...)
	if err := c.l.send(pkMsgFirst, p); err != nil {
		c.giveBack(creditMessages, cost)
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
			c.consumedUnlock(creditMessages, int64(len(m.data))+msgOverhead)
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
	// Whether the link broke, read before the shutdown, after which the
	// reader always ends with an error (net.ErrClosed).
	c.mu.Lock()
	broken := c.err != nil && c.err != errPeerClosed
	c.mu.Unlock()
	c.l.shutdown()
	<-c.readerDone
	<-c.creditDone
	c.l.release()
	// What was not read is dropped, and the windows' memory goes back to
	// the endpoint.
	c.mu.Lock()
	c.in, c.msgs = streamBuf{}, nil
	for k := range c.recvWin {
		c.recvWin[k].close(c.flow.budget, c.remote.Node)
	}
	c.mu.Unlock()
	if c.onClose != nil {
		c.onClose()
	}
	if err != nil && !broken && !c.peerClosed {
		// The peer is alive but did not take what was written in time.
		return c.opError("close", err)
	}
	return nil
}
