package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport/internal/deadline"
)

// Messages travel beside the byte stream: a buffer is loaned from a pool in
// the connection's shared segment, filled in place, and handed to the peer
// by a 24-byte record (its handle and length) on a message ring, so a
// message of any size up to the largest class (1 GiB) moves without a copy.
// Memory of the pool is committed only as buffers are touched.

const (
	msgRingCapacity = 64 << 10
	msgRecord       = shm.HandleSize + 8
)

var messagePool = shm.PoolConfig{Classes: []shm.PoolClass{
	{Size: 64 << 10, Count: 32},
	{Size: 1 << 20, Count: 16},
	{Size: 16 << 20, Count: 4},
	{Size: 1 << 30, Count: 1},
}}

// messageLayout places the two message rings and the pool after base.
func messageLayout(base int) (ringA, ringB, pool, end int) {
	align := func(n int) int { return (n + 4095) &^ 4095 }
	ringA = align(base)
	ringB = ringA + align(shm.SPSCSize(msgRingCapacity))
	pool = ringB + align(shm.SPSCSize(msgRingCapacity))
	size, _ := shm.PoolSize(messagePool)
	return ringA, ringB, pool, pool + size
}

// messages is one side's view: it sends on one ring and receives on the
// other, with buffers from the shared pool.
type messages struct {
	prod *shm.Producer
	cons *shm.Consumer
	pool *shm.Pool
}

// createMessages lays the rings and pool out in a new segment (the dialer).
func createMessages(seg *shm.Segment, base int) error {
	a, b, p, _ := messageLayout(base)
	if _, err := shm.CreateSPSC(seg, a, msgRingCapacity); err != nil {
		return err
	}
	if _, err := shm.CreateSPSC(seg, b, msgRingCapacity); err != nil {
		return err
	}
	_, err := shm.CreatePool(seg, p, messagePool)
	return err
}

// attachMessages opens the rings and pool; the dialer sends on ring a.
func attachMessages(seg *shm.Segment, base int, dialer bool) (*messages, error) {
	a, b, p, _ := messageLayout(base)
	ra, err := shm.OpenSPSC(seg, a)
	if err != nil {
		return nil, err
	}
	rb, err := shm.OpenSPSC(seg, b)
	if err != nil {
		return nil, err
	}
	pool, err := shm.OpenPool(seg, p)
	if err != nil {
		return nil, err
	}
	out, in := ra, rb
	if !dialer {
		out, in = rb, ra
	}
	prod, err := out.Producer(shm.Wait{})
	if err != nil {
		return nil, err
	}
	cons, err := in.Consumer(shm.Wait{})
	if err != nil {
		prod.Close()
		return nil, err
	}
	return &messages{prod: prod, cons: cons, pool: pool}, nil
}

func (m *messages) close() {
	m.prod.Close()
	m.cons.Close()
	m.pool.Close()
}

// Msg is a message buffer: loaned to fill and Send, or received to read
// and Release. On the shm path it lies in shared memory.
type Msg struct {
	c   *shmConn // shm path: the owner until sent or released
	buf shm.Buffer
	n   int
	// Other paths: ordinary memory.
	heap bool
	pc   *pktConn
	data []byte
}

// Bytes returns the message's bytes.
func (m *Msg) Bytes() []byte {
	if m.heap {
		return m.data
	}
	return m.buf.Bytes()[:m.n]
}

// Release gives a received (or unsent loaned) buffer back. Its bytes stay
// valid until then, even after the connection closes.
func (m *Msg) Release() error {
	if m.heap {
		if m.data == nil {
			return errors.New("transport: message already released or sent")
		}
		m.pc, m.data = nil, nil
		return nil
	}
	c := m.c
	if c == nil {
		return errors.New("transport: message already released or sent")
	}
	m.c = nil
	err := m.buf.Return()
	c.msgDone()
	return err
}

// ErrMessageTooLarge is returned by Loan (and Send) for a message larger
// than the path carries: the largest buffer (1 GiB) on the shm path, the
// peer's Config.MessageWindow on the ub and tcp paths.
var ErrMessageTooLarge = errors.New("transport: message too large")

// ErrPoolExhausted is returned by TryLoan when every buffer that fits is
// loaned (the peer has not released what it received); Loan waits instead.
var ErrPoolExhausted = shm.ErrPoolExhausted

// Loan returns a buffer of n bytes to fill and Send, without a copy, or
// fails at once with ErrPoolExhausted.
func (c *shmConn) Loan(n int) (*Msg, error) { return c.loan(context.Background(), n, false) }

// loanWait is Loan that waits for a buffer until ctx ends, the write
// deadline passes or the connection closes.
func (c *shmConn) loanWait(ctx context.Context, n int) (*Msg, error) { return c.loan(ctx, n, true) }

