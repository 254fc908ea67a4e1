package mq

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/transport"
)

// Window bounds of a remote reader: the bytes of records (frames
// included) in flight between a server and one reader.
const (
	// DefaultWindow is a remote reader's window unless Dialer.Window says.
	DefaultWindow = 1 << 20
	// MinWindow is the least window; smaller requests are raised to it.
	MinWindow = 64 << 10
	// MaxWindow is the most a reader may ask for.
	MaxWindow = 64 << 20
	// batchBytes bounds a records frame the server builds in memory; a
	// record larger than that goes alone, straight from shared memory.
	batchBytes = 64 << 10
)

// ServeConfig bounds what remote readers can make a Server hold. The zero
// value is usable.
type ServeConfig struct {
	// MaxConns is how many readers are served at once (default 16; each
	// holds a reader slot of the log, of which there are 64). Beyond it a
	// dialer gets ErrBusy.
	MaxConns int
	// MaxWindow caps the window a reader may ask for (default 4 MiB).
	// A reader never has more than its window of records unacknowledged,
	// so a reader that stops reading costs the server nothing but a
	// blocked goroutine pair and one 64 KiB batch buffer, for at most
	// CreditTimeout.
	MaxWindow int
	// HandshakeTimeout bounds the wait for a dialer's hello (default 5 s).
	HandshakeTimeout time.Duration
	// WriteTimeout bounds each write to a reader (default 10 s): a reader
	// that gives credit but does not read is dropped after it. A record
	// larger than a batch is written in batch-sized pieces, each with
	// its own WriteTimeout.
	WriteTimeout time.Duration
	// CreditTimeout bounds the wait for a reader's credit while records
	// wait for it (default 30 s): a reader that holds its window and
	// returns no credit for that long is dropped, so that it does not
	// hold a connection and a reader slot of the log (which under
	// FullBlock holds producers back) for ever.
	CreditTimeout time.Duration
	// MaxConnsPerPeer is how many of the MaxConns one peer may hold
	// (default half of MaxConns, at least 1), so that no one peer takes
	// them all: beyond it the peer gets ErrBusy. A peer is a
	// transport.Addr's node (so every reader on one node, a reader per
	// partition say, counts), a TCP address's IP, or else the remote
	// address's string.
	MaxConnsPerPeer int
	// Authorize, if set, is asked about each reader after its hello
	// (its connection, for the peer's address or a transport.Conn's
	// path, and the partition asked for): an error refuses it, and the
	// reader gets ErrDenied. Unset, anyone who can connect reads every
	// partition: serve a plain net.Listener only on a network where
	// that is meant, and prefer transport listeners (docs/mq.md, "Who
	// may connect").
	Authorize func(c net.Conn, partition int) error
	// Logger gets the connections that failed, and why. Default: nothing.
	Logger *slog.Logger
}

