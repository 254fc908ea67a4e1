// Package memcached serves a cache.Store over the memcached text protocol,
// meta commands included (mg, ms, md, ma, mn), so any memcached client can
// use the shared store over TCP or a unix socket.
//
// Classic commands: get, gets, gat, gats, bget, set, add, replace, append,
// prepend, cas, delete, incr, decr, touch, flush_all, version, verbosity,
// stats (general, settings, sizes, reset), quit. Lines are read and
// answered as memcached 1.6 reads and answers them, odd input included:
// its tokenizer, its number parsing (C's strtol family), its noreply
// rules, its 1 MiB item size limit counted as memcached counts it, and its
// handling of long lines (a get may be as long as the client likes; any
// other line that does not end within 16 KiB closes the connection).
// docs/cache.md lists the few deliberate differences.
package memcached

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/cache"
)

// Limits, as memcached 1.6's defaults.
const (
	maxKey = 250
	// readBufSize is memcached's read buffer (READ_BUFFER_SIZE): a line
	// that does not end within it closes the connection, unless it is a
	// get or gets.
	readBufSize = 16 << 10
	// maxLeadingSpaces before a long get: more, and memcached closes.
	maxLeadingSpaces = 100
	// maxGetLine bounds the bytes of a get line held at once. A longer
	// one has its keys answered as they arrive (streamed), so a client
	// cannot make a connection hold more than this (as much as one
	// value of the item size limit) however long its line.
	maxGetLine   = 1 << 20
	maxVerbosity = 2
)

// Version is what the version command answers.
const Version = "1.6.18-ubkit"

// DefaultMaxConns is memcached's default connection limit (-c 1024).
const DefaultMaxConns = 1024

// Server serves a store. Set its fields before Serve.
type Server struct {
	// Store holds the entries served. Required.
	Store *cache.Store
	// Pool is the old name of Store, used when Store is nil.
	//
	// Deprecated: use Store.
	Pool *cache.Store
	// MaxConns bounds the open connections (0: DefaultMaxConns). One more
	// is answered "ERROR Too many open connections" and closed, as
	// memcached does, and counted in rejected_connections.
	MaxConns int
	// Logger receives, at Warn, failures of the store that an answer
	// does not tell (a bucket a stopped writer held, say, answered as a
	// miss) and errors accepting connections; at Debug, commands cut
	// short by Close. Nil: nothing is logged.
	Logger *slog.Logger

	mu         sync.Mutex
	ls         map[net.Listener]struct{}
	conns      map[net.Conn]struct{}
	closed     bool
	wg         sync.WaitGroup
	start      time.Time
	flushTimer *time.Timer // a flush_all with a delay; a later one replaces it

	verbosity atomic.Uint32
	st        counters

	// ctx ends with Close, and with it every command's wait for a
	// bucket's lock (a connection's own ends when it does too).
	ctx    context.Context
	cancel context.CancelFunc
}

