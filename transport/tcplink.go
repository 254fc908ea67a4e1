package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/transport/internal/deadline"
)

// tcpMTU is the largest packet on the tcp path; tcpQueue how many packets
// wait for the socket before send blocks.
const (
	tcpMTU   = 64 << 10
	tcpQueue = 64
	// tcpControlQueue is how many flow-control packets wait: one sender
	// (the credit loop) sends them one at a time.
	tcpControlQueue = 4
)

// tcpLingerMax bounds how long a closed connection keeps delivering what
// was written to a peer that reads slowly, in the background.
const tcpLingerMax = 30 * time.Second

var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 5+tcpMTU); return &b }}

// tcpLink carries packets over a TCP connection, each as a 5-byte header
// (kind, little-endian length) and its payload. A writer goroutine owns
// the socket's sending side: send queues whole packets (a deadline or an
// interrupt only ever stops a packet from being queued, never cuts one),
// and Close's goodbye lets the queue drain in the background, as the
// kernel lingers for a closed socket.
type tcpLink struct {
	c net.Conn

	q           chan *[]byte
	ctl         chan *[]byte  // flow-control packets, written before q's
	queued      atomic.Int64  // packets queued, not yet written
	done        chan struct{} // the writer exited
	stop        chan struct{} // the writer must exit now
	peerBye     chan struct{} // the peer's goodbye arrived: it reads no more
	peerByeOnce sync.Once
	mu          sync.Mutex
	werr        error     // why the writer stopped (mu)
	bye         bool      // goodbye closed the queue
	byeBy       time.Time // when Close stops waiting for the goodbye's delivery

	wdl      *deadline.Deadline
	intr     chan struct{}
	intrOnce sync.Once
	shutOnce sync.Once

	r   *bufio.Reader
	buf []byte
}

func newTCPLink(c net.Conn) *tcpLink {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	l := &tcpLink{c: c, q: make(chan *[]byte, tcpQueue), ctl: make(chan *[]byte, tcpControlQueue), done: make(chan struct{}), stop: make(chan struct{}), peerBye: make(chan struct{}), wdl: deadline.New(),
		intr: make(chan struct{}), r: bufio.NewReaderSize(c, 64<<10), buf: make([]byte, tcpMTU)}
	go l.writeLoop()
	return l
}

func (l *tcpLink) mtu() int { return tcpMTU }

func (l *tcpLink) setWriteDeadline(t time.Time) { l.wdl.Set(t) }

func (l *tcpLink) interrupt() { l.intrOnce.Do(func() { close(l.intr) }) }

func (l *tcpLink) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.werr
}

func (l *tcpLink) writeLoop() {
	defer close(l.done)
	for {
		var f *[]byte
		if len(l.ctl) > 0 {
			f = <-l.ctl // only this goroutine takes from it
		} else {
			select {
			case f = <-l.ctl:
			case f = <-l.q:
			case <-l.stop:
				return
			case <-l.peerBye:
				// The peer reads nothing more: end this side's stream, so
				// that it can close its socket without a reset (see
				// release).
				if cw, ok := l.c.(interface{ CloseWrite() error }); ok && l.err() == nil {
					cw.CloseWrite()
				}
				return
			}
		}
		last := (*f)[0] == pkClose
		if l.err() == nil {
			if _, err := l.c.Write(*f); err != nil {
				l.mu.Lock()
				l.werr = err
				l.mu.Unlock()
			}
		}
		*f = (*f)[:0]
		framePool.Put(f)
		l.queued.Add(-1)
		if last {
			// The goodbye was the last packet: end the sending side.
			if cw, ok := l.c.(interface{ CloseWrite() error }); ok && l.err() == nil {
				cw.CloseWrite()
			}
			return
		}
	}
}

