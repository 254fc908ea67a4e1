package mux

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/transport/internal/deadline"
)

// maxData is the largest data frame a stream sends.
const maxData = 64 << 10

// Stream is one multiplexed stream; it is a net.Conn.
type Stream struct {
	s  *Session
	id uint32

	mu         sync.Mutex
	buf        bytes.Buffer // received, not yet read
	recvCredit uint32       // bytes the peer may still send
	consumed   uint32       // read since the last window update
	sendCredit uint32
	remoteFIN  bool
	localFIN   bool
	reset      bool
	closed     bool
	readable   chan struct{} // signalled on data, FIN, reset
	writable   chan struct{} // signalled on credit, reset
	readDL     *deadline.Deadline
	writeDL    *deadline.Deadline
	wmu        sync.Mutex
}

var _ net.Conn = (*Stream)(nil)

func newStream(s *Session, id uint32) *Stream {
	return &Stream{s: s, id: id, recvCredit: initialWindow, sendCredit: initialWindow,
		readable: make(chan struct{}, 1), writable: make(chan struct{}, 1),
		readDL: deadline.New(), writeDL: deadline.New()}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (st *Stream) wake() { signal(st.readable); signal(st.writable) }

// ID returns the stream's id.
func (st *Stream) ID() uint32 { return st.id }

func (st *Stream) LocalAddr() net.Addr  { return st.s.conn.LocalAddr() }
func (st *Stream) RemoteAddr() net.Addr { return st.s.conn.RemoteAddr() }

func (st *Stream) SetDeadline(t time.Time) error {
	st.readDL.Set(t)
	st.writeDL.Set(t)
	return nil
}
func (st *Stream) SetReadDeadline(t time.Time) error  { st.readDL.Set(t); return nil }
func (st *Stream) SetWriteDeadline(t time.Time) error { st.writeDL.Set(t); return nil }

func (st *Stream) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "mux", Addr: st.RemoteAddr(), Err: err}
}

// admit checks that n more bytes fit in the credit the peer was given.
func (st *Stream) admit(n uint32) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if n > st.recvCredit {
		return fmt.Errorf("%w: stream %d sent %d bytes with %d credit", ErrProtocol, st.id, n, st.recvCredit)
	}
	return nil
}

// receive takes a data frame's body; more than the credit given is a
// protocol error.
func (st *Stream) receive(body []byte) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if uint32(len(body)) > st.recvCredit {
		return fmt.Errorf("%w: stream %d sent %d bytes with %d credit", ErrProtocol, st.id, len(body), st.recvCredit)
	}
	st.recvCredit -= uint32(len(body))
	if st.closed {
		// Closed here, still open there: drop the data but give the credit
		// back, so the peer's writer is never stuck waiting for it.
		st.recvCredit += uint32(len(body))
		st.s.returnCredit(st.id, uint32(len(body)))
		st.s.consumedData(uint32(len(body)))
		return nil
	}
	st.buf.Write(body)
	signal(st.readable)
	return nil
}

func (st *Stream) credit(n uint32) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sendCredit+n < st.sendCredit {
		return fmt.Errorf("%w: stream %d credit overflows", ErrProtocol, st.id)
	}
	st.sendCredit += n
	signal(st.writable)
	return nil
}

func (st *Stream) remoteClose() {
	st.mu.Lock()
	st.remoteFIN = true
	done := st.localFIN
	st.mu.Unlock()
	signal(st.readable)
	if done {
		st.s.forget(st.id)
	}
}

func (st *Stream) resetByPeer() {
	st.mu.Lock()
	st.reset = true
	st.mu.Unlock()
	st.wake()
	st.s.forget(st.id)
}

// sessionErr is the session's error, if it ended.
func (st *Stream) sessionErr() error {
	select {
	case <-st.s.done:
		return st.s.Err()
	default:
		return nil
	}
}

