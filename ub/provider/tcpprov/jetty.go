package tcpprov

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

const (
	defaultCQDepth   = 4096
	defaultRecvDepth = 64
	defaultMaxMsg    = 64 << 10
)

// errCQFull is returned by a post when the completion queue has no room
// for the completions of what is already in flight plus the new requests.
var errCQFull = fmt.Errorf("tcpprov: %w", ub.ErrCQFull)

// cq is an in-memory completion queue.
type cq struct {
	*verbs.Queue
	c *Context
}

func (c *Context) NewCQ(cfg ub.CQConfig) (ub.CQ, error) {
	depth := cfg.Depth
	if depth <= 0 {
		depth = defaultCQDepth
	}
	q := &cq{Queue: verbs.NewQueue(depth), c: c}
	if err := c.track(q, nil); err != nil {
		return nil, err
	}
	return q, nil
}

// Close closes the queue: later calls fail, and waits return.
func (q *cq) Close() error {
	q.c.mu.Lock()
	q.c.objects.Remove(q)
	q.c.mu.Unlock()
	return q.Queue.Close()
}

func (q *cq) Poll(out []ub.Completion) (int, error) {
	n, err := q.Pop(out)
	if err != nil {
		return n, errClosed
	}
	return n, nil
}

func (q *cq) Wait(ctx context.Context) error { return q.WaitInterrupt(ctx, q.Interrupts()) }

// WaitInterrupt is Wait that also returns once Interrupt was called since
// Interrupts returned since (ub.Interrupter): simprov's own completions end
// its waits this way.
func (q *cq) WaitInterrupt(ctx context.Context, since uint64) error {
	for {
		// Take the broadcast before looking: a push or interrupt after
		// the look closes it, and every concurrent wait wakes.
		changed := q.Changed()
		if q.Closed() {
			return errClosed
		}
		if q.Len() > 0 || q.Interrupts() != since {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type postedRecv struct {
	ctx uint64
	seg *segment
	buf []byte
}

type jetty struct {
	c    *Context
	id   uint32
	cfg  ub.JettyConfig
	send *cq
	recv *cq

	postMu sync.Mutex // held by PostSend and Bind
	mu     sync.Mutex
	closed bool
	bind   verbs.Binding[*target]
	recvs  []postedRecv // posted receives, oldest first
	// order holds this jetty's requests in posting order; completions go
	// to the CQ only from the front, so they come out in order.
	order []*pending
}

func (c *Context) NewJetty(cfg ub.JettyConfig) (ub.Jetty, error) {
	send, ok1 := cfg.SendCQ.(*cq)
	recv, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("tcpprov: %w: a jetty needs SendCQ and RecvCQ made by this provider", ub.ErrForeignObject)
	}
	if cfg.Mode > ub.Unreliable {
		return nil, fmt.Errorf("tcpprov: %w: unknown mode %v", ub.ErrInvalidArgument, cfg.Mode)
	}
	if cfg.RecvDepth <= 0 {
		cfg.RecvDepth = defaultRecvDepth
	}
	if cfg.MaxMessage <= 0 {
		cfg.MaxMessage = defaultMaxMsg
	}
	j := &jetty{c: c, cfg: cfg, send: send, recv: recv, bind: verbs.Binding[*target]{Mode: cfg.Mode}}
	if err := c.track(j, func(id uint32) { j.id, c.jetties[id] = id, j }); err != nil {
		return nil, err
	}
	return j, nil
}

func (j *jetty) Desc() ub.JettyDesc {
	return ub.JettyDesc{Provider: Name, EID: j.c.eid, Name: j.c.descName("j", j.id)}
}

func (j *jetty) Bind(t ub.Target) error {
	tg, ok := t.(*target)
	if !ok {
		return fmt.Errorf("tcpprov: %w: Bind needs a target imported by this provider", ub.ErrForeignObject)
	}
	j.postMu.Lock()
	defer j.postMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.bind.Bind("tcpprov", tg)
}

func (j *jetty) PostRecv(wrs []ub.RecvWR) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, errClosed
	}
	for i, wr := range wrs {
		s, ok := wr.Buf.Seg.(*segment)
		if !ok || s.c != j.c {
			return i, fmt.Errorf("tcpprov: %w: a receive buffer must be a segment of the jetty's context", ub.ErrForeignObject)
		}
		if !verbs.InRange(wr.Buf.Offset, wr.Buf.Len, len(s.bytes)) {
			return i, fmt.Errorf("tcpprov: %w: receive buffer [%d, +%d) outside its %d-byte segment", ub.ErrInvalidArgument, wr.Buf.Offset, wr.Buf.Len, len(s.bytes))
		}
		if len(j.recvs) >= j.cfg.RecvDepth {
			return i, fmt.Errorf("tcpprov: %w (depth %d)", ub.ErrRecvQueueFull, j.cfg.RecvDepth)
		}
		j.recvs = append(j.recvs, postedRecv{ctx: wr.UserCtx, seg: s, buf: s.bytes[wr.Buf.Offset : wr.Buf.Offset+wr.Buf.Len]})
	}
	return len(wrs), nil
}