func (c ServeConfig) withDefaults() ServeConfig {
	if c.MaxConns <= 0 {
		c.MaxConns = 16
	}
	if c.MaxWindow <= 0 {
		c.MaxWindow = 4 << 20
	}
	c.MaxWindow = min(max(c.MaxWindow, MinWindow), MaxWindow)
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 5 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.CreditTimeout <= 0 {
		c.CreditTimeout = 30 * time.Second
	}
	if c.MaxConnsPerPeer <= 0 {
		c.MaxConnsPerPeer = max(c.MaxConns/2, 1)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server streams a log's partitions to remote readers (DialReader): each
// connection asks for a partition and an offset, and gets the committed
// records from there on, read in place on this host and sent within the
// reader's window.
type Server struct {
	l   *Log
	cfg ServeConfig

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	peers  map[string]int // connections held by each peer (peerOf)
	lns    map[net.Listener]struct{}
	closed bool
	// refusing counts the goroutines telling dialers over MaxConns so.
	refusing int
	wg       sync.WaitGroup

	served, refused, records, bytes atomic.Uint64
}

// ServerStats counts what a Server did.
type ServerStats struct {
	// Active is the connections being served now.
	Active int
	// Served counts the connections accepted and handed a reader,
	// Refused those turned away (busy, a bad hello, an offset gone).
	Served, Refused uint64
	// Records and Bytes (payload) sent.
	Records, Bytes uint64
}

// NewServer returns a server of l's partitions. Close it before l.
func NewServer(l *Log, cfg ServeConfig) *Server {
	return &Server{l: l, cfg: cfg.withDefaults(), conns: map[net.Conn]struct{}{}, peers: map[string]int{}, lns: map[net.Listener]struct{}{}}
}

// Serve serves remote readers of l from ln until ln fails or is closed,
// as http.Serve does. ln may be a transport.Listener (the ub and shm
// paths) or any net.Listener (plain TCP).
func Serve(l *Log, ln net.Listener, cfg ServeConfig) error {
	return NewServer(l, cfg).Serve(ln)
}

// Serve accepts readers on ln until it fails or the server is closed
// (then it returns nil; ErrClosed if it was closed before Serve).
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.lns, ln)
		s.mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return err
		}
		peer := peerOf(c.RemoteAddr())
		s.mu.Lock()
		switch {
		case s.closed:
			s.mu.Unlock()
			c.Close()
			return nil
		case len(s.conns) >= s.cfg.MaxConns || s.peers[peer] >= s.cfg.MaxConnsPerPeer:
			limit := fmt.Errorf("mq: %d readers already: %w", s.cfg.MaxConns, ErrBusy)
			if len(s.conns) < s.cfg.MaxConns {
				limit = fmt.Errorf("mq: %d readers of %s already: %w", s.cfg.MaxConnsPerPeer, peer, ErrBusy)
			}
			refusing := s.refusing < s.cfg.MaxConns
			if refusing {
				s.refusing++
				// Counted under the lock that Close takes before it
				// waits, so that it waits for this goroutine too.
				s.wg.Add(1)
			}
			s.mu.Unlock()
			s.refused.Add(1)
			if !refusing { // a flood: no goroutine for each
				c.Close()
				continue
			}
			// A reader over the limit is told so rather than left
			// hanging, by at most MaxConns goroutines at a time.
			go func() {
				defer s.wg.Done()
				s.refuse(c, limit)
				s.mu.Lock()
				s.refusing--
				s.mu.Unlock()
			}()
			continue
		}
		s.conns[c] = struct{}{}
		s.peers[peer]++
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				if s.peers[peer]--; s.peers[peer] <= 0 {
					delete(s.peers, peer)
				}
				s.mu.Unlock()
				c.Close()
			}()
			if err := s.serveConn(c); err != nil {
				s.cfg.Logger.Debug("mq: remote reader ended", "peer", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

// peerOf names the peer at a: a transport address's node, a TCP
// address's IP, or else its string.
func peerOf(a net.Addr) string {
	switch a := a.(type) {
	case transport.Addr:
		return "node " + a.Node
	case *transport.Addr:
		return "node " + a.Node
	case *net.TCPAddr:
		return a.IP.String()
	case nil:
		return ""
	}
	return a.String()
}

// Close closes the server's listeners and connections and waits for its
// goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	s.mu.Lock()
	active := len(s.conns)
	s.mu.Unlock()
	return ServerStats{Active: active, Served: s.served.Load(), Refused: s.refused.Load(), Records: s.records.Load(), Bytes: s.bytes.Load()}
}

// refuse tells a dialer why it is turned away. It half-closes and
// drains what the dialer sent (64 KiB and a second at most) before it
// closes, so that the answer is not lost to a reset.
func (s *Server) refuse(c net.Conn, err error) {
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if _, err := c.Write(appendError(nil, err)); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		c.SetReadDeadline(time.Now().Add(time.Second))
		io.CopyN(io.Discard, c, 64<<10)
	}
}