// NewServer returns a server for st.
func NewServer(st *cache.Store) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{Store: st, ls: map[net.Listener]struct{}{}, conns: map[net.Conn]struct{}{}, start: time.Now(),
		ctx: ctx, cancel: cancel}
}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.ls[l] = struct{}{}
	s.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			if closed || errors.Is(err, net.ErrClosed) {
				delete(s.ls, l)
				s.mu.Unlock()
				if closed {
					return net.ErrClosed
				}
				return err
			}
			s.mu.Unlock()
			// Out of descriptors, or a connection aborted before it was
			// accepted: wait and go on, as net/http does, instead of
			// leaving the listener open and unserved.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.st.acceptErrors.Add(1)
			s.log().Warn("memcached: accept failed; retrying", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return net.ErrClosed
		}
		limit := s.MaxConns
		if limit <= 0 {
			limit = DefaultMaxConns
		}
		if len(s.conns) >= limit {
			s.mu.Unlock()
			s.st.rejectedConns.Add(1)
			c.SetWriteDeadline(time.Now().Add(time.Second))
			io.WriteString(c, "ERROR Too many open connections\r\n")
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.ServeConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops the listeners and connections and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.cancel()
	for l := range s.ls {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	if s.flushTimer != nil {
		s.flushTimer.Stop()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// conn is one client connection.
type conn struct {
	s *Server
	// ctx bounds the commands' waits for a bucket's lock: it ends when
	// the connection does, or the server closes.
	ctx     context.Context
	r       *bufio.Reader
	w       *respWriter
	nreqs   int    // commands memcached runs before it sends answers
	scratch []byte // a value read or fetched
	old     []byte // the value an append or incr replaces
	key     []byte // a storage command's key, while its data is read
	tokens  [][]byte
	long    []byte // a get line longer than the read buffer
	// noreply is memcached's per-command flag: set from the line's last
	// token, it suppresses the answer, errors included (but not errors
	// that memcached sends with out_errstring).
	noreply bool
}

// countingConn counts bytes_read and bytes_written.
type countingConn struct {
	net.Conn
	st *counters
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.st.bytesRead.Add(uint64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.st.bytesWritten.Add(uint64(n))
	return n, err
}

// ServeConn speaks the protocol on c until the client quits, the
// connection fails, or a line cannot be resynchronized.
func (s *Server) ServeConn(c net.Conn) {
	defer c.Close()
	s.st.currConns.Add(1)
	s.st.totalConns.Add(1)
	defer s.st.currConns.Add(-1)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	cc := countingConn{Conn: c, st: &s.st}
	cn := &conn{s: s, ctx: ctx, r: bufio.NewReaderSize(cc, readBufSize), w: &respWriter{w: cc}, nreqs: reqsPerEvent}
	for {
		line, err := cn.r.ReadSlice('\n')
		var quit bool
		switch {
		case err == nil:
			quit = cn.command(trimEOL(line))
		case errors.Is(err, bufio.ErrBufferFull) && isLongGet(line):
			quit = cn.longGet(line)
		default:
			// The connection ended, or a line other than a get did not
			// end within the read buffer: memcached closes then. What
			// was answered before goes out first.
			cn.w.Flush()
			return
		}
		cn.commandDone()
		// An idle connection keeps no large buffer: pooled clients hold
		// many of them open.
		if cap(cn.scratch) > keepBuf {
			cn.scratch = nil
		}
		if cap(cn.old) > keepBuf {
			cn.old = nil
		}
		// Answer a pipeline once it is read: when no whole line is left,
		// as memcached, which then waits for more.
		if quit || !cn.lineBuffered() {
			if cn.w.Flush() != nil {
				return
			}
			cn.nreqs = reqsPerEvent
		}
		if quit {
			return
		}
	}
}

// keepBuf is the most a connection keeps of its value buffers between
// commands.
const keepBuf = 64 << 10

// reqsPerEvent is memcached's -R (reqs_per_event, default 20): it sends
// the answers it has after that many commands, even when more are
// buffered.
const reqsPerEvent = 20

// commandDone counts a command as memcached counts its requests: after
// 20 in a row (21 on a new connection) the answers so far are sent, which
// a later get with a bad key can no longer take back.
func (cn *conn) commandDone() {
	cn.nreqs--
	if cn.nreqs < 0 {
		cn.w.sent()
		cn.nreqs = reqsPerEvent - 1
	}
}

// lineBuffered says whether a whole line is already read.
func (cn *conn) lineBuffered() bool {
	b, _ := cn.r.Peek(cn.r.Buffered())
	return indexByte(b, '\n') >= 0
}

// respWriter holds answers until they are sent, as memcached's response
// queue: memcached sends what it has after a get, after mn, after 20
// commands and when it waits for input; a get with a key over 250 bytes
// drops the answers queued since, its own included (cull).
type respWriter struct {
	w    io.Writer
	buf  []byte
	kept int // buf[:kept] memcached has sent: never culled
	err  error
}

// respBufSize bounds what is held: past it, answers go out (and can no
// longer be culled).
const respBufSize = 64 << 10

func (rw *respWriter) Write(p []byte) (int, error) {
	if len(rw.buf)+len(p) > respBufSize {
		rw.Flush()
		if len(p) > respBufSize {
			if rw.err == nil {
				_, rw.err = rw.w.Write(p)
			}
			return len(p), nil
		}
	}
	rw.buf = append(rw.buf, p...)
	return len(p), nil
}

func (rw *respWriter) WriteString(s string) (int, error) {
	if len(rw.buf)+len(s) > respBufSize {
		return rw.Write([]byte(s))
	}
	rw.buf = append(rw.buf, s...)
	return len(s), nil
}

func (rw *respWriter) WriteByte(c byte) error {
	if len(rw.buf)+1 > respBufSize {
		rw.Flush()
	}
	rw.buf = append(rw.buf, c)
	return nil
}

// Flush writes what is held.
func (rw *respWriter) Flush() error {
	if len(rw.buf) > 0 && rw.err == nil {
		_, rw.err = rw.w.Write(rw.buf)
	}
	if cap(rw.buf) > respBufSize {
		rw.buf = nil
	}
	rw.buf, rw.kept = rw.buf[:0], 0
	return rw.err
}

// sent marks what is held as sent by memcached.
func (rw *respWriter) sent() { rw.kept = len(rw.buf) }

// cull drops the answers held since memcached last sent.
func (rw *respWriter) cull() { rw.buf = rw.buf[:rw.kept] }

// isLongGet reports whether the start of a line that did not end within
// the read buffer lets memcached go on reading it: a get or gets after
// at most 100 spaces.
func isLongGet(line []byte) bool {
	i := 0
	for i < len(line) && line[i] == ' ' {
		i++
	}
	if i > maxLeadingSpaces {
		return false
	}
	rest := string(line[i:min(len(line), i+5)])
	return rest == "gets " || rest[:min(len(rest), 4)] == "get "
}

// out writes one answer line unless the command is noreply
// (memcached's out_string).
func (cn *conn) out(s string) {
	if cn.noreply {
		return
	}
	cn.w.WriteString(s)
	cn.w.WriteString("\r\n")
}

// outErr writes an answer line whatever noreply says (memcached's
// out_errstring).
func (cn *conn) outErr(s string) {
	cn.noreply = false
	cn.out(s)
}

const errBadFormat = "CLIENT_ERROR bad command line format"

// setNoreply is memcached's set_noreply_maybe: the last token of the line
// (of the first 23) decides.
func (cn *conn) setNoreply(tokens [][]byte) bool {
	if len(tokens) > 0 && string(tokens[len(tokens)-1]) == "noreply" {
		cn.noreply = true
	}
	return cn.noreply
}

// command runs one line; it reports whether the connection should end.
// Its dispatch is memcached's process_command_ascii: the same token
// counts give ERROR, in the same order.
func (cn *conn) command(line []byte) bool {
	cn.noreply = false
	tokens, rest := tokenize(line, cn.tokens)
	cn.tokens = tokens
	ntokens := len(tokens) + 1 // memcached counts a terminal token
	if ntokens < 2 || len(tokens[0]) < 2 {
		cn.out("ERROR")
		return false
	}
	cmd := tokens[0]
	if cmd[0] == 'm' && len(cmd) == 2 {
		switch cmd[1] {
		case 'g':
			cn.metaGet(tokens)
		case 's':
			return cn.metaSet(tokens)
		case 'd':
			cn.metaDelete(tokens)
		case 'n':
			cn.out("MN")
			cn.w.sent()
		case 'a':
			cn.metaArith(tokens)
		default:
			cn.out("ERROR")
		}
		return false
	}
	wantOr := func(a, b int) bool {
		if ntokens != a && ntokens != b {
			cn.out("ERROR")
			return false
		}
		return true
	}
	switch string(cmd) {
	case "get", "gets", "gat", "gats", "bget":
		if ntokens < 3 {
			cn.out("ERROR")
			return false
		}
		name := string(cmd)
		cn.retrieve(tokens[1:], rest, name == "gets" || name == "gats", name == "gat" || name == "gats")
	case "set", "add", "replace", "append", "prepend":
		if wantOr(6, 7) {
			return cn.store(string(cmd), tokens)
		}
	case "cas":
		if wantOr(7, 8) {
			return cn.store("cas", tokens)
		}
	case "incr", "decr":
		if wantOr(4, 5) {
			cn.arith(tokens, string(cmd) == "incr")
		}
	case "delete":
		if ntokens < 3 || ntokens > 5 {
			cn.out("ERROR")
			return false
		}
		cn.delete(tokens)
	case "touch":
		if wantOr(4, 5) {
			cn.touch(tokens)
		}
	case "flush_all":
		if ntokens < 2 || ntokens > 4 {
			cn.out("ERROR")
			return false
		}
		cn.flush(tokens)
	case "version":
		cn.out("VERSION " + Version)
	case "verbosity":
		if wantOr(3, 4) {
			cn.verbosity(tokens)
		}
	case "stats":
		cn.stats(tokens)
	case "quit":
		return true
	default:
		// memcached drops a client that speaks HTTP to it.
		if last := tokens[len(tokens)-1]; len(last) >= 5 && string(last[:5]) == "HTTP/" {
			return true
		}
		cn.out("ERROR")
	}
	return false
}

// retrieve runs get, gets, gat and gats: keys are the tokens after the
// command (for gat, after the exptime), then rest, the line past the
// tokenizer's 23 tokens.
func (cn *conn) retrieve(args [][]byte, rest []byte, withCAS, touch bool) {
	var ttl time.Duration
	if touch {
		exp, ok := safeStrtol(args[0])
		if !ok {
			cn.out("CLIENT_ERROR invalid exptime argument")
			return
		}
		ttl = cache.ExpTime(int64(exp))
		args = args[1:]
	}
	// A key over 250 bytes anywhere makes the whole answer a
	// CLIENT_ERROR; the keys before it were still looked up (and gat's
	// touched), as memcached does.
	bad := -1
	n := 0
	eachKey(args, rest, func(k []byte) bool {
		if len(k) > maxKey {
			bad = n
			return false
		}
		n++
		return true
	})
	i := 0
	eachKey(args, rest, func(k []byte) bool {
		if i == bad {
			return false
		}
		i++
		cn.fetch(k, withCAS, touch, ttl, bad < 0)
		return true
	})
	if bad >= 0 {
		cn.w.cull()
		cn.out(errBadFormat)
		return
	}
	cn.w.WriteString("END\r\n")
	cn.w.sent()
}

// eachKey calls fn for each key of a get line until it returns false.
func eachKey(tokens [][]byte, rest []byte, fn func(k []byte) bool) {
	for _, k := range tokens {
		if !fn(k) {
			return
		}
	}
	for len(rest) > 0 {
		i := 0
		for i < len(rest) && rest[i] != ' ' {
			i++
		}
		if i > 0 && !fn(rest[:i]) {
			return
		}
		if i == len(rest) {
			return
		}
		rest = rest[i+1:]
	}
}

// fetch looks one key up for a get or gat and, if write, answers it.
func (cn *conn) fetch(k []byte, withCAS, touch bool, ttl time.Duration, write bool) {
	p, st := cn.s.store(), &cn.s.st
	if touch {
		st.cmdTouch.Add(1)
		if ttl >= 0 {
			if err := p.Touch(cn.ctx, k, ttl); err != nil {
				cn.s.failed("touch", err)
				st.touchMisses.Add(1)
				return
			}
		}
	} else {
		st.cmdGet.Add(1)
	}
	v, in, err := p.Get(cn.ctx, k, cn.scratch)
	if err != nil {
		cn.s.failed("get", err)
		if touch {
			st.touchMisses.Add(1)
		} else {
			st.getMisses.Add(1)
		}
		return
	}
	cn.scratch = v
	if touch {
		st.touchHits.Add(1)
		if ttl < 0 {
			// memcached answers the value, then it has expired.
			p.Touch(cn.ctx, k, time.Nanosecond)
		}
	} else {
		st.getHits.Add(1)
	}
	if !write {
		return
	}
	cn.writeValue(k, v, in, withCAS)
}

func (cn *conn) writeValue(k, v []byte, in cache.Info, withCAS bool) {
	var num [20]byte
	cn.w.WriteString("VALUE ")
	cn.w.Write(k)
	cn.w.WriteByte(' ')
	cn.w.Write(appendUint(num[:0], uint64(in.Flags)))
	cn.w.WriteByte(' ')
	cn.w.Write(appendUint(num[:0], uint64(len(v))))
	if withCAS {
		cn.w.WriteByte(' ')
		cn.w.Write(appendUint(num[:0], in.Version))
	}
	cn.w.WriteString("\r\n")
	cn.w.Write(v)
	cn.w.WriteString("\r\n")
}

// longGet reads a get line that did not end within the read buffer.
// Up to maxGetLine bytes it is gathered and run as any line; beyond, its
// keys are answered as they arrive.
func (cn *conn) longGet(first []byte) bool {
	buf := append(cn.long[:0], first...)
	defer func() {
		if cap(buf) <= 64<<10 {
			cn.long = buf[:0] // keep a small buffer; let a large one go
		}
	}()
	for len(buf) < maxGetLine {
		chunk, err := cn.r.ReadSlice('\n')
		buf = append(buf, chunk...)
		if err == nil {
			return cn.command(trimEOL(buf))
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return true
		}
	}
	return cn.streamGet(buf)
}

// streamGet answers a get line too long to hold: each key as it is
// read. Unlike memcached, a key over 250 bytes found here follows the
// answers already sent for the keys before it (docs/cache.md).
func (cn *conn) streamGet(buf []byte) bool {
	cn.noreply = false
	i := 0
	for buf[i] == ' ' {
		i++
	}
	ks := keyStream{cn: cn, withCAS: string(buf[i:i+4]) == "gets"}
	if ks.withCAS {
		i++
	}
	ks.feed(buf[i+3:], false)
	for {
		chunk, err := cn.r.ReadSlice('\n')
		switch {
		case err == nil:
			chunk = chunk[:len(chunk)-1]
			if n := len(chunk); n > 0 && chunk[n-1] == '\r' {
				chunk = chunk[:n-1]
			} else if n == 0 && len(ks.partial) > 0 && ks.partial[len(ks.partial)-1] == '\r' && ks.partialLen == len(ks.partial) {
				ks.partial = ks.partial[:len(ks.partial)-1]
				ks.partialLen--
			}
			ks.feed(chunk, true)
			if !ks.bad {
				cn.w.WriteString("END\r\n")
				cn.w.sent()
			}
			return false
		case errors.Is(err, bufio.ErrBufferFull):
			ks.feed(chunk, false)
		default:
			return true
		}
	}
}

// keyStream splits a streamed get line into keys and answers each.
type keyStream struct {
	cn         *conn
	withCAS    bool
	partial    []byte // a key cut by a chunk boundary (its first 251 bytes)
	partialLen int    // its whole length
	bad        bool   // a key over 250 bytes was answered with CLIENT_ERROR
	nul        bool   // a NUL ended the line for memcached
}

func (ks *keyStream) feed(data []byte, final bool) {
	if ks.bad || ks.nul {
		return
	}
	if i := indexByte(data, 0); i >= 0 {
		data, final, ks.nul = data[:i], true, true
	}
	for len(data) > 0 && !ks.bad {
		i := indexByte(data, ' ')
		if i < 0 {
			ks.add(data)
			break
		}
		ks.add(data[:i])
		ks.end()
		data = data[i+1:]
	}
	if final && !ks.bad {
		ks.end()
	}
}

func (ks *keyStream) add(b []byte) {
	ks.partialLen += len(b)
	if room := maxKey + 1 - len(ks.partial); room > 0 {
		ks.partial = append(ks.partial, b[:min(room, len(b))]...)
	}
}

func (ks *keyStream) end() {
	if ks.partialLen == 0 {
		return
	}
	k := ks.partial
	ks.partial, ks.partialLen = ks.partial[:0], 0
	if len(k) > maxKey {
		ks.bad = true
		ks.cn.w.cull()
		ks.cn.out(errBadFormat)
		return
	}
	ks.cn.fetch(k, ks.withCAS, false, 0, true)
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func appendUint(b []byte, v uint64) []byte {
	if v == 0 {
		return append(b, '0')
	}
	var d [20]byte
	i := len(d)
	for v > 0 {
		i--
		d[i] = byte('0' + v%10)
		v /= 10
	}
	return append(b, d[i:]...)
}

// readData reads a data block of n bytes and its \r\n. ok is false when
// the block does not end properly; closed when the connection ended.
func (cn *conn) readData(n int) (data []byte, ok, closed bool) {
	// The buffer grows as the data arrives (doubling, from 64 KiB): a
	// declared length alone commits no memory, and what a connection
	// holds is at most twice what its client really sent.
	need := n + 2
	buf := cn.scratch[:0]
	for len(buf) < need {
		chunk := min(need-len(buf), max(len(buf), keepBuf))
		if cap(buf)-len(buf) < chunk {
			nb := make([]byte, len(buf), len(buf)+chunk)
			copy(nb, buf)
			buf = nb
		}
		m, err := io.ReadFull(cn.r, buf[len(buf):len(buf)+chunk])
		buf = buf[:len(buf)+m]
		if err != nil {
			cn.scratch = buf
			return nil, false, true
		}
	}
	cn.scratch = buf
	data = buf[:need]
	if data[n] != '\r' || data[n+1] != '\n' {
		return nil, false, false
	}
	return data[:n], true, false
}

// discard drops n bytes (a refused value's data and its \r\n, which
// memcached swallows without looking at them).
func (cn *conn) discard(n int64) bool {
	_, err := io.CopyN(io.Discard, cn.r, n)
	return err == nil
}

// log is Logger, or a logger that logs nothing.
func (s *Server) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return discard
}

var discard = slog.New(slog.DiscardHandler)

// failed logs an error of the store that the protocol's answer does not
// tell: a miss, a lost compare-and-swap or a full store is an answer,
// not a failure.
func (s *Server) failed(op string, err error) {
	switch {
	case err == nil, errors.Is(err, cache.ErrNotFound), errors.Is(err, cache.ErrExists),
		errors.Is(err, cache.ErrFull), errors.Is(err, cache.ErrTooLarge):
	case errors.Is(err, context.Canceled):
		s.log().Debug("memcached: command cut short by Close", "op", op, "err", err)
	default:
		s.log().Warn("memcached: store failed", "op", op, "err", err)
	}
}

// store is the store served: Store, or the deprecated Pool.
func (s *Server) store() *cache.Store {
	if s.Store != nil {
		return s.Store
	}
	return s.Pool
}
