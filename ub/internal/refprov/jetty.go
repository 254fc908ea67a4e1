package refprov

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/ubkit-io/ubkit/ub"
)

const (
	defaultCQDepth   = 4096
	defaultRecvDepth = 64
	defaultMaxMsg    = 64 << 10
)

// cq is a completion queue in memory. It is a ub.Interrupter.
type cq struct {
	c        *Context
	mu       sync.Mutex
	items    []ub.Completion
	depth    int
	reserved int // room promised to requests that are running
	closed   bool
	intrs    uint64
	changed  chan struct{} // closed at the next push, interrupt or close
}

func (c *Context) NewCQ(cfg ub.CQConfig) (ub.CQ, error) {
	depth := cfg.Depth
	if depth <= 0 {
		depth = defaultCQDepth
	}
	q := &cq{c: c, depth: depth, changed: make(chan struct{})}
	if err := c.track(q, nil); err != nil {
		return nil, err
	}
	return q, nil
}

// wake ends the waits in progress (mu held).
func (q *cq) wake() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// reserve sets room aside for one completion.
func (q *cq) reserve() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.closed:
		return errClosed
	case len(q.items)+q.reserved >= q.depth:
		return errCQFull
	}
	q.reserved++
	return nil
}

// push adds a completion, into room reserved for it if reserved, else
// whether or not there is room (a flushed receive is never lost).
func (q *cq) push(comp ub.Completion, reserved bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if reserved {
		q.reserved--
	}
	if q.closed {
		return
	}
	q.items = append(q.items, comp)
	q.wake()
}

func (q *cq) Poll(out []ub.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, errClosed
	}
	n := copy(out, q.items)
	q.items = q.items[n:]
	return n, nil
}

func (q *cq) Wait(ctx context.Context) error { return q.WaitInterrupt(ctx, q.Interrupts()) }

func (q *cq) Interrupt() {
	q.mu.Lock()
	q.intrs++
	q.wake()
	q.mu.Unlock()
}

func (q *cq) Interrupts() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.intrs
}

