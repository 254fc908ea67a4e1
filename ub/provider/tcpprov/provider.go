package tcpprov

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

// Name is the provider's registered name.
const Name = "tcp"

func init() { ub.Register(Name, provider{}) }

type provider struct{}

// errClosed is returned for calls on a closed object.
var errClosed = fmt.Errorf("tcpprov: %w", ub.ErrClosed)

func (provider) Open(_ context.Context, cfg ub.Config) (ub.Context, error) {
	return open(cfg, options{connsPerSource: maxConnsPerSource, conns: maxConns})
}

// options fix how a context serves peers; tests change them.
type options struct {
	connsPerSource, conns int // the caps on connections served at once
	// Hooks for tests, nil in use: tarpitted runs as a connection starts
	// to wait d out after a failure, servedChanged once a connection joined
	// or left the served set, pinned once a segment is pinned for a socket
	// write (of a Read's answer, of a payload) or read (of a Read's data),
	// sending as a request is about to wait for its turn on its connection,
	// looked after each look a segment's Close takes at the transfers it
	// waits for.
	tarpitted     func(d time.Duration)
	servedChanged func()
	pinned        func()
	sending       func()
	looked        func()
}

func open(cfg ub.Config, opt options) (*Context, error) {
	addr := cfg.Options["listen"]
	if addr == "" {
		addr = os.Getenv("UB_TCP_LISTEN")
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcpprov: listen on %s (set Options[\"listen\"] or UB_TCP_LISTEN): %w", addr, fdlimit.Hint(err))
	}
	// Descriptors carry the address peers dial: the listen address, unless
	// it is a wildcard or Options["advertise"] says otherwise.
	advertise := cfg.Options["advertise"]
	if advertise == "" {
		advertise = l.Addr().String()
		if host, port, err := net.SplitHostPort(advertise); err == nil {
			if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
				l.Close()
				return nil, fmt.Errorf("tcpprov: listening on %s, peers need an address to dial: set Options[\"advertise\"] (e.g. \"10.0.0.5:%s\")", advertise, port)
			}
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Context{l: l, addr: advertise, opt: opt, log: log, done: make(chan struct{}),
		segs: map[uint32]*segment{}, jetties: map[uint32]*jetty{}, conns: map[string]*conn{},
		served: map[net.Conn]struct{}{}, sources: map[netip.Prefix]int{}}
	if _, err := io.ReadFull(rand.Reader, c.eid[:]); err != nil {
		l.Close()
		return nil, err
	}
	c.wg.Add(1)
	go c.accept()
	return c, nil
}

// Context is an endpoint of the tcp provider.
type Context struct {
	eid  ub.EID
	l    net.Listener
	addr string
	opt  options
	log  *slog.Logger
	wg   sync.WaitGroup
	done chan struct{} // closed by Close
	// fails is what requests failing authorization cost their sources.
	fails failLimiter
	// mem guards every segment's closed flag: accesses hold it for
	// reading while they copy, or while they pin the segment for socket
	// I/O; a segment's Close takes it for writing to set the flag, then
	// waits for the pins (segment.drain) before the memory goes.
	mem sync.RWMutex

	mu      sync.Mutex
	closed  bool
	segs    map[uint32]*segment
	jetties map[uint32]*jetty
	conns   map[string]*conn // client connections, by peer address
	served  map[net.Conn]struct{}
	sources map[netip.Prefix]int // served connections by source
	objects verbs.Objects        // open segments, queues and jetties
}

func (c *Context) EID() ub.EID      { return c.eid }
func (c *Context) Provider() string { return Name }

// Addr is the address peers reach this context at.
func (c *Context) Addr() string { return c.addr }

// track adds o to what Close closes. Given place (for a segment or a jetty),
// it also picks a wire id for o and calls place with it in the same critical
// section, so that no other object gets the id before o is where requests
// find it.
func (c *Context) track(o io.Closer, place func(id uint32)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errClosed
	}
	c.objects.Add(o)
	if place != nil {
		place(c.newID())
	}
	return nil
}

// isClosed reports whether Close was called.
func (c *Context) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// newID picks a wire id for a segment or a jetty: random, so that a peer
// cannot know one without being told, non-zero and unused by either. The
// caller holds c.mu.
func (c *Context) newID() uint32 {
	var b [4]byte
	for {
		rand.Read(b[:]) // it crashes the program rather than fail
		id := binary.LittleEndian.Uint32(b[:])
		if id != 0 && c.segs[id] == nil && c.jetties[id] == nil {
			return id
		}
	}
}

// Close stops serving peers, fails requests in flight and closes everything
// the context made.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.done)
	objs, conns := c.objects.Drain(), c.conns
	c.conns = nil
	served := make([]net.Conn, 0, len(c.served))
	for nc := range c.served {
		served = append(served, nc)
	}
	c.mu.Unlock()
	// Requests in flight are flushed before the served connections go
	// (a context reading its own memory would see them go first).
	for _, cn := range conns {
		cn.fail(ub.StatusFlushed)
	}
	for _, nc := range served {
		nc.Close()
	}
	err := c.l.Close()
	// Nothing serves or answers any more: now memory can go.
	c.wg.Wait()
	var errs []error
	for _, o := range objs {
		errs = append(errs, o.Close())
	}
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return errors.Join(append(errs, err)...)
}