func frame(kind byte, p []byte) *[]byte {
	f := framePool.Get().(*[]byte)
	b := append((*f)[:0], kind, 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(b[1:], uint32(len(p)))
	*f = append(b, p...)
	return f
}

// send queues one packet. It waits for room until the write deadline
// passes or the link is interrupted; once queued, the packet goes out
// whole.
func (l *tcpLink) send(kind byte, p []byte) error {
	if err := l.err(); err != nil {
		return err
	}
	select {
	case <-l.intr:
		return net.ErrClosed
	default:
	}
	f := frame(kind, p)
	select {
	case l.q <- f:
		l.queued.Add(1)
		return nil
	case <-l.wdl.Wait():
		framePool.Put(f)
		return os.ErrDeadlineExceeded
	case <-l.intr:
		framePool.Put(f)
		return net.ErrClosed
	case <-l.done:
		framePool.Put(f)
		return l.err()
	}
}

// sendControl queues one flow-control packet ahead of send's. Only
// interrupt and the link's end stop it, not the write deadline.
func (l *tcpLink) sendControl(kind byte, p []byte) error {
	if err := l.err(); err != nil {
		return err
	}
	f := frame(kind, p)
	select {
	case l.ctl <- f:
		l.queued.Add(1)
		return nil
	case <-l.intr:
		framePool.Put(f)
		return net.ErrClosed
	case <-l.done:
		framePool.Put(f)
		return l.err()
	}
}

// goodbye queues the goodbye packet after everything sent, and waits for
// the writer to have written it (the process may exit once Close returns,
// and what is still queued would be lost), then, in release, for the peer
// to end its side; all within timeout. What is left is delivered in the
// background.
func (l *tcpLink) goodbye(timeout time.Duration) error {
	if l.err() != nil {
		return l.err()
	}
	f := frame(pkClose, nil)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case l.q <- f:
		l.queued.Add(1)
	case <-t.C:
		framePool.Put(f)
		return errors.New("transport: the peer stopped reading; the goodbye could not be queued")
	case <-l.done:
		framePool.Put(f)
		return l.err()
	}
	l.mu.Lock()
	l.bye, l.byeBy = true, time.Now().Add(timeout)
	l.mu.Unlock()
	select {
	case <-l.done:
	case <-t.C:
	}
	return nil
}

func (l *tcpLink) recv() (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(l.r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[1:])
	if n > tcpMTU {
		return 0, nil, fmt.Errorf("transport: malformed packets: %d bytes, more than %d", n, tcpMTU)
	}
	p := l.buf[:n]
	if _, err := io.ReadFull(l.r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	if hdr[0] == pkClose {
		l.peerByeOnce.Do(func() { close(l.peerBye) })
		return 0, nil, errPeerClosed
	}
	return hdr[0], p, nil
}

// shutdown stops reading at once; the socket closes at once if there was
// no goodbye, else once it is delivered (see release).
func (l *tcpLink) shutdown() {
	l.shutOnce.Do(func() {
		l.interrupt()
		l.mu.Lock()
		bye := l.bye
		l.mu.Unlock()
		if !bye {
			close(l.stop)
			l.c.Close()
			return
		}
		l.c.SetReadDeadline(time.Unix(1, 0))
	})
}

// release drops the receive buffers (the read loop has returned). After a
// goodbye, the socket closes in the background once the writer has
// delivered it and the peer has ended its stream, which it does once it
// has read the goodbye, at most tcpLingerMax later. Until then what the
// peer sends (flow-control packets for what it read) is read and dropped:
// closing a socket with unread bytes resets the connection, and a reset
// throws away what the peer has not read yet, the end of this side's
// stream among it.
func (l *tcpLink) release() {
	l.r, l.buf = nil, nil
	l.mu.Lock()
	bye, by := l.bye, l.byeBy
	l.mu.Unlock()
	if !bye {
		return
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		end := time.Now().Add(tcpLingerMax)
		t := time.NewTimer(tcpLingerMax)
		defer t.Stop()
		select {
		case <-l.done:
		case <-t.C:
		}
		l.c.SetReadDeadline(end)
		io.Copy(io.Discard, l.c)
		l.c.Close()
	}()
	// Within the goodbye's time, wait for the peer to end its side too: a
	// process that exits once Close returns would otherwise close the
	// socket with the peer's last credit packets unread.
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
	}
}
