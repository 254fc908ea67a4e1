package mux

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Config tunes a session. The zero value is valid.
type Config struct {
	// KeepaliveInterval is how often an idle session pings its peer
	// (default 10 s; negative disables keepalives).
	KeepaliveInterval time.Duration
	// KeepaliveTimeout is how long a ping may go unanswered before the
	// session is closed as dead (default 30 s).
	KeepaliveTimeout time.Duration
	// AcceptBacklog bounds streams opened by the peer and not yet accepted
	// (default 256); more are refused with a reset.
	AcceptBacklog int
	// SessionWindow bounds the bytes of all the session's streams that
	// arrived and were not read yet (default DefaultSessionWindow, at
	// least 256 KiB, a stream's window): the peer's writers wait for it as
	// for their stream's window, so streams nobody reads hold at most this
	// much, however many there are.
	SessionWindow int
	// MaxStreams bounds the streams the peer has open in this session at
	// once, accepted or not, including those this side closed that the
	// peer has not ended yet (default DefaultMaxStreams); more are refused
	// with a reset, so a peer that opens streams and never ends them
	// cannot grow the session without bound.
	MaxStreams int
	// Logger gets what the session has to say that no call returns: why
	// it ended, and the streams of the peer's it refused (at Debug; a
	// peer breaking the protocol at Warn). Default: nothing is logged.
	Logger *slog.Logger
}

// DefaultMaxStreams is the default of Config.MaxStreams.
const DefaultMaxStreams = 1024

// DefaultSessionWindow is the default of Config.SessionWindow.
const DefaultSessionWindow = 16 << 20

// Errors.
var (
	// ErrSessionClosed is returned by calls on a closed session and its
	// streams.
	ErrSessionClosed = errors.New("mux: session closed")
	// ErrKeepalive reports a peer that stopped answering pings.
	ErrKeepalive = errors.New("mux: peer stopped answering keepalives")
	// ErrStreamReset reports a stream the peer aborted.
	ErrStreamReset = errors.New("mux: stream reset by peer")
)

// Session multiplexes streams over one connection.
type Session struct {
	conn   net.Conn
	cfg    Config
	client bool

	mu       sync.Mutex
	streams  map[uint32]*Stream
	nextID   uint32
	peerMax  uint32 // highest stream id the peer opened
	peerOpen int    // streams of the peer's in streams (mu)
	err      error  // why the session ended
	accept   chan *Stream
	done     chan struct{}
	pingSeq  uint32
	pings    map[uint32]chan struct{}
	ctrl     chan []byte // control frames, written before data
	data     chan writeReq
	closeOne sync.Once

	// Flow control of the session as a whole (fmu, taken alone): the
	// credit the peer has left, what was read (or dropped) since the last
	// update, and the credit this side has left.
	fmu        sync.Mutex
	recvCredit int64
	consumed   int64
	sendCredit int64
	sendWait   chan struct{} // closed at the next session credit, made when a writer waits
	// Window updates not yet written, per stream (0: the session's),
	// coalesced: returning credit never waits for the writer (fmu).
	updates      map[uint32]uint32
	updatesReady chan struct{}
	updateBuf    []byte // the writer's
}

type writeReq struct {
	frame [][]byte
	done  chan error
}

// Client starts the session of the side that dialed conn.
func Client(conn net.Conn, cfg *Config) *Session { return newSession(conn, cfg, true) }

// Server starts the session of the side that accepted conn.
func Server(conn net.Conn, cfg *Config) *Session { return newSession(conn, cfg, false) }