// name and parse a descriptor's Name: "<address>/<kind><id>".
func (c *Context) descName(kind string, id uint32) string {
	return c.addr + "/" + kind + strconv.FormatUint(uint64(id), 10)
}

func parseName(name, kind string) (addr string, id uint32, err error) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 || !strings.HasPrefix(name[i+1:], kind) {
		return "", 0, fmt.Errorf("tcpprov: %w: %q is not a %s descriptor name", ub.ErrBadDescriptor, name, kind)
	}
	n, err := strconv.ParseUint(name[i+1+len(kind):], 10, 32)
	if err != nil {
		return "", 0, fmt.Errorf("tcpprov: %w: %q: bad id: %w", ub.ErrBadDescriptor, name, err)
	}
	return name[:i], uint32(n), nil
}

// segment is registered local memory. An allocated one lives in an
// anonymous shared memory segment; a registered one is the caller's memory
// (mem nil). Remote atomics are real atomics on the words local code sees.
type segment struct {
	c      *Context
	id     uint32
	mem    *shm.Segment // nil for the caller's memory (RegisterSegment)
	bytes  []byte
	access ub.Access
	token  ub.Token
	closed bool // guarded by c.mem

	// pinned holds, by connection, the socket reads and writes in
	// progress straight into or out of the memory without c.mem (so that
	// a slow peer holds up no one else), and the bytes each connection's
	// moved. Close waits for them, breaking each connection that moved
	// nothing for drainGrace.
	pinMu   sync.Mutex
	pinned  map[net.Conn]*pins
	drained chan struct{} // made by drain, closed once pinned is empty
	// closeDone is made by the first Close (under c.mem) and closed as it
	// returns: a concurrent Close waits for it.
	closeDone chan struct{}
}

// pins are a connection's pins of a segment.
type pins struct {
	n     int    // transfers under way
	moved uint64 // their bytes so far
}

// drainGrace is how long a segment's Close lets a connection's socket I/O
// on its memory go without progress before it breaks the connection;
// pinChunk is the most a pinned socket read or write moves at once, so a
// transfer shows progress at least every pinChunk bytes.
const (
	drainGrace = time.Second
	pinChunk   = 256 << 10
)

// pin keeps s's memory for socket I/O on nc outside c.mem, until unpin;
// false if s is closed. The caller holds c.mem for reading.
func (s *segment) pin(nc net.Conn) bool {
	if s.closed {
		return false
	}
	s.pinMu.Lock()
	if s.pinned == nil {
		s.pinned = map[net.Conn]*pins{}
	}
	ps := s.pinned[nc]
	if ps == nil {
		ps = &pins{}
		s.pinned[nc] = ps
	}
	ps.n++
	s.pinMu.Unlock()
	return true
}

func (s *segment) unpin(nc net.Conn) {
	s.pinMu.Lock()
	ps := s.pinned[nc]
	if ps.n--; ps.n == 0 {
		delete(s.pinned, nc)
		if len(s.pinned) == 0 && s.drained != nil {
			close(s.drained)
			s.drained = nil
		}
	}
	s.pinMu.Unlock()
}