// deliver runs on the server side when a peer's message arrives; denied
// says the jetty is closed (as good as unknown) or the token wrong.
func (j *jetty) deliver(token ub.Token, payload []byte, op ub.Opcode, imm uint64, hasImm, dropIfNone bool) (status ub.Status, denied bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return ub.StatusFlushed, true
	}
	if token != j.cfg.Token {
		return ub.StatusBadToken, true
	}
	if len(payload) > j.cfg.MaxMessage {
		return ub.StatusRemoteLength, false
	}
	if len(j.recvs) > 0 && j.recv.Room() == 0 {
		// No room for the completion: do not use up the receive.
		return ub.StatusReceiverNotReady, false
	}
	if len(j.recvs) == 0 {
		if dropIfNone {
			return ub.StatusSuccess, false
		}
		return ub.StatusReceiverNotReady, false
	}
	r := j.recvs[0]
	j.recvs = j.recvs[1:]
	comp := ub.Completion{Op: op, UserCtx: r.ctx, Len: len(payload), Imm: imm, HasImm: hasImm}
	if op == ub.OpWriteImm {
		comp.Len = 0
	}
	status = ub.StatusSuccess
	switch {
	case r.seg.closed: // the caller holds c.mem
		status, comp.Len = ub.StatusFlushed, 0
	case len(payload) > len(r.buf):
		status, comp.Len = ub.StatusRemoteLength, 0
	default:
		copy(r.buf, payload)
	}
	comp.Status = status
	if !j.recv.Push(comp, false) {
		return ub.StatusReceiverNotReady, false
	}
	return status, false
}

func (j *jetty) local(l ub.Local) ([]byte, ub.Status) {
	s, ok := l.Seg.(*segment)
	if !ok || s.c != j.c || s.closed || !verbs.InRange(l.Offset, l.Len, len(s.bytes)) {
		return nil, ub.StatusLocalLength
	}
	return s.bytes[l.Offset : l.Offset+l.Len], ub.StatusSuccess
}

// PostSend sends each request to its peer (or completes it at once when it
// fails a local check), and flushes the connections it used.
func (j *jetty) PostSend(wrs []ub.WR) (int, error) {
	// postMu keeps this jetty's requests in posting order on the wire; mu
	// is never held across socket I/O, so answers can be taken in while a
	// large batch is still being written.
	j.postMu.Lock()
	defer j.postMu.Unlock()
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return 0, errClosed
	}
	if !j.send.Reserve(len(wrs)) {
		j.mu.Unlock()
		return 0, errCQFull
	}
	ps := make([]*pending, len(wrs))
	for i := range wrs {
		ps[i] = &pending{j: j, wr: wrs[i]}
		j.order = append(j.order, ps[i])
	}
	j.mu.Unlock()
	used := map[*conn]bool{}
	for _, p := range ps {
		if st := j.start(p, used); st != ub.StatusSuccess {
			j.mu.Lock()
			p.done, p.comp.Status = true, st
			j.mu.Unlock()
		}
	}
	for cn := range used {
		cn.flush()
	}
	j.complete()
	return len(wrs), nil
}

// start checks a request and hands it to the connection to its peer. A
// payload goes from its segment to the socket with the segment pinned,
// not under c.mem: a peer that stops reading holds up no one else.
func (j *jetty) start(p *pending, used map[*conn]bool) ub.Status {
	j.c.mem.RLock()
	req, addr, src, st := j.prepare(p)
	j.c.mem.RUnlock()
	if st != ub.StatusSuccess {
		return st
	}
	if len(req.payload) > maxFrame-reqHeader || (req.op == opRead && req.n > maxFrame-respHeader) {
		return ub.StatusLocalLength // larger than a frame may be
	}
	cn, err := j.c.dial(addr)
	if err != nil {
		return ub.StatusPeerDead
	}
	if st := cn.send(p, &req, src); st != ub.StatusSuccess {
		return st
	}
	used[cn] = true
	return ub.StatusSuccess
}