func newSession(conn net.Conn, cfg *Config, client bool) *Session {
	c := Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.KeepaliveInterval == 0 {
		c.KeepaliveInterval = 10 * time.Second
	}
	if c.KeepaliveTimeout <= 0 {
		c.KeepaliveTimeout = 30 * time.Second
	}
	if c.AcceptBacklog <= 0 {
		c.AcceptBacklog = 256
	}
	if c.SessionWindow <= 0 {
		c.SessionWindow = DefaultSessionWindow
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = DefaultMaxStreams
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	c.SessionWindow = min(max(c.SessionWindow, initialWindow), maxSessionWindow)
	s := &Session{conn: conn, cfg: c, client: client, streams: map[uint32]*Stream{},
		accept: make(chan *Stream, c.AcceptBacklog), done: make(chan struct{}),
		pings: map[uint32]chan struct{}{}, ctrl: make(chan []byte, 64), data: make(chan writeReq),
		recvCredit: int64(c.SessionWindow), sendCredit: initialWindow,
		updates: map[uint32]uint32{}, updatesReady: make(chan struct{}, 1)}
	// Each side starts with a stream's window for the whole session; the
	// first update gives the rest of this side's.
	s.returnCredit(0, uint32(c.SessionWindow-initialWindow))
	s.nextID = 2
	if client {
		s.nextID = 1
	}
	go s.writeLoop()
	go s.readLoop()
	if c.KeepaliveInterval > 0 {
		go s.keepalive()
	}
	return s
}

// Close closes the session and every stream.
func (s *Session) Close() error {
	s.shutdown(ErrSessionClosed)
	return nil
}

// Err returns why the session ended, or nil while it runs.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.done }

func (s *Session) shutdown(err error) {
	s.closeOne.Do(func() {
		switch {
		case errors.Is(err, ErrSessionClosed):
		case errors.Is(err, ErrProtocol):
			s.cfg.Logger.Warn("mux: the peer broke the protocol; session closed", "remote", s.remote(), "err", err)
		default:
			s.cfg.Logger.Debug("mux: session ended", "remote", s.remote(), "err", err)
		}
		s.mu.Lock()
		s.err = err
		streams := s.streams
		s.streams = map[uint32]*Stream{}
		s.mu.Unlock()
		close(s.done)
		s.conn.Close()
		for _, st := range streams {
			st.wake()
		}
	})
}

// Open opens a new stream.
func (s *Session) Open() (*Stream, error) {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	id := s.nextID
	s.nextID += 2
	st := newStream(s, id)
	s.streams[id] = st
	s.mu.Unlock()
	if err := s.control(header{typ: typeWindow, flags: flagSYN, stream: id}); err != nil {
		return nil, err
	}
	return st, nil
}

// Accept waits for a stream the peer opened, until ctx ends or the
// session does.
func (s *Session) Accept(ctx context.Context) (*Stream, error) {
	select {
	case st := <-s.accept:
		return st, nil
	case <-s.done:
		return nil, s.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Ping measures a round trip to the peer. A peer that does not answer
// within Config.KeepaliveTimeout ends the session (ErrKeepalive); ctx
// ending first only ends the wait.
func (s *Session) Ping(ctx context.Context) (time.Duration, error) {
	s.mu.Lock()
	s.pingSeq++
	id := s.pingSeq
	ch := make(chan struct{})
	s.pings[id] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pings, id)
		s.mu.Unlock()
	}()
	start := time.Now()
	// The timer runs from before the ping is queued: a stuck writer counts.
	t := time.NewTimer(s.cfg.KeepaliveTimeout)
	defer t.Stop()
	b := make([]byte, headerSize)
	header{typ: typePing, flags: flagSYN, length: id}.encode(b)
	select {
	case s.ctrl <- b:
	case <-t.C:
		s.shutdown(ErrKeepalive)
		return 0, ErrKeepalive
	case <-s.done:
		return 0, s.Err()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case <-ch:
		return time.Since(start), nil
	case <-t.C:
		s.shutdown(ErrKeepalive)
		return 0, ErrKeepalive
	case <-s.done:
		return 0, s.Err()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (s *Session) keepalive() {
	t := time.NewTicker(s.cfg.KeepaliveInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if _, err := s.Ping(context.Background()); err != nil {
				return
			}
		case <-s.done:
			return
		}
	}
}

// control queues a control frame; control frames go before data.
func (s *Session) control(h header) error {
	b := make([]byte, headerSize)
	h.encode(b)
	select {
	case s.ctrl <- b:
		return nil
	case <-s.done:
		return s.Err()
	}
}

// writeData writes one data frame and waits until it is on the wire.
func (s *Session) writeData(id uint32, flags uint16, body []byte) error {
	hdr := make([]byte, headerSize)
	header{typ: typeData, flags: flags, stream: id, length: uint32(len(body))}.encode(hdr)
	frame := [][]byte{hdr, body}
	if len(body) == 0 {
		frame = frame[:1] // an empty write may wait for the reader (net.Pipe)
	}
	req := writeReq{frame: frame, done: make(chan error, 1)}
	select {
	case s.data <- req:
	case <-s.done:
		return s.Err()
	}
	select {
	case err := <-req.done:
		return err
	case <-s.done:
		return s.Err()
	}
}

// returnCredit queues a window update of n for stream id (0: the
// session); updates to the same stream add up until the writer takes them.
func (s *Session) returnCredit(id, n uint32) {
	if n == 0 {
		return
	}
	s.fmu.Lock()
	s.updates[id] += n
	s.fmu.Unlock()
	select {
	case s.updatesReady <- struct{}{}:
	default:
	}
}

// writeUpdates writes the window updates queued, as one write (only the
// writer calls it).
func (s *Session) writeUpdates() error {
	s.fmu.Lock()
	b := s.updateBuf[:0]
	var h [headerSize]byte
	for id, n := range s.updates {
		header{typ: typeWindow, stream: id, length: n}.encode(h[:])
		b = append(b, h[:]...)
	}
	clear(s.updates)
	s.fmu.Unlock()
	s.updateBuf = b
	if len(b) == 0 {
		return nil
	}
	_, err := s.conn.Write(b)
	return err
}

// consumedData notes n bytes of the session's streams read or dropped; a
// quarter of the window read makes a session update.
func (s *Session) consumedData(n uint32) {
	s.fmu.Lock()
	s.consumed += int64(n)
	var update int64
	if s.consumed >= int64(s.cfg.SessionWindow/4) {
		update, s.consumed = s.consumed, 0
		s.recvCredit += update
	}
	s.fmu.Unlock()
	s.returnCredit(0, uint32(update))
}

// admitData checks that n more bytes fit in the session's credit.
func (s *Session) admitData(n uint32) error {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if int64(n) > s.recvCredit {
		return fmt.Errorf("%w: %d bytes with %d of the session's credit left", ErrProtocol, n, s.recvCredit)
	}
	s.recvCredit -= int64(n)
	return nil
}

// sessionCredit takes the peer's session update.
func (s *Session) sessionCredit(n uint32) error {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	if s.sendCredit+int64(n) > maxSessionWindow {
		return fmt.Errorf("%w: session credit beyond %d", ErrProtocol, maxSessionWindow)
	}
	s.sendCredit += int64(n)
	if s.sendWait != nil {
		close(s.sendWait)
		s.sendWait = nil
	}
	return nil
}

// takeSend takes up to want of the session's credit; with none left it
// returns a channel that closes when more comes.
func (s *Session) takeSend(want uint32) (uint32, <-chan struct{}) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	k := uint32(min(int64(want), s.sendCredit))
	if k == 0 {
		if s.sendWait == nil {
			s.sendWait = make(chan struct{})
		}
		return 0, s.sendWait
	}
	s.sendCredit -= int64(k)
	return k, nil
}

// writeLoop is the only writer of the connection.
func (s *Session) writeLoop() {
	for {
		// Control first.
		select {
		case b := <-s.ctrl:
			if _, err := s.conn.Write(b); err != nil {
				s.shutdown(fmt.Errorf("mux: write: %w", err))
				return
			}
			continue
		case <-s.updatesReady:
			if err := s.writeUpdates(); err != nil {
				s.shutdown(fmt.Errorf("mux: write: %w", err))
				return
			}
			continue
		default:
		}
		select {
		case b := <-s.ctrl:
			if _, err := s.conn.Write(b); err != nil {
				s.shutdown(fmt.Errorf("mux: write: %w", err))
				return
			}
		case <-s.updatesReady:
			if err := s.writeUpdates(); err != nil {
				s.shutdown(fmt.Errorf("mux: write: %w", err))
				return
			}
		case req := <-s.data:
			bufs := net.Buffers(req.frame)
			_, err := bufs.WriteTo(s.conn)
			req.done <- err
			if err != nil {
				s.shutdown(fmt.Errorf("mux: write: %w", err))
				return
			}
		case <-s.done:
			return
		}
	}
}

// readLoop reads frames and dispatches them; a bad frame ends the session.
func (s *Session) readLoop() {
	hdr := make([]byte, headerSize)
	for {
		if _, err := io.ReadFull(s.conn, hdr); err != nil {
			s.shutdown(fmt.Errorf("mux: read: %w", err))
			return
		}
		h, err := decodeHeader(hdr)
		if err != nil {
			s.shutdown(err)
			return
		}
		if err := s.dispatch(h); err != nil {
			s.shutdown(err)
			return
		}
	}
}

func (s *Session) dispatch(h header) error {
	switch h.typ {
	case typePing:
		if h.flags&flagSYN != 0 {
			// Answer if there is room; a peer that floods pings and stops
			// reading must not stall this loop.
			b := make([]byte, headerSize)
			header{typ: typePing, flags: flagACK, length: h.length}.encode(b)
			select {
			case s.ctrl <- b:
			default:
			}
			return nil
		}
		s.mu.Lock()
		ch := s.pings[h.length]
		delete(s.pings, h.length)
		s.mu.Unlock()
		if ch != nil {
			close(ch)
		}
		return nil
	case typeGoAway:
		return fmt.Errorf("mux: peer went away (reason %d)", h.length)
	case typeWindow:
		if h.stream == 0 {
			if h.flags != 0 {
				return fmt.Errorf("%w: flags %d on the session's window update", ErrProtocol, h.flags)
			}
			return s.sessionCredit(h.length)
		}
	}
	st, err := s.stream(h)
	if err != nil {
		return err
	}
	if h.typ == typeWindow {
		if st != nil {
			if err := st.credit(h.length); err != nil {
				return err
			}
		}
	} else if st == nil {
		// A stream already gone: skip its bytes without keeping them, and
		// give the session's credit back.
		if err := s.admitData(h.length); err != nil {
			return err
		}
		if _, err := io.CopyN(io.Discard, s.conn, int64(h.length)); err != nil {
			return fmt.Errorf("mux: read: %w", err)
		}
		s.consumedData(h.length)
	} else {
		// Check the credit before allocating: a peer cannot make us hold
		// more than the windows it was given, its stream's and the
		// session's.
		if err := st.admit(h.length); err != nil {
			return err
		}
		if err := s.admitData(h.length); err != nil {
			return err
		}
		var body []byte
		if h.length > 0 {
			body = make([]byte, h.length)
			if _, err := io.ReadFull(s.conn, body); err != nil {
				return fmt.Errorf("mux: read: %w", err)
			}
		}
		if err := st.receive(body); err != nil {
			return err
		}
	}
	if st != nil {
		if h.flags&flagFIN != 0 {
			st.remoteClose()
		}
		if h.flags&flagRST != 0 {
			st.resetByPeer()
		}
	}
	return nil
}

// stream finds (or, for SYN, creates) the stream a frame is for. It returns
// nil for frames of streams already gone.
func (s *Session) stream(h header) (*Stream, error) {
	s.mu.Lock()
	st := s.streams[h.stream]
	ours := h.stream%2 == s.nextID%2
	switch {
	case h.stream == 0:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: frame for stream 0", ErrProtocol)
	case h.flags&flagSYN != 0 && (st != nil || ours || h.stream <= s.peerMax):
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: stream %d opened twice or with our parity", ErrProtocol, h.stream)
	case st == nil && h.flags&flagSYN == 0 && ((ours && h.stream >= s.nextID) || (!ours && h.stream > s.peerMax)):
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: frame for stream %d, which was never opened", ErrProtocol, h.stream)
	}
	if st == nil && h.flags&flagSYN != 0 {
		s.peerMax = h.stream
		if s.peerOpen >= s.cfg.MaxStreams {
			s.mu.Unlock()
			s.cfg.Logger.Debug("mux: refused a stream: the peer has MaxStreams open", "remote", s.remote(), "stream", h.stream, "max", s.cfg.MaxStreams)
			return nil, s.control(header{typ: typeWindow, flags: flagRST, stream: h.stream})
		}
		st = newStream(s, h.stream)
		select {
		case s.accept <- st:
			s.streams[h.stream] = st
			s.peerOpen++
		default:
			s.mu.Unlock()
			s.cfg.Logger.Debug("mux: refused a stream: the accept backlog is full", "remote", s.remote(), "stream", h.stream, "backlog", s.cfg.AcceptBacklog)
			return nil, s.control(header{typ: typeWindow, flags: flagRST, stream: h.stream})
		}
	}
	s.mu.Unlock()
	return st, nil
}

func (s *Session) forget(id uint32) {
	s.mu.Lock()
	if _, ok := s.streams[id]; ok && id%2 != s.nextID%2 {
		s.peerOpen--
	}
	delete(s.streams, id)
	s.mu.Unlock()
}

// Listener returns a net.Listener whose Accept yields the streams the peer
// opens, so a server (gRPC, net/http) can serve streams of one session.
// Closing it closes the session.
func (s *Session) Listener() net.Listener { return sessionListener{s} }

type sessionListener struct{ s *Session }

func (l sessionListener) Accept() (net.Conn, error) {
	st, err := l.s.Accept(context.Background())
	if err != nil {
		return nil, err
	}
	return st, nil
}

func (l sessionListener) Close() error   { return l.s.Close() }
func (l sessionListener) Addr() net.Addr { return l.s.conn.LocalAddr() }

// remote names the peer for the log.
func (s *Session) remote() string {
	if a := s.conn.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}