// progress counts k bytes moved on nc, which pins s.
func (s *segment) progress(nc net.Conn, k int) {
	s.pinMu.Lock()
	s.pinned[nc].moved += uint64(k)
	s.pinMu.Unlock()
}

// write writes b, memory of s that the caller pinned for nc, to w in
// pieces of at most pinChunk, counting them as progress.
func (s *segment) write(w io.Writer, nc net.Conn, b []byte) error {
	for len(b) > 0 {
		k := min(len(b), pinChunk)
		if _, err := w.Write(b[:k]); err != nil {
			return err
		}
		s.progress(nc, k)
		b = b[k:]
	}
	return nil
}

// drain waits until the I/O that pinned s is done, breaking each
// connection that moved nothing since the look before, every drainGrace.
// s is closed, so nothing pins it again; a connection's transfers are at
// most a frame (a Read being filled stops at its piece under way; on a
// client connection a payload's write may move while such a fill stalls,
// the two counted together), so a peer that keeps its transfers moving
// holds drain for at most about maxFrame/pinChunk looks.
func (s *segment) drain() {
	s.pinMu.Lock()
	if len(s.pinned) == 0 {
		s.pinMu.Unlock()
		return
	}
	done := make(chan struct{})
	s.drained = done
	s.pinMu.Unlock()
	t := time.NewTicker(drainGrace)
	defer t.Stop()
	seen := map[net.Conn]uint64{}
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		s.pinMu.Lock()
		for nc, ps := range s.pinned {
			if last, ok := seen[nc]; ok && last == ps.moved {
				nc.Close() // the read or write blocked on a stalled peer returns
			}
			seen[nc] = ps.moved
		}
		s.pinMu.Unlock()
		if h := s.c.opt.looked; h != nil {
			h()
		}
	}
}

func (c *Context) AllocSegment(size int, cfg ub.SegmentConfig) (ub.Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("tcpprov: %w: segment size %d must be positive", ub.ErrInvalidArgument, size)
	}
	m, err := shm.CreateMemfd("tcpprov", size, nil)
	if err != nil {
		return nil, fmt.Errorf("tcpprov: allocate segment: %w", fdlimit.Hint(err))
	}
	s := &segment{c: c, mem: m, bytes: m.Data()[:size:size], access: cfg.Access.Normalize(), token: cfg.Token}
	if err := c.track(s, func(id uint32) { s.id, c.segs[id] = id, s }); err != nil {
		m.Close()
		return nil, err
	}
	return s, nil
}

// RegisterSegment registers the caller's memory directly: remote
// requests are served from mem as from an allocated segment's memory.
func (c *Context) RegisterSegment(mem []byte, cfg ub.SegmentConfig) (ub.Segment, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("tcpprov: %w: no memory to register", ub.ErrInvalidArgument)
	}
	s := &segment{c: c, bytes: mem[:len(mem):len(mem)], access: cfg.Access.Normalize(), token: cfg.Token}
	if err := c.track(s, func(id uint32) { s.id, c.segs[id] = id, s }); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *segment) Bytes() []byte { return s.bytes }
func (s *segment) Desc() ub.SegmentDesc {
	return ub.SegmentDesc{Provider: Name, EID: s.c.eid, Name: s.c.descName("s", s.id), Size: len(s.bytes)}
}

func (s *segment) Close() error {
	s.c.mem.Lock()
	if s.closed {
		done := s.closeDone
		s.c.mem.Unlock()
		<-done // the first Close's drain and unmapping
		return nil
	}
	s.closed = true
	s.closeDone = make(chan struct{})
	defer close(s.closeDone)
	s.c.mu.Lock()
	delete(s.c.segs, s.id)
	s.c.objects.Remove(s)
	s.c.mu.Unlock()
	s.c.mem.Unlock()
	// Requests that found s in time have it pinned or are done with it;
	// none finds it now.
	s.drain()
	if s.mem == nil {
		return nil // the caller's memory stays the caller's
	}
	return s.mem.Close()
}

// remoteSegment is a peer's segment: its address, id and our token.
type remoteSegment struct {
	desc  ub.SegmentDesc
	addr  string
	id    uint32
	token ub.Token
}