func (q *cq) WaitInterrupt(ctx context.Context, since uint64) error {
	for {
		q.mu.Lock()
		closed, ready, changed := q.closed, len(q.items) > 0 || q.intrs != since, q.changed
		q.mu.Unlock()
		switch {
		case closed:
			return errClosed
		case ready:
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (q *cq) Close() error {
	q.mu.Lock()
	if !q.closed {
		q.closed = true
		q.items = nil
		q.wake()
	}
	q.mu.Unlock()
	q.c.untrack(q)
	return nil
}

// posted is a posted receive.
type posted struct {
	userCtx uint64
	seg     *segment
	off, n  int
}

type jetty struct {
	c          *Context
	id         uint32
	mode       ub.Mode
	depth      int
	maxMsg     int
	token      ub.Token
	send, recv *cq
	closed     atomic.Bool

	// sendMu serializes PostSend and Bind, so requests leave in posting
	// order; recvMu guards the posted receives, which peers' requests
	// consume while a PostSend of this jetty waits for an answer.
	sendMu sync.Mutex
	bound  *target
	recvMu sync.Mutex
	recvs  []posted
}

func (c *Context) NewJetty(cfg ub.JettyConfig) (ub.Jetty, error) {
	send, ok1 := cfg.SendCQ.(*cq)
	recv, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 || send.c != c || recv.c != c {
		return nil, fmt.Errorf("refprov: %w: a jetty's SendCQ and RecvCQ must come from its own context", ub.ErrForeignObject)
	}
	if cfg.Mode > ub.Unreliable {
		return nil, fmt.Errorf("refprov: %w: unknown mode %v", ub.ErrInvalidArgument, cfg.Mode)
	}
	j := &jetty{c: c, mode: cfg.Mode, depth: cfg.RecvDepth, maxMsg: cfg.MaxMessage, token: cfg.Token, send: send, recv: recv}
	if j.depth <= 0 {
		j.depth = defaultRecvDepth
	}
	if j.maxMsg <= 0 {
		j.maxMsg = defaultMaxMsg
	}
	if err := c.track(j, func(id uint32) { j.id, c.jetties[id] = id, j }); err != nil {
		return nil, err
	}
	return j, nil
}

func (j *jetty) Desc() ub.JettyDesc {
	return ub.JettyDesc{Provider: Name, EID: j.c.eid, Name: "j" + strconv.FormatUint(uint64(j.id), 10)}
}

func (j *jetty) Bind(t ub.Target) error {
	tg, ok := t.(*target)
	if !ok {
		return fmt.Errorf("refprov: %w: Bind needs a target imported by this provider", ub.ErrForeignObject)
	}
	j.sendMu.Lock()
	defer j.sendMu.Unlock()
	switch {
	case j.mode != ub.ReliableConnection:
		return fmt.Errorf("refprov: %w: Bind is for reliable-connection jetties, this one is %v", ub.ErrInvalidArgument, j.mode)
	case j.bound != nil:
		return fmt.Errorf("refprov: %w: the jetty is bound already", ub.ErrInvalidArgument)
	}
	j.bound = tg
	return nil
}

func (j *jetty) PostRecv(wrs []ub.RecvWR) (int, error) {
	j.recvMu.Lock()
	defer j.recvMu.Unlock()
	if j.closed.Load() {
		return 0, errClosed
	}
	for i, wr := range wrs {
		s, ok := wr.Buf.Seg.(*segment)
		if !ok || s.c != j.c {
			return i, fmt.Errorf("refprov: %w: a receive buffer must be a segment of the jetty's context", ub.ErrForeignObject)
		}
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		switch {
		case closed:
			return i, fmt.Errorf("refprov: receive buffer: %w", ub.ErrClosed)
		case !inRange(wr.Buf.Offset, wr.Buf.Len, len(s.bytes)):
			return i, fmt.Errorf("refprov: %w: receive buffer [%d, +%d) outside its %d-byte segment", ub.ErrInvalidArgument, wr.Buf.Offset, wr.Buf.Len, len(s.bytes))
		case len(j.recvs) >= j.depth:
			return i, fmt.Errorf("refprov: %w (depth %d)", ub.ErrRecvQueueFull, j.depth)
		}
		j.recvs = append(j.recvs, posted{userCtx: wr.UserCtx, seg: s, off: wr.Buf.Offset, n: wr.Buf.Len})
	}
	return len(wrs), nil
}

// PostSend runs each request, one round trip to its target after the
// other, and queues its completion.
func (j *jetty) PostSend(wrs []ub.WR) (int, error) {
	j.sendMu.Lock()
	defer j.sendMu.Unlock()
	for i := range wrs {
		if j.closed.Load() {
			return i, errClosed
		}
		if err := j.send.reserve(); err != nil {
			return i, err
		}
		comp := j.run(&wrs[i])
		comp.Op, comp.UserCtx = wrs[i].Op, wrs[i].UserCtx
		if comp.Status != ub.StatusSuccess {
			comp.Len = 0
		}
		j.send.push(comp, true)
	}
	return len(wrs), nil
}

// target picks where a send (or a WriteImm's notification) goes: the one
// given, else the bound one.
func (j *jetty) target(t ub.Target) (*target, ub.Status) {
	if t == nil {
		if j.bound == nil {
			return nil, ub.StatusUnsupported
		}
		return j.bound, ub.StatusSuccess
	}
	tg, ok := t.(*target)
	if !ok || (j.bound != nil && tg != j.bound) {
		return nil, ub.StatusUnsupported
	}
	return tg, ub.StatusSuccess
}

func (j *jetty) run(wr *ub.WR) ub.Completion {
	switch wr.Op {
	case ub.OpSend, ub.OpSendImm:
		data, st := j.c.local(wr.Local, nil)
		if st == ub.StatusSuccess && len(data) > j.maxMsg {
			st = ub.StatusLocalLength
		}
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		t, st := j.target(wr.Target)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		req := request{Op: wr.Op, Object: t.id, Token: t.token, Data: data, Imm: wr.Imm, HasImm: wr.Op == ub.OpSendImm, Unreliable: j.mode == ub.Unreliable}
		return ub.Completion{Status: j.c.call(t.desc.EID, &req).Status, Len: len(data)}
	case ub.OpWrite, ub.OpWriteImm, ub.OpRead, ub.OpCAS, ub.OpFetchAdd:
		if j.mode == ub.Unreliable {
			return ub.Completion{Status: ub.StatusUnsupported}
		}
		return j.oneSided(wr)
	}
	return ub.Completion{Status: ub.StatusUnsupported}
}

func (j *jetty) oneSided(wr *ub.WR) ub.Completion {
	r, ok := wr.Remote.Seg.(*remoteSegment)
	if !ok {
		return ub.Completion{Status: ub.StatusUnsupported}
	}
	req := request{Op: wr.Op, Object: r.id, Token: r.token, Offset: wr.Remote.Offset}
	local := wr.Local
	switch wr.Op {
	case ub.OpWrite, ub.OpWriteImm:
		data, st := j.c.local(local, nil)
		if st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		req.Data = data
		if wr.Op == ub.OpWriteImm {
			t, st := j.target(wr.Target)
			if st != ub.StatusSuccess {
				return ub.Completion{Status: st}
			}
			if t.desc.EID != r.desc.EID {
				return ub.Completion{Status: ub.StatusUnsupported} // the notification goes where the data goes
			}
			req.Jetty, req.JettyToken, req.Imm, req.HasImm = t.id, t.token, wr.Imm, true
		}
	case ub.OpRead:
		if _, st := j.c.local(local, nil); st != ub.StatusSuccess {
			return ub.Completion{Status: st}
		}
		req.Len = local.Len
	case ub.OpCAS, ub.OpFetchAdd:
		req.Compare, req.Swap, req.Add = wr.Compare, wr.Swap, wr.Add
		if local.Seg != nil {
			local.Len = 8
			if _, st := j.c.local(local, nil); st != ub.StatusSuccess {
				return ub.Completion{Status: st}
			}
		}
	}
	resp := j.c.call(r.desc.EID, &req)
	comp := ub.Completion{Status: resp.Status, Value: resp.Value, Len: len(req.Data)}
	if resp.Status != ub.StatusSuccess {
		return comp
	}
	switch wr.Op {
	case ub.OpRead:
		if len(resp.Data) != local.Len {
			return ub.Completion{Status: ub.StatusRemoteLength}
		}
		comp.Len, comp.Status = local.Len, j.store(local, resp.Data)
	case ub.OpCAS, ub.OpFetchAdd:
		comp.Len = 8
		if local.Seg != nil {
			comp.Status = j.store(local, binary.LittleEndian.AppendUint64(nil, resp.Value))
		}
	}
	return comp
}

// store copies an answer into a local buffer, which may have been closed
// meanwhile.
func (j *jetty) store(l ub.Local, data []byte) ub.Status {
	_, st := j.c.local(l, data)
	return st
}

// deliver puts an incoming message (or a WriteImm's notification) into
// jetty jid's oldest posted receive and completes the receive.
func (c *Context) deliver(jid uint32, token ub.Token, data []byte, op ub.Opcode, imm uint64, hasImm, unreliable bool) ub.Status {
	c.mu.Lock()
	j := c.jetties[jid]
	c.mu.Unlock()
	if j == nil {
		return ub.StatusFlushed // closed, or never was
	}
	j.recvMu.Lock()
	defer j.recvMu.Unlock()
	switch {
	case j.closed.Load():
		return ub.StatusFlushed
	case token != j.token:
		return ub.StatusBadToken
	case len(data) > j.maxMsg:
		return ub.StatusRemoteLength
	case len(j.recvs) == 0 && unreliable:
		return ub.StatusSuccess // dropped
	case len(j.recvs) == 0:
		return ub.StatusReceiverNotReady
	}
	if j.recv.reserve() != nil {
		return ub.StatusReceiverNotReady // no room for the receive's completion
	}
	r := j.recvs[0]
	j.recvs = j.recvs[1:]
	comp := ub.Completion{Op: op, UserCtx: r.userCtx, Len: len(data), Imm: imm, HasImm: hasImm}
	if len(data) > r.n {
		comp.Status = ub.StatusRemoteLength
	} else if len(data) > 0 {
		r.seg.mu.Lock()
		if r.seg.closed {
			comp.Status = ub.StatusFlushed
		} else {
			copy(r.seg.bytes[r.off:], data)
		}
		r.seg.mu.Unlock()
	}
	if op == ub.OpWriteImm || comp.Status != ub.StatusSuccess {
		comp.Len = 0
	}
	j.recv.push(comp, true)
	return comp.Status
}

// Close completes the posted receives with StatusFlushed; peers' later
// sends find no jetty.
func (j *jetty) Close() error {
	j.recvMu.Lock()
	if j.closed.Swap(true) {
		j.recvMu.Unlock()
		return nil
	}
	recvs := j.recvs
	j.recvs = nil
	j.recvMu.Unlock()
	for _, r := range recvs {
		j.recv.push(ub.Completion{Status: ub.StatusFlushed, Op: ub.OpRecv, UserCtx: r.userCtx}, false)
	}
	j.c.mu.Lock()
	if j.c.jetties[j.id] == j {
		delete(j.c.jetties, j.id)
	}
	delete(j.c.objects, j)
	j.c.mu.Unlock()
	return nil
}
