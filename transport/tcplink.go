package transport

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// tcpMTU is the largest packet on the tcp path.
const tcpMTU = 64 << 10

// tcpLink carries packets over a TCP connection, each as a 5-byte header
// (kind, little-endian length) and its payload.
type tcpLink struct {
	c net.Conn

	mu      sync.Mutex
	pending []byte // the unsent rest of a packet a deadline interrupted
	hdr     [5]byte

	r   *bufio.Reader
	buf []byte

	once sync.Once
}

func newTCPLink(c net.Conn) *tcpLink {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &tcpLink{c: c, r: bufio.NewReaderSize(c, 64<<10), buf: make([]byte, tcpMTU)}
}

func (l *tcpLink) mtu() int { return tcpMTU }

func (l *tcpLink) setWriteDeadline(t time.Time) { l.c.SetWriteDeadline(t) }

// send writes one packet. A deadline that interrupts it after its first
// byte leaves the rest pending for the next send, so packets stay whole.
func (l *tcpLink) send(kind byte, p []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) > 0 {
		n, err := l.c.Write(l.pending)
		l.pending = l.pending[n:]
		if err != nil {
			return err
		}
	}
	l.hdr[0] = kind
	binary.LittleEndian.PutUint32(l.hdr[1:], uint32(len(p)))
	bufs := net.Buffers{l.hdr[:], p}
	total := int64(len(l.hdr) + len(p))
	n, err := bufs.WriteTo(l.c)
	if err == nil || n == 0 {
		return err
	}
	if n < total {
		rest := make([]byte, 0, total-n)
		if n < int64(len(l.hdr)) {
			rest = append(rest, l.hdr[n:]...)
			rest = append(rest, p...)
		} else {
			rest = append(rest, p[n-int64(len(l.hdr)):]...)
		}
		l.pending = rest
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
	return hdr[0], p, nil
}

// flush: the kernel delivers what was written before the socket closes,
// unless a deadline left part of a packet pending.
func (l *tcpLink) flush(timeout time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) > 0 {
		l.c.SetWriteDeadline(time.Now().Add(timeout))
		n, _ := l.c.Write(l.pending)
		l.pending = l.pending[n:]
	}
}

func (l *tcpLink) shutdown() { l.once.Do(func() { l.c.Close() }) }

func (l *tcpLink) release() {}
