package offload

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/mq"
)

// ServerConfig bounds a Server. The zero value is useful.
type ServerConfig struct {
	// MaxConns is how many connections are served at once (default 64);
	// more are closed as they arrive.
	MaxConns int
	// Timeout bounds each request's reading and its response's writing
	// (default 10 s); IdleTimeout the wait for a connection's next
	// request (default 60 s).
	Timeout, IdleTimeout time.Duration
	// Logger gets what no call returns (connections dropped); default
	// none.
	Logger *slog.Logger
}

// Server serves the payloads of the logs it was given to consumers on
// other hosts, over a listener (a transport.Listener: its path, user and
// TLS checks decide who may connect). It serves only those logs, and
// sends a payload straight from shared memory.
type Server struct {
	l    net.Listener
	cfg  ServerConfig
	logs map[string]*mq.Log
	sem  chan struct{}

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server of logs on l; Serve serves it.
func NewServer(l net.Listener, cfg ServerConfig, logs ...*mq.Log) *Server {
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 64
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{l: l, cfg: cfg, logs: map[string]*mq.Log{}, sem: make(chan struct{}, cfg.MaxConns), conns: map[net.Conn]struct{}{}}
	for _, lg := range logs {
		s.logs[lg.Name()] = lg
	}
	return s
}

// Addr is the listener's address: the Fetch of the stores it serves.
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Serve accepts connections until Close, and then returns nil.
func (s *Server) Serve() error {
	for {
		c, err := s.l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		select {
		case s.sem <- struct{}{}:
		default:
			s.cfg.Logger.Warn("offload: too many fetch connections, one closed", "max", s.cfg.MaxConns)
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			<-s.sem
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

// Close stops the server: the listener and every connection.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.l.Close()
	s.wg.Wait()
	return err
}

func (s *Server) serveConn(c net.Conn) {
	defer func() {
		// The slot is free before the peer sees the close: a client
		// that reconnects at once finds room.
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		<-s.sem
		c.Close()
		s.wg.Done()
	}()
	br := bufio.NewReaderSize(c, 1024)
	buf := make([]byte, MaxRefSize)
	for {
		c.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		if _, err := br.Peek(1); err != nil {
			return
		}
		c.SetDeadline(time.Now().Add(s.cfg.Timeout))
		b, err := readRequest(br, buf)
		if err != nil {
			s.cfg.Logger.Debug("offload: a bad fetch request", "err", err)
			return
		}
		if err := s.answer(c, b); err != nil {
			s.cfg.Logger.Debug("offload: a fetch answer", "err", err)
			return
		}
	}
}

// answer writes the response to one request.
func (s *Server) answer(c net.Conn, b []byte) error {
	fail := func(status byte, msg string) error {
		if len(msg) > maxMessage {
			msg = msg[:maxMessage]
		}
		_, err := c.Write(append(responseHeader(status, len(msg)), msg...))
		return err
	}
	ref, err := ParseRef(b)
	if err != nil {
		// A client that sends no reference is not one of ours: its
		// connection ends after the answer.
		return errors.Join(fail(statusBad, err.Error()), err)
	}
	l := s.logs[ref.Log]
	if l == nil {
		return fail(statusGone, fmt.Sprintf("log %s is not served here", ref.Log))
	}
	rec, release, err := l.ReadAt(ref.Partition, ref.Offset)
	switch {
	case errors.Is(err, mq.ErrOffsetGone) || errors.Is(err, mq.ErrNotRecord):
		return fail(statusGone, err.Error())
	case err != nil:
		return fail(statusError, err.Error())
	}
	defer release()
	if len(rec.Payload) != int(ref.Length) {
		return fail(statusMismatch, fmt.Sprintf("the record has %d bytes, the reference says %d", len(rec.Payload), ref.Length))
	}
	if rec.CRC != ref.CRC {
		return fail(statusMismatch, fmt.Sprintf("the record's checksum is %#x, the reference's %#x", rec.CRC, ref.CRC))
	}
	if _, err := c.Write(responseHeader(statusOK, len(rec.Payload))); err != nil {
		return err
	}
	_, err = c.Write(rec.Payload)
	return err
}