// loan loans a buffer, waiting for one if wait. The loan counts as held
// while it waits, so that Close leaves the memory mapped until it is done
// with the pool.
func (c *shmConn) loan(ctx context.Context, n int, wait bool) (*Msg, error) {
	c.mmu.Lock()
	if deadline.IsClosed(c.closing) {
		c.mmu.Unlock()
		return nil, c.opError("loan", net.ErrClosed)
	}
	c.live++
	c.mmu.Unlock()
	b, err := c.msgs.pool.Loan(n)
	if wait && errors.Is(err, shm.ErrPoolExhausted) {
		wctx, cancel := context.WithCancel(ctx)
		dl := c.writeDeadline.Wait()
		go func() {
			select {
			case <-dl:
			case <-c.closing:
			case <-c.brokenCh:
			case <-wctx.Done():
			}
			cancel()
		}()
		b, err = c.msgs.pool.LoanWait(wctx, n, shm.Wait{})
		cancel()
		if err != nil && ctx.Err() != nil && !deadline.IsClosed(c.closing) {
			err = ctx.Err()
		} else if err != nil {
			err = c.why(c.writeDeadline, dl, err)
		}
	}
	if err == nil && deadline.IsClosed(c.closing) {
		b.Return()
		err = net.ErrClosed
	}
	if err != nil {
		c.msgDone()
		switch {
		case errors.Is(err, shm.ErrTooLarge):
			return nil, ErrMessageTooLarge
		case errors.Is(err, shm.ErrPoolExhausted):
			err = fmt.Errorf("transport: loan of %d bytes: %w (the peer has not released the messages it received; Loan waits for one)", n, err)
		case errors.Is(err, shm.ErrCorrupt):
			err = fmt.Errorf("transport: loan of %d bytes: %w", n, err)
		}
		return nil, c.opError("loan", err)
	}
	return &Msg{c: c, buf: b, n: n}, nil
}

// Send hands a loaned buffer to the peer: only its handle moves. m must not
// be used afterwards.
func (c *shmConn) Send(m *Msg) error {
	if m.c != c {
		return errors.New("transport: Send takes a message loaned from this connection, once")
	}
	c.mmu.Lock()
	defer c.mmu.Unlock()
	if deadline.IsClosed(c.closing) {
		return c.opError("send", net.ErrClosed)
	}
	var rec [msgRecord]byte
	m.buf.Handle().AppendBinary(rec[:0])
	binary.LittleEndian.PutUint64(rec[shm.HandleSize:], uint64(m.n))
	ctx, seen, done := c.blocking(c.writeDeadline)
	err := c.msgs.prod.Send(ctx, rec[:])
	done()
	if err != nil {
		return c.opError("send", c.why(c.writeDeadline, seen, err))
	}
	m.c = nil
	c.live--
	return nil
}

// Recv returns the next message, waiting until one arrives, ctx ends or the
// connection closes. Release it when done.
func (c *shmConn) Recv(ctx context.Context) (*Msg, error) {
	c.rmmu.Lock()
	defer c.rmmu.Unlock()
	if deadline.IsClosed(c.closing) {
		return nil, c.opError("recv", net.ErrClosed)
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-c.closing:
			cancel()
		case <-c.brokenCh:
			cancel()
		case <-stop:
		}
	}()
	rec, err := c.msgs.cons.NextWait(cctx)
	close(stop)
	cancel()
	if err != nil {
		if deadline.IsClosed(c.closing) {
			err = net.ErrClosed
		} else if errors.Is(err, shm.ErrPeerDead) {
			err = fmt.Errorf("transport: peer process died: %w", shm.ErrConnReset)
		}
		return nil, c.opError("recv", err)
	}
	var h shm.Handle
	herr := h.UnmarshalBinary(rec[:min(len(rec), shm.HandleSize)])
	var n uint64
	if len(rec) == msgRecord {
		n = binary.LittleEndian.Uint64(rec[shm.HandleSize:])
	}
	c.msgs.cons.Release()
	if herr != nil || len(rec) != msgRecord {
		return nil, c.opError("recv", fmt.Errorf("transport: malformed message record: %v", herr))
	}
	b, err := c.msgs.pool.Adopt(h)
	if err != nil {
		return nil, c.opError("recv", fmt.Errorf("transport: message buffer: %w", err))
	}
	if n > uint64(len(b.Bytes())) {
		b.Return()
		return nil, c.opError("recv", fmt.Errorf("transport: message of %d bytes in a %d-byte buffer", n, len(b.Bytes())))
	}
	c.mmu.Lock()
	c.live++
	c.mmu.Unlock()
	return &Msg{c: c, buf: b, n: int(n)}, nil
}

// msgDone notes a released message; the last one after Close unmaps.
func (c *shmConn) msgDone() {
	c.mmu.Lock()
	c.live--
	last := c.live == 0 && c.unmapLater
	c.mmu.Unlock()
	if last {
		c.seg.Close()
	}
}