// serveConn serves one reader: the hello, then the stream, with a
// goroutine that takes the reader's credit.
func (s *Server) serveConn(c net.Conn) error {
	br := bufio.NewReaderSize(c, 4096)
	c.SetReadDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	typ, body, err := readFrame(br, maxControl, nil)
	if err == nil && typ != frameHello {
		err = protoErr("frame type %d before hello", typ)
	}
	var h hello
	if err == nil {
		h, err = decodeHello(body)
	}
	if err != nil {
		s.refused.Add(1)
		s.refuse(c, err)
		return err
	}
	c.SetReadDeadline(time.Time{})
	var r *Reader
	switch {
	case h.name != s.l.Name():
		err = fmt.Errorf("mq: log %q is not served here (%q is): %w", h.name, s.l.Name(), os.ErrNotExist)
	case int64(h.partition) >= int64(s.l.Config().Partitions):
		err = fmt.Errorf("mq: partition %d of %d: %w", h.partition, s.l.Config().Partitions, errNoPartition)
	case s.cfg.Authorize != nil:
		if aerr := s.cfg.Authorize(c, int(h.partition)); aerr != nil {
			err = fmt.Errorf("mq: %v: %w", aerr, ErrDenied)
			break
		}
		fallthrough
	default:
		r, err = s.l.NewReader(int(h.partition), h.from)
	}
	if err != nil {
		s.refused.Add(1)
		s.refuse(c, err)
		return err
	}
	defer r.Close()
	window := min(max(int(h.window), MinWindow), s.cfg.MaxWindow)
	s.served.Add(1)
	c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if _, err := c.Write(appendWelcome(nil, welcome{partitions: uint32(s.l.Config().Partitions), start: r.Offset(), window: uint32(window)})); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := &stream{credit: int64(window), window: int64(window), more: make(chan struct{}, 1), timeout: s.cfg.CreditTimeout}
	var creditErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		creditErr = st.takeCredit(br)
	}()
	err = s.stream(ctx, c, r, st, int(h.partition))
	c.Close() // ends takeCredit
	<-done
	if errors.Is(err, context.Canceled) { // the reader went: say why
		err = creditErr
	}
	return err
}

// stream is one connection's credit: the bytes of window the server may
// still send.
type stream struct {
	credit, window int64
	timeout        time.Duration // CreditTimeout
	mu             sync.Mutex
	more           chan struct{} // a token when credit grew
}

// takeCredit reads the reader's credit frames until the connection ends.
func (st *stream) takeCredit(br *bufio.Reader) error {
	var buf [16]byte
	for {
		typ, body, err := readFrame(br, maxControl, buf[:0])
		if err != nil {
			return err
		}
		if typ != frameCredit {
			return protoErr("frame type %d from a reader", typ)
		}
		n, err := decodeCredit(body)
		if err != nil {
			return err
		}
		st.mu.Lock()
		st.credit += int64(n)
		over := st.credit > st.window
		st.mu.Unlock()
		if over {
			return protoErr("credit returned beyond the window")
		}
		select {
		case st.more <- struct{}{}:
		default:
		}
	}
}

// errNoCredit: a reader returned no credit for CreditTimeout.
var errNoCredit = errors.New("mq: the reader returned no credit")

// await waits until the stream has need bytes of credit, and takes them,
// for at most the stream's timeout.
func (st *stream) await(ctx context.Context, need int64) error {
	var timer *time.Timer
	for {
		st.mu.Lock()
		if st.credit >= need {
			st.credit -= need
			st.mu.Unlock()
			return nil
		}
		st.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(st.timeout)
			defer timer.Stop()
		}
		select {
		case <-st.more:
			timer.Reset(st.timeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return fmt.Errorf("%w for %v", errNoCredit, st.timeout)
		}
	}
}