// prepare checks a request and makes its wire request, addressed to addr;
// src is the segment its payload is in. The caller holds c.mem for
// reading.
func (j *jetty) prepare(p *pending) (req request, addr string, src *segment, st ub.Status) {
	wr := &p.wr
	switch wr.Op {
	case ub.OpWrite, ub.OpWriteImm, ub.OpRead, ub.OpCAS, ub.OpFetchAdd:
		if j.cfg.Mode == ub.Unreliable {
			return req, addr, nil, ub.StatusUnsupported
		}
		r, ok := wr.Remote.Seg.(*remoteSegment)
		if !ok {
			return req, addr, nil, ub.StatusUnsupported
		}
		if wr.Remote.Offset < 0 {
			return req, addr, nil, ub.StatusOutOfBounds
		}
		addr = r.addr
		req = request{token: uint32(r.token), object: r.id, offset: uint64(wr.Remote.Offset)}
		switch wr.Op {
		case ub.OpWrite, ub.OpWriteImm:
			buf, st := j.local(wr.Local)
			if st != ub.StatusSuccess {
				return req, addr, nil, st
			}
			req.op, req.payload = opWrite, buf
			if wr.Op == ub.OpWriteImm {
				t, st := j.bind.Target(wr.Target)
				if st != ub.StatusSuccess {
					return req, addr, nil, st
				}
				if t.addr != r.addr {
					return req, addr, nil, ub.StatusUnsupported // the notification must go where the data goes
				}
				// n carries the jetty's token: the segment's may differ.
				req.op, req.a, req.b, req.n = opWriteImm, uint64(t.id), wr.Imm, uint32(t.token)
			}
			p.comp.Len = len(buf)
		case ub.OpRead:
			buf, st := j.local(wr.Local)
			if st != ub.StatusSuccess {
				return req, addr, nil, st
			}
			req.op, req.n, p.into, p.seg = opRead, uint32(len(buf)), buf, wr.Local.Seg.(*segment)
			p.comp.Len = len(buf)
		case ub.OpCAS, ub.OpFetchAdd:
			if wr.Local.Seg != nil {
				l := wr.Local
				l.Len = 8
				buf, st := j.local(l)
				if st != ub.StatusSuccess {
					return req, addr, nil, st
				}
				p.into, p.seg = buf, l.Seg.(*segment)
			}
			req.op, req.a, req.b = opFetchAdd, wr.Add, 0
			if wr.Op == ub.OpCAS {
				req.op, req.a, req.b = opCAS, wr.Compare, wr.Swap
			}
			p.comp.Len = 8
		}
	case ub.OpSend, ub.OpSendImm:
		buf, st := j.local(wr.Local)
		if st != ub.StatusSuccess {
			return req, addr, nil, st
		}
		if len(buf) > j.cfg.MaxMessage {
			return req, addr, nil, ub.StatusLocalLength
		}
		t, st := j.bind.Target(wr.Target)
		if st != ub.StatusSuccess {
			return req, addr, nil, st
		}
		addr = t.addr
		req = request{op: opSend, token: uint32(t.token), object: t.id, payload: buf, a: wr.Imm}
		if wr.Op == ub.OpSendImm {
			req.flags = flagImm
		}
		if j.cfg.Mode == ub.Unreliable {
			req.flags |= flagUnreliable
		}
		p.comp.Len = len(buf)
	default:
		return req, addr, nil, ub.StatusUnsupported
	}
	if req.payload != nil {
		src = wr.Local.Seg.(*segment)
		p.seg = src
	}
	return req, addr, src, ub.StatusSuccess
}

// complete moves finished requests from the front of the order to the CQ.
func (j *jetty) complete() {
	// Push while holding mu: two connections finishing at once must not
	// interleave their completions.
	j.mu.Lock()
	defer j.mu.Unlock()
	for len(j.order) > 0 && j.order[0].done {
		p := j.order[0]
		j.order = j.order[1:]
		c := p.comp
		c.Op, c.UserCtx = p.wr.Op, p.wr.UserCtx
		if c.Status != ub.StatusSuccess {
			c.Len = 0
		}
		j.send.Push(c, true)
	}
}