// Read reads received data, waiting for some.
func (st *Stream) Read(b []byte) (int, error) {
	for {
		st.mu.Lock()
		switch {
		case st.closed:
			st.mu.Unlock()
			return 0, st.opError("read", net.ErrClosed)
		case deadline.IsClosed(st.readDL.Wait()):
			st.mu.Unlock()
			return 0, st.opError("read", os.ErrDeadlineExceeded)
		case st.buf.Len() > 0:
			n, _ := st.buf.Read(b)
			st.consumed += uint32(n)
			var update uint32
			if st.consumed >= initialWindow/4 {
				update, st.consumed = st.consumed, 0
				st.recvCredit += update
			}
			st.mu.Unlock()
			st.s.returnCredit(st.id, update)
			st.s.consumedData(uint32(n))
			return n, nil
		case st.remoteFIN:
			st.mu.Unlock()
			return 0, io.EOF
		case st.reset:
			st.mu.Unlock()
			return 0, st.opError("read", ErrStreamReset)
		case len(b) == 0:
			st.mu.Unlock()
			return 0, nil
		}
		st.mu.Unlock()
		if err := st.sessionErr(); err != nil {
			return 0, st.opError("read", err)
		}
		select {
		case <-st.readable:
		case <-st.readDL.Wait():
		case <-st.s.done:
		}
	}
}

// Write sends b within the stream's credit, waiting for more as the peer
// reads.
func (st *Stream) Write(b []byte) (int, error) {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	n := 0
	for {
		st.mu.Lock()
		switch {
		case st.closed:
			st.mu.Unlock()
			return n, st.opError("write", net.ErrClosed)
		case st.localFIN:
			st.mu.Unlock()
			return n, st.opError("write", fmt.Errorf("mux: write after CloseWrite"))
		case st.reset:
			st.mu.Unlock()
			return n, st.opError("write", ErrStreamReset)
		case deadline.IsClosed(st.writeDL.Wait()):
			st.mu.Unlock()
			return n, st.opError("write", os.ErrDeadlineExceeded)
		}
		if n == len(b) {
			st.mu.Unlock()
			return n, nil
		}
		if st.sendCredit == 0 {
			st.mu.Unlock()
			if err := st.sessionErr(); err != nil {
				return n, st.opError("write", err)
			}
			select {
			case <-st.writable:
			case <-st.writeDL.Wait():
			case <-st.s.done:
			}
			continue
		}
		want := min(len(b)-n, int(st.sendCredit), maxData)
		st.mu.Unlock()
		k, more := st.s.takeSend(uint32(want))
		if k == 0 {
			// The session's window is full: streams nobody reads hold it.
			if err := st.sessionErr(); err != nil {
				return n, st.opError("write", err)
			}
			select {
			case <-more:
			case <-st.writable:
			case <-st.writeDL.Wait():
			case <-st.s.done:
			}
			continue
		}
		st.mu.Lock()
		st.sendCredit -= k
		st.mu.Unlock()
		if err := st.s.writeData(st.id, 0, b[n:n+int(k)]); err != nil {
			return n, st.opError("write", err)
		}
		n += int(k)
	}
}

// CloseWrite tells the peer no more data comes: its reads return io.EOF.
func (st *Stream) CloseWrite() error {
	st.wmu.Lock()
	defer st.wmu.Unlock()
	st.mu.Lock()
	if st.localFIN || st.closed {
		st.mu.Unlock()
		return nil
	}
	st.localFIN = true
	done := st.remoteFIN
	st.mu.Unlock()
	err := st.s.writeData(st.id, flagFIN, nil)
	if done {
		st.s.forget(st.id)
	}
	return err
}

// Close closes the stream: the peer reads io.EOF after what was sent; data
// that arrives afterwards is dropped.
func (st *Stream) Close() error {
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil
	}
	st.closed = true
	fin := !st.localFIN && !st.reset
	st.localFIN = true
	// What was received and not read is dropped; its credit goes back.
	unread := uint32(st.buf.Len())
	st.buf.Reset()
	st.recvCredit += unread
	// Until the peer's FIN the stream stays known, so its data keeps
	// being dropped with credit returned (its writer must not hang).
	forget := st.remoteFIN || st.reset
	st.mu.Unlock()
	st.wake()
	st.s.returnCredit(st.id, unread)
	st.s.consumedData(unread)
	if fin {
		// After any Write in flight (woken above, it returns), on the data
		// path, so the FIN never overtakes data.
		st.wmu.Lock()
		st.s.writeData(st.id, flagFIN, nil)
		st.wmu.Unlock()
	}
	if forget {
		st.s.forget(st.id)
	}
	return nil
}