func (c *Context) ImportSegment(desc ub.SegmentDesc, token ub.Token) (ub.RemoteSegment, error) {
	if desc.Provider != Name {
		return nil, fmt.Errorf("tcpprov: %w: cannot import a %q segment", ub.ErrBadDescriptor, desc.Provider)
	}
	addr, id, err := parseName(desc.Name, "s")
	if err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, errClosed
	}
	return &remoteSegment{desc: desc, addr: addr, id: id, token: token}, nil
}

func (r *remoteSegment) Desc() ub.SegmentDesc { return r.desc }
func (r *remoteSegment) Close() error         { return nil }

// target is a peer's jetty.
type target struct {
	desc  ub.JettyDesc
	addr  string
	id    uint32
	token ub.Token
}

func (c *Context) ImportJetty(desc ub.JettyDesc, token ub.Token) (ub.Target, error) {
	if desc.Provider != Name {
		return nil, fmt.Errorf("tcpprov: %w: cannot import a %q jetty", ub.ErrBadDescriptor, desc.Provider)
	}
	addr, id, err := parseName(desc.Name, "j")
	if err != nil {
		return nil, err
	}
	if c.isClosed() {
		return nil, errClosed
	}
	return &target{desc: desc, addr: addr, id: id, token: token}, nil
}

func (t *target) Desc() ub.JettyDesc { return t.desc }
func (t *target) Close() error       { return nil }

// accept serves peers' requests, one goroutine per connection, up to the
// caps on connections. Requests on a connection run in order and are
// answered in order.
func (c *Context) accept() {
	defer c.wg.Done()
	for {
		nc, err := c.l.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				c.log.Warn("tcpprov: stopped accepting peers", "addr", c.addr, "err", err)
			}
			return
		}
		src := sourceOf(nc.RemoteAddr())
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			nc.Close()
			return
		}
		if len(c.served) >= c.opt.conns || c.sources[src] >= c.opt.connsPerSource {
			// Beyond a cap: hang up at once.
			c.mu.Unlock()
			c.log.Warn("tcpprov: hung up on a peer: too many connections", "addr", c.addr, "from", nc.RemoteAddr().String())
			nc.Close()
			continue
		}
		c.served[nc] = struct{}{}
		c.sources[src]++
		c.mu.Unlock()
		c.servedChanged()
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.serve(nc, src)
			c.mu.Lock()
			delete(c.served, nc)
			if c.sources[src]--; c.sources[src] == 0 {
				delete(c.sources, src)
			}
			c.mu.Unlock()
			nc.Close()
			c.servedChanged()
		}()
	}
}

// servedChanged runs the test's hook, if set.
func (c *Context) servedChanged() {
	if c.opt.servedChanged != nil {
		c.opt.servedChanged()
	}
}