func (j *jetty) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	recvs := j.recvs
	j.recvs = nil
	j.mu.Unlock()
	j.c.mu.Lock()
	delete(j.c.jetties, j.id)
	j.c.objects.Remove(j)
	j.c.mu.Unlock()
	for _, r := range recvs {
		j.recv.Push(ub.Completion{Status: ub.StatusFlushed, Op: ub.OpRecv, UserCtx: r.ctx}, false)
	}
	return nil
}

// pending is a request in flight.
type pending struct {
	j    *jetty
	wr   ub.WR
	into []byte   // where a Read's data or an atomic's old value goes
	seg  *segment // the segment into lies in
	comp ub.Completion
	done bool
}

// fill reads a Read's data from r into place, pinning its segment for
// each piece of at most pinChunk. Should the segment close meanwhile, the
// rest of the data is read and dropped (the connection stays in step) and
// filled is false.
func (p *pending) fill(r io.Reader, nc net.Conn) (filled bool, err error) {
	for off := 0; off < len(p.into); {
		p.j.c.mem.RLock()
		ok := p.seg.pin(nc)
		p.j.c.mem.RUnlock()
		if !ok {
			_, err := io.CopyN(io.Discard, r, int64(len(p.into)-off))
			return false, err
		}
		if h := p.j.c.opt.pinned; h != nil {
			h()
		}
		k := min(len(p.into)-off, pinChunk)
		_, err := io.ReadFull(r, p.into[off:off+k])
		p.seg.progress(nc, k)
		p.seg.unpin(nc)
		if err != nil {
			return false, err
		}
		off += k
	}
	return true, nil
}

// finish records the peer's answer and lets the jetty release completions;
// filled says a Read's data is in place already.
func (p *pending) finish(status ub.Status, value uint64, payload []byte, filled bool) {
	p.end(status, value, payload, filled, false)
}

// broke finishes p with status because its connection broke under it.
func (p *pending) broke(status ub.Status) { p.end(status, 0, nil, false, true) }

// end is finish; broken says the connection broke under p, which its
// local segment's Close may have done: then, as when a successful answer
// has nowhere to go, a closed local segment is the status. A peer's own
// refusal is kept.
func (p *pending) end(status ub.Status, value uint64, payload []byte, filled, broken bool) {
	p.j.c.mem.RLock()
	p.j.mu.Lock()
	p.comp.Status, p.comp.Value = status, value
	closed := p.seg != nil && p.seg.closed
	switch {
	case closed && (broken || status == ub.StatusSuccess && p.into != nil):
		p.comp.Status = ub.StatusLocalLength
	case status == ub.StatusSuccess && p.into != nil && !filled:
		if p.wr.Op == ub.OpRead {
			if len(payload) != len(p.into) {
				p.comp.Status = ub.StatusRemoteLength
			} else {
				copy(p.into, payload)
			}
		} else {
			binary.LittleEndian.PutUint64(p.into, value)
		}
	}
	p.done = true
	p.j.mu.Unlock()
	p.j.c.mem.RUnlock()
	p.j.complete()
}

// conn is a client connection to one peer. Requests are written in order
// and answered in order, so answers match the queue of pending requests.
// wmu serializes writes (and is held across socket I/O); mu guards the
// queue and is never held across I/O, so answers keep flowing while a large
// request is being written.
type conn struct {
	nc      net.Conn
	wmu     sync.Mutex
	w       *bufio.Writer
	scratch []byte
	mu      sync.Mutex
	queue   []*pending
	broken  bool
	failed  ub.Status // what fail gave the requests in flight
}

// dial returns the connection to addr, opening it if needed.
func (c *Context) dial(addr string) (*conn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errClosed
	}
	if cn := c.conns[addr]; cn != nil && !cn.isBroken() {
		c.mu.Unlock()
		return cn, nil
	}
	c.mu.Unlock()
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		// A peer host that vanishes without a reset is noticed too.
		tc.SetKeepAlive(true)
		tc.SetKeepAlivePeriod(time.Second)
	}
	cn := &conn{nc: nc, w: bufio.NewWriterSize(nc, 64<<10)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		nc.Close()
		return nil, errClosed
	}
	// Another caller may have connected meanwhile: everything to one peer
	// goes over one connection, or requests could overtake each other.
	if other := c.conns[addr]; other != nil && !other.isBroken() {
		c.mu.Unlock()
		nc.Close()
		return other, nil
	}
	c.conns[addr] = cn
	c.mu.Unlock()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		cn.readLoop()
		// Broken: a later dial makes a new one, and a peer that went
		// away for good leaves nothing behind.
		c.mu.Lock()
		if c.conns[addr] == cn {
			delete(c.conns, addr)
		}
		c.mu.Unlock()
	}()
	return cn, nil
}