// stream sends the records of r in frames within the reader's window.
// A frame gathers the records that are already there (up to batchBytes);
// a record that would not fit in batchBytes goes in a frame of its own,
// written from shared memory.
func (s *Server) stream(ctx context.Context, c net.Conn, r *Reader, st *stream, p int) error {
	bw := bufio.NewWriterSize(c, batchBytes)
	batch := make([]byte, 0, batchBytes)
	count, payload := 0, 0
	flush := func() error {
		if count == 0 {
			return nil
		}
		binary.LittleEndian.PutUint32(batch[frameHeader:], uint32(count))
		frameEnd(batch, 0)
		if err := st.await(ctx, int64(len(batch))); err != nil {
			return err
		}
		c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
		if _, err := bw.Write(batch); err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		s.records.Add(uint64(count))
		s.bytes.Add(uint64(payload))
		batch, count, payload = batch[:0], 0, 0
		return nil
	}
	for {
		var rec Record
		var got bool
		var err error
		if count > 0 {
			// Gather only what is there: send the batch rather than wait
			// (for the tail to move, or for a record being written, held
			// or left by a dead producer, after the batch's records).
			if ps, serr := s.l.Stats(p); serr != nil || ps.Tail <= r.Offset() {
				if err := flush(); err != nil {
					return err
				}
			} else if rec, got, err = nextNow(r); err == nil && !got {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if !got && err == nil {
			rec, err = r.Next(ctx)
		}
		if err != nil {
			if ferr := flush(); ferr != nil {
				return ferr
			}
			if errors.Is(err, context.Canceled) {
				return err
			}
			c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			c.Write(appendError(nil, err))
			return err
		}
		cost := recordHeader + len(rec.Payload)
		if int64(recordsHeader+cost) > st.window {
			if err := flush(); err != nil {
				return err
			}
			err := fmt.Errorf("mq: a %d-byte record at %d does not fit the reader's %d-byte window: %w", len(rec.Payload), rec.Offset, st.window, ErrTooLarge)
			c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			c.Write(appendError(nil, err))
			return err
		}
		if recordsHeader+cost > batchBytes {
			if err := flush(); err != nil {
				return err
			}
			if err := st.await(ctx, int64(recordsHeader+cost)); err != nil {
				return err
			}
			var hdr [recordsHeader + recordHeader]byte
			binary.LittleEndian.PutUint32(hdr[:], uint32(recordsHeader+cost-4))
			hdr[4] = frameRecords
			binary.LittleEndian.PutUint32(hdr[frameHeader:], 1)
			binary.LittleEndian.PutUint64(hdr[recordsHeader:], rec.Offset)
			binary.LittleEndian.PutUint32(hdr[recordsHeader+8:], uint32(len(rec.Payload)))
			// In batch-sized pieces, each with its own deadline: a slow
			// reader that keeps reading is not dropped for a large record.
			c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			if _, err := bw.Write(hdr[:]); err != nil {
				return err
			}
			for rest := rec.Payload; len(rest) > 0; {
				n := min(len(rest), batchBytes)
				c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
				if _, err := bw.Write(rest[:n]); err != nil {
					return err
				}
				rest = rest[n:]
			}
			c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
			if err := bw.Flush(); err != nil {
				return err
			}
			s.records.Add(1)
			s.bytes.Add(uint64(len(rec.Payload)))
			continue
		}
		if len(batch)+cost > batchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		if count == 0 {
			batch = frameStart(batch[:0], frameRecords)
			batch = append(batch, 0, 0, 0, 0)
		}
		batch = binary.LittleEndian.AppendUint64(batch, rec.Offset)
		batch = binary.LittleEndian.AppendUint32(batch, uint32(len(rec.Payload)))
		batch = append(batch, rec.Payload...)
		count++
		payload += len(rec.Payload)
	}
}

// done is a context that has ended, for nextNow.
var done = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// nextNow is r.Next without the wait: got is false when the next
// committed record is not there yet (the tail has not moved on, or the
// record at the reader's offset is still being written, or its writer
// died and a waiting Next will abort it). It spins at most the Backoff
// ladder's spin phase (shm.DefaultSpin) before it says so.
func nextNow(r *Reader) (rec Record, got bool, err error) {
	rec, err = r.Next(done)
	if errors.Is(err, context.Canceled) {
		return Record{}, false, nil
	}
	return rec, err == nil, err
}

// Dialer dials remote readers. The zero value dials with transport.Dial
// (the environment's endpoint) and a DefaultWindow.
type Dialer struct {
	// Endpoint dials through this transport endpoint (the node a process
	// plays); nil means transport.Dial.
	Endpoint *transport.Endpoint
	// Dial, if set, makes the connection instead (plain TCP, a test's
	// pipe).
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// Window is the bytes of records (frames included) the reader takes
	// in flight: the most it holds. Default DefaultWindow, raised to
	// MinWindow, at most MaxWindow; the server may grant less. A record
	// larger than the window cannot be read (ErrTooLarge).
	Window int
}

// RemoteReader reads a partition of a log on another node, like Reader:
// records come in order from the offset asked for, each once. It holds
// at most its window of records; a record's payload is valid until the
// next Next or Close. It is for one goroutine at a time.
type RemoteReader struct {
	conn   net.Conn
	addr   string
	window int64
	frames chan *recordsFrame
	free   chan *recordsFrame // frames done with, for the receiver to reuse
	err    error              // why frames was closed; read after it is
	done   chan struct{}
	stop   chan struct{}

	cur     *recordsFrame
	pending int64 // credit owed to the server, not sent yet
	offset  uint64
	closed  bool

	// received counts the bytes of frames taken from the server, released
	// those the application is done with, creditSent the credit returned
	// (counted before it is sent): the server may send at most window +
	// creditSent.
	received, released, creditSent atomic.Int64
	pooled                         atomic.Int64 // bytes of the frames in free
}

// outstanding is the bytes of frames this reader holds.
func (r *RemoteReader) outstanding() int64 { return r.received.Load() - r.released.Load() }

type recordsFrame struct {
	cost int64
	body []byte
	recs []Record
	i    int
}

// A reader keeps frames it is done with for reuse: at most maxPooled of
// them, of at most maxPooledBytes together.
const (
	maxPooled      = 64
	maxPooledBytes = 256 << 10
)

// DialReader connects to the Server at addr (transport.Dial's address,
// "ub://<node>/<service>") and returns a reader of partition p of log
// logName from offset from (a record's offset, 0, Oldest or Newest).
func DialReader(ctx context.Context, addr, logName string, p int, from uint64) (*RemoteReader, error) {
	var d Dialer
	return d.DialReader(ctx, addr, logName, p, from)
}

// DialReader is DialReader through d.
func (d *Dialer) DialReader(ctx context.Context, addr, logName string, p int, from uint64) (*RemoteReader, error) {
	if len(logName) == 0 || len(logName) > maxNameLen {
		return nil, fmt.Errorf("mq: log name of %d bytes, want 1 to %d", len(logName), maxNameLen)
	}
	if p < 0 || p >= maxPartitions {
		return nil, fmt.Errorf("mq: partition %d: %w", p, errNoPartition)
	}
	window := d.Window
	if window == 0 {
		window = DefaultWindow
	}
	window = min(max(window, MinWindow), MaxWindow)
	var c net.Conn
	var err error
	switch {
	case d.Dial != nil:
		c, err = d.Dial(ctx, addr)
	case d.Endpoint != nil:
		c, err = d.Endpoint.Dial(ctx, addr)
	default:
		c, err = transport.Dial(ctx, addr)
	}
	if err != nil {
		return nil, fmt.Errorf("mq: dial %s: %w", addr, err)
	}
	fail := func(err error) (*RemoteReader, error) {
		c.Close()
		return nil, fmt.Errorf("mq: remote reader of %s at %s: %w", logName, addr, err)
	}
	// The handshake honours ctx through the connection's deadline.
	stopWatch := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stopWatch()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(appendHello(nil, hello{name: logName, partition: uint32(p), from: from, window: uint32(window)})); err != nil {
		return fail(err)
	}
	br := bufio.NewReaderSize(c, 64<<10)
	typ, body, err := readFrame(br, maxControl, nil)
	if err != nil {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		return fail(closedErr(err))
	}
	switch typ {
	case frameError:
		return fail(decodeError(body))
	case frameWelcome:
	default:
		return fail(protoErr("frame type %d for a welcome", typ))
	}
	w, err := decodeWelcome(body)
	if err != nil {
		return fail(err)
	}
	if int64(w.window) > int64(window) || w.window < MinWindow {
		return fail(protoErr("window of %d granted for %d asked", w.window, window))
	}
	if !stopWatch() {
		return fail(ctx.Err())
	}
	c.SetDeadline(time.Time{})
	r := &RemoteReader{conn: c, addr: addr, window: int64(w.window), frames: make(chan *recordsFrame, 64), free: make(chan *recordsFrame, maxPooled),
		done: make(chan struct{}), stop: make(chan struct{}), offset: w.start}
	go r.receive(br, w.start)
	return r, nil
}

// closedErr names a failed read or write of the connection (an end of
// file, a reset, a closed or timed-out connection) as ErrPeerClosed;
// a protocol error stays one.
func closedErr(err error) error {
	if errors.Is(err, ErrProtocol) {
		return err
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: %w", ErrPeerClosed, err)
}

// receive reads the server's frames into r.frames, checking each against
// the window: a server that sends more than it was granted is cut off.
func (r *RemoteReader) receive(br *bufio.Reader, next uint64) {
	defer close(r.done)
	err := func() error {
		for {
			f := &recordsFrame{}
			select {
			case f = <-r.free:
				r.pooled.Add(-int64(cap(f.body)))
			default:
			}
			typ, body, err := readFrame(br, int(r.window), f.body[:0])
			if err != nil {
				select {
				case <-r.stop:
					return ErrClosed
				default:
				}
				return closedErr(err)
			}
			switch typ {
			case frameRecords:
			case frameError:
				return decodeError(body)
			default:
				return protoErr("frame type %d in a stream", typ)
			}
			cost := int64(frameHeader + len(body)) // what the server charged
			if r.received.Add(cost) > r.window+r.creditSent.Load() {
				return protoErr("the server sent beyond the %d-byte window", r.window)
			}
			f.cost, f.body, f.recs, f.i = cost, body, f.recs[:0], 0
			next, err = decodeRecords(body, next, func(rec Record) { f.recs = append(f.recs, rec) })
			if err != nil {
				return err
			}
			select {
			case r.frames <- f:
			case <-r.stop:
				return ErrClosed
			}
		}
	}()
	r.err = err
	close(r.frames)
}

// Offset is the log offset after the last record Next returned: where a
// new reader would go on from.
func (r *RemoteReader) Offset() uint64 { return r.offset }

// Window is the window the server granted.
func (r *RemoteReader) Window() int { return int(r.window) }

// Next returns the next record, waiting for one until ctx ends. A server
// that died, closed the stream or broke the protocol gives an error
// (ErrPeerClosed, ErrProtocol, or what the server reported, such as
// ErrOffsetGone), after the records that came before it.
func (r *RemoteReader) Next(ctx context.Context) (Record, error) {
	if r.closed {
		return Record{}, ErrClosed
	}
	if r.cur != nil && r.cur.i < len(r.cur.recs) {
		return r.take(), nil
	}
	if r.cur != nil {
		r.release(r.cur)
		r.cur = nil
	}
	var f *recordsFrame
	var ok bool
	select {
	case f, ok = <-r.frames:
	default:
		// About to wait: return all credit owed first, so that the
		// server never waits for credit this reader sits on.
		if err := r.sendCredit(); err != nil {
			return Record{}, err
		}
		select {
		case f, ok = <-r.frames:
		case <-ctx.Done():
			return Record{}, ctx.Err()
		}
	}
	if !ok {
		return Record{}, fmt.Errorf("mq: remote reader at %s: %w", r.addr, r.err)
	}
	r.cur = f
	return r.take(), nil
}

func (r *RemoteReader) take() Record {
	rec := r.cur.recs[r.cur.i]
	r.cur.recs[r.cur.i] = Record{}
	r.cur.i++
	r.offset = rec.Offset + align8(headerSize+uint64(len(rec.Payload)))
	return rec
}

// release gives a frame's window back, sending credit at a quarter of
// the window (as grpc's flow control batches its updates).
func (r *RemoteReader) release(f *recordsFrame) error {
	r.released.Add(f.cost)
	r.pending += f.cost
	if c := int64(cap(f.body)); r.pooled.Load()+c <= maxPooledBytes {
		select {
		case r.free <- f:
			r.pooled.Add(c)
		default:
		}
	}
	if r.pending >= r.window/4 {
		return r.sendCredit()
	}
	return nil
}

func (r *RemoteReader) sendCredit() error {
	if r.pending == 0 {
		return nil
	}
	r.creditSent.Add(r.pending)
	r.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.conn.Write(appendCredit(nil, uint32(r.pending))); err != nil {
		return fmt.Errorf("mq: remote reader at %s: %w", r.addr, closedErr(err))
	}
	r.pending = 0
	return nil
}

// Close ends the stream and its goroutine.
func (r *RemoteReader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	close(r.stop)
	err := r.conn.Close()
	<-r.done
	return err
}