func (c *Context) serve(nc net.Conn, src netip.Prefix) {
	r := bufio.NewReaderSize(nc, 64<<10)
	w := bufio.NewWriterSize(nc, 64<<10)
	var buf, out []byte
	for {
		frame, err := readFrame(r, buf, reqHeader)
		if err != nil {
			// EOF, reset, or a malformed frame: drop the peer.
			if !errors.Is(err, io.EOF) {
				c.log.Debug("tcpprov: dropped a peer", "addr", c.addr, "from", nc.RemoteAddr().String(), "err", err)
			}
			return
		}
		buf = frame
		req, err := decodeRequest(frame)
		if err != nil {
			c.log.Warn("tcpprov: dropped a peer: a request that does not decode", "addr", c.addr, "from", nc.RemoteAddr().String(), "err", err)
			return
		}
		c.mem.RLock()
		status, value, payload, from, denied := c.execute(&req)
		if from != nil && !from.pin(nc) {
			// Found under c.mem, which Close takes: not closed; but
			// should it be, the answer is the closed segment's.
			status, payload, from = ub.StatusNoPermission, nil, nil
		}
		out = appendResponseHeader(out[:0], uint8(status), value, len(payload))
		c.mem.RUnlock()
		if from != nil && c.opt.pinned != nil {
			c.opt.pinned()
		}
		if denied {
			c.log.Debug("tcpprov: denied a request", "addr", c.addr, "from", nc.RemoteAddr().String(), "status", status.String())
			if d := c.fails.fail(src, time.Now()); d > 0 {
				// The answers made so far go out before the wait.
				if err := w.Flush(); err != nil || !c.tarpit(d) {
					return
				}
			}
		}
		_, err = w.Write(out)
		if from != nil {
			// A Read's data goes from the segment to the socket (a large
			// one without a copy); until it is out, s stays pinned.
			if err == nil {
				err = from.write(w, nc, payload)
			}
			from.unpin(nc)
		}
		if err != nil {
			return
		}
		// Answer at once unless more requests are already here.
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// tarpit waits d, or until the context closes; it reports whether the wait
// ran its course.
func (c *Context) tarpit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	if c.opt.tarpitted != nil {
		c.opt.tarpitted(d)
	}
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}

// execute runs one request against local objects, with the checks a bus
// target makes. A Read's payload is memory of from, which the caller pins
// before it lets go of c.mem. denied says the request failed
// authorization: it named an unknown segment or jetty, or had a wrong
// token.
func (c *Context) execute(req *request) (status ub.Status, value uint64, payload []byte, from *segment, denied bool) {
	switch req.op {
	case opSend:
		st, denied := c.deliver(req.object, ub.Token(req.token), req.payload, ub.OpRecv, req.a, req.flags&flagImm != 0, req.flags&flagUnreliable != 0)
		return st, 0, nil, nil, denied
	}
	c.mu.Lock()
	s := c.segs[req.object]
	c.mu.Unlock()
	if s == nil {
		return ub.StatusNoPermission, 0, nil, nil, true
	}
	if ub.Token(req.token) != s.token {
		return ub.StatusBadToken, 0, nil, nil, true
	}
	need := map[uint8]ub.Access{opWrite: ub.AccessWrite, opWriteImm: ub.AccessWrite, opRead: ub.AccessRead, opCAS: ub.AccessAtomic, opFetchAdd: ub.AccessAtomic}[req.op]
	if s.access&need != need {
		return ub.StatusNoPermission, 0, nil, nil, false
	}
	n := uint64(req.n)
	if req.op == opWrite || req.op == opWriteImm {
		n = uint64(len(req.payload))
	}
	if req.op == opCAS || req.op == opFetchAdd {
		n = 8
	}
	if req.offset > uint64(len(s.bytes)) || n > uint64(len(s.bytes))-req.offset {
		return ub.StatusOutOfBounds, 0, nil, nil, false
	}
	off := int(req.offset)
	switch req.op {
	case opWrite, opWriteImm:
		copy(s.bytes[off:], req.payload)
		if req.op == opWriteImm {
			// The notification's jetty and token are checked like a send's.
			if st, denied := c.deliver(uint32(req.a), ub.Token(req.n), nil, ub.OpWriteImm, req.b, true, false); st != ub.StatusSuccess {
				return st, 0, nil, nil, denied
			}
		}
		return ub.StatusSuccess, 0, nil, nil, false
	case opRead:
		return ub.StatusSuccess, 0, s.bytes[off : off+int(n)], s, false
	}
	if off%8 != 0 {
		return ub.StatusMisaligned, 0, nil, nil, false
	}
	// In range (checked above): an error is a word not 8-byte aligned in
	// memory, which registered memory may not be at an aligned offset.
	word, err := shm.WordIn(s.bytes, off)
	if err != nil {
		return ub.StatusMisaligned, 0, nil, nil, false
	}
	if req.op == opCAS {
		for {
			old := word.Load()
			if old != req.a || word.CompareAndSwap(old, req.b) {
				return ub.StatusSuccess, old, nil, nil, false
			}
		}
	}
	return ub.StatusSuccess, word.Add(req.a) - req.a, nil, nil, false
}

// deliver puts an incoming message into the jetty's next posted receive;
// denied says the jetty is unknown or the token wrong.
func (c *Context) deliver(jid uint32, token ub.Token, payload []byte, op ub.Opcode, imm uint64, hasImm, dropIfNone bool) (status ub.Status, denied bool) {
	c.mu.Lock()
	j := c.jetties[jid]
	c.mu.Unlock()
	if j == nil {
		return ub.StatusFlushed, true
	}
	return j.deliver(token, payload, op, imm, hasImm, dropIfNone)
}