func (cn *conn) isBroken() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.broken
}

// send queues p and writes its request; once queued (StatusSuccess), p
// completes through the queue: by its answer, or by fail if the
// connection breaks. src, if not nil, is the segment the payload is in:
// pinned for the write once it is this request's turn on the connection
// (a pin waiting its turn would look stalled to src's Close), and
// StatusLocalLength if it closed before.
func (cn *conn) send(p *pending, req *request, src *segment) ub.Status {
	c := p.j.c
	if c.opt.sending != nil {
		c.opt.sending()
	}
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	if src != nil {
		c.mem.RLock()
		ok := src.pin(cn.nc)
		c.mem.RUnlock()
		if !ok {
			return ub.StatusLocalLength
		}
		defer src.unpin(cn.nc)
		if c.opt.pinned != nil {
			c.opt.pinned()
		}
	}
	cn.mu.Lock()
	if cn.broken {
		cn.mu.Unlock()
		return ub.StatusPeerDead
	}
	cn.queue = append(cn.queue, p)
	cn.mu.Unlock()
	cn.scratch = req.appendHeader(cn.scratch[:0])
	_, err := cn.w.Write(cn.scratch)
	if err == nil && src != nil {
		// A large payload goes straight from the segment to the socket.
		err = src.write(cn.w, cn.nc, req.payload)
	}
	if err != nil {
		// The reader sees the closed connection and fails the queue.
		cn.nc.Close()
	}
	return ub.StatusSuccess
}

func (cn *conn) flush() {
	cn.wmu.Lock()
	err := cn.w.Flush()
	cn.wmu.Unlock()
	if err != nil {
		cn.nc.Close()
	}
}

func (cn *conn) readLoop() {
	r := bufio.NewReaderSize(cn.nc, 64<<10)
	var hdr [respHeader]byte
	var buf []byte
	for {
		n, err := readLength(r, respHeader)
		if err == nil {
			_, err = io.ReadFull(r, hdr[:])
		}
		if err != nil {
			cn.fail(ub.StatusPeerDead)
			return
		}
		resp, _ := decodeResponse(hdr[:])
		cn.mu.Lock()
		if len(cn.queue) == 0 {
			cn.mu.Unlock()
			cn.fail(ub.StatusPeerDead) // an answer nobody asked for: drop the peer
			return
		}
		p := cn.queue[0]
		cn.queue = cn.queue[1:]
		cn.mu.Unlock()
		// p is off the queue: a failure from here on finishes it here.
		size := n - respHeader
		if resp.status == uint8(ub.StatusSuccess) && p.wr.Op == ub.OpRead && size == len(p.into) {
			// A Read's data goes from the socket straight into place.
			filled, err := p.fill(r, cn.nc)
			if err != nil {
				p.broke(cn.failure())
				cn.fail(ub.StatusPeerDead)
				return
			}
			p.finish(ub.StatusSuccess, 0, nil, filled)
			continue
		}
		if buf, err = readBody(r, buf, size); err != nil {
			p.broke(cn.failure())
			cn.fail(ub.StatusPeerDead)
			return
		}
		p.finish(ub.Status(resp.status), resp.value, buf, false)
	}
}

// failure is the status of a request taken off the queue when the
// connection broke under its answer: what fail gave the rest (Flushed
// when the context closed), else StatusPeerDead. (finish makes it
// StatusLocalLength if the request's local segment closed.)
func (cn *conn) failure() ub.Status {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.broken {
		return cn.failed
	}
	return ub.StatusPeerDead
}

// fail closes the connection and completes everything in flight on it.
func (cn *conn) fail(status ub.Status) {
	cn.mu.Lock()
	if !cn.broken {
		cn.broken, cn.failed = true, status
	}
	q := cn.queue
	cn.queue = nil
	cn.mu.Unlock()
	cn.nc.Close()
	for _, p := range q {
		p.broke(status)
	}
}
