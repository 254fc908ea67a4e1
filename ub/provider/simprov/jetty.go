package simprov

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

// spinBelow is how close to its due time a delayed operation stops sleeping
// and spins: timers are not precise to the microsecond, and simulated links
// are.
const spinBelow = 200 * time.Microsecond

// queueDepth bounds the operations a jetty holds back at once.
const queueDepth = 4096

// inlineBelow is how close to its start an operation may be for PostSend
// to post it itself (spinning the rest of the way) rather than hand it to
// the jetty's scheduler: on fast simulated links (a microsecond) the
// hand-off between goroutines would cost more than the link.
const inlineBelow = 2 * time.Microsecond

// scheduled is an operation held back until its simulated arrival. A
// one-sided operation starts early enough for the host's own copy to end
// by its due time (its completion is held until then); a send is delivered
// at its due time, so the receiver never sees it early.
type scheduled struct {
	start  time.Time // when to post it to the inner provider
	due    time.Time // when it has arrived over the simulated path
	hold   bool      // hold the completion until due
	wr     ub.WR     // already translated to the inner provider's objects
	status ub.Status
	op     ub.Opcode
	ctx    uint64
}

type jetty struct {
	inner     ub.Jetty
	c         *Context
	send      *cq
	mode      ub.Mode
	q         held
	done      chan struct{}
	exited    chan struct{}
	once      sync.Once
	mu        sync.Mutex
	last      time.Time // due time of the previous operation: order is kept
	lastStart time.Time
	pending   atomic.Int64 // operations handed to the scheduler, not yet posted
	bound     *target

	// Scratch for the calls into the inner provider, which take slices
	// (a slice literal escapes through the interface): PostSend's (mu),
	// the scheduler's, and PostRecv's (rmu).
	inlineWR [1]ub.WR
	runWR    [1]ub.WR
	rmu      sync.Mutex
	recvWRs  []ub.RecvWR
}

// testHookNewJetty, if set, runs in NewJetty between making the jetty
// underneath and recording it: where a Close that runs meanwhile must be
// noticed.
var testHookNewJetty func(*Context)

func (c *Context) NewJetty(cfg ub.JettyConfig) (ub.Jetty, error) {
	send, ok1 := cfg.SendCQ.(*cq)
	recv, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("simprov: %w: a jetty needs SendCQ and RecvCQ made by this provider", ub.ErrForeignObject)
	}
	in := cfg
	in.SendCQ, in.RecvCQ = send.inner, recv.inner
	ij, err := c.inner.NewJetty(in)
	if err != nil {
		return nil, err
	}
	j := &jetty{inner: ij, c: c, send: send, mode: cfg.Mode, q: held{wake: make(chan struct{}, 1)}, done: make(chan struct{}), exited: make(chan struct{})}
	if testHookNewJetty != nil {
		testHookNewJetty(c)
	}
	c.mu.Lock()
	if c.jets == nil { // Close ran meanwhile
		c.mu.Unlock()
		ij.Close()
		return nil, errClosed
	}
	c.jets[j] = struct{}{}
	c.mu.Unlock()
	go j.run()
	return j, nil
}

func (j *jetty) Desc() ub.JettyDesc {
	d := j.inner.Desc()
	d.Name = wrapName(j.c.node, d.Provider, d.Name)
	d.Provider = Name
	return d
}

func (j *jetty) Bind(t ub.Target) error {
	tg, ok := t.(*target)
	if !ok {
		return fmt.Errorf("simprov: %w: Bind needs a target imported by this provider", ub.ErrForeignObject)
	}
	if err := j.inner.Bind(tg.Target); err != nil {
		return err
	}
	j.mu.Lock()
	j.bound = tg
	j.mu.Unlock()
	return nil
}

func (j *jetty) PostRecv(wrs []ub.RecvWR) (int, error) {
	j.rmu.Lock()
	defer j.rmu.Unlock()
	in := append(j.recvWRs[:0], wrs...)
	j.recvWRs = in
	defer clear(in) // hold no segment
	for i, wr := range wrs {
		s, ok := wr.Buf.Seg.(*segment)
		if !ok {
			// Post the ones before it, as the count returned says.
			if n, err := j.inner.PostRecv(in[:i]); err != nil {
				return n, err
			}
			return i, fmt.Errorf("simprov: %w: a receive buffer must be a segment of this provider", ub.ErrForeignObject)
		}
		in[i].Buf.Seg = s.Segment
	}
	return j.inner.PostRecv(in)
}

// PostSend works out when each request arrives over the simulated path and
// hands it to the jetty's scheduler, which posts it to the inner provider
// then. Requests keep their order.
func (j *jetty) PostSend(wrs []ub.WR) (int, error) {
	j.c.ops.RLock()
	defer j.c.ops.RUnlock()
	if j.c.closed {
		return 0, errClosed
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	select {
	case <-j.done:
		return 0, errClosed
	default:
	}
	for i, wr := range wrs {
		s, err := j.schedule(wr)
		if err != nil {
			return i, err
		}
		if s.due.Before(j.last) {
			s.due = j.last
		}
		j.last = s.due
		if s.start.IsZero() || s.start.After(s.due) {
			s.start = s.due
		}
		if s.start.Before(j.lastStart) {
			s.start = j.lastStart
		}
		j.lastStart = s.start
		// With nothing held back, an operation due to start now is posted
		// here: order is kept, and no goroutine hand-off is paid.
		if j.pending.Load() == 0 && time.Until(s.start) <= inlineBelow {
			for time.Now().Before(s.start) {
			}
			j.post(s, &j.inlineWR)
			continue
		}
		j.pending.Add(1)
		if !j.q.push(s) {
			j.pending.Add(-1)
			return i, fmt.Errorf("simprov: %w: %d operations already held back on this jetty", ub.ErrSendQueueFull, queueDepth)
		}
	}
	return len(wrs), nil
}

// schedule translates wr to the inner provider and books its path.
func (j *jetty) schedule(wr ub.WR) (scheduled, error) {
	s := scheduled{wr: wr, op: wr.Op, ctx: wr.UserCtx, due: time.Now()}
	if l, ok := wr.Local.Seg.(*segment); ok {
		s.wr.Local.Seg = l.Segment
	}
	var remote string
	if r, ok := wr.Remote.Seg.(*remoteSegment); ok {
		s.wr.Remote.Seg = r.RemoteSegment
		remote = r.node
	}
	tg := j.bound
	if t, ok := wr.Target.(*target); ok {
		tg = t
		s.wr.Target = t.Target
	}
	switch wr.Op {
	case ub.OpSend, ub.OpSendImm:
		if tg == nil {
			return s, nil // the inner provider reports it
		}
		remote = tg.node
	}
	if remote == "" {
		return s, nil
	}
	size := int64(wr.Local.Len)
	if wr.Op == ub.OpCAS || wr.Op == ub.OpFetchAdd {
		size = 8
	} else if l, ok := wr.Local.Seg.(*segment); !ok || !verbs.InRange(wr.Local.Offset, wr.Local.Len, len(l.Bytes())) {
		// Never book a shared link for a request that cannot run.
		s.status = ub.StatusLocalLength
		return s, nil
	}
	r, err := j.c.fabric.reserve(j.c.node, remote, size, s.due)
	if err != nil {
		return s, err
	}
	switch {
	case r.crashed:
		s.status = ub.StatusPeerDead
	case r.down:
		s.status = ub.StatusLinkDown
	default:
		s.due = r.due
		switch wr.Op {
		case ub.OpWrite, ub.OpRead, ub.OpCAS, ub.OpFetchAdd:
			s.hold = true
			s.start = s.due.Add(-j.c.copyTime(size))
		}
	}
	return s, nil
}

// run posts held-back operations when their time comes.
func (j *jetty) run() {
	defer close(j.exited)
	for {
		s, ok := j.q.pop()
		if !ok {
			select {
			case <-j.q.wake:
			case <-j.done:
				j.flush()
				return
			}
			continue
		}
		if d := time.Until(s.start) - spinBelow; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-j.done:
				t.Stop()
				j.send.push(ub.Completion{Status: ub.StatusFlushed, Op: s.op, UserCtx: s.ctx})
				j.flush()
				return
			}
		}
		for time.Now().Before(s.start) {
		}
		j.post(s, &j.runWR)
		j.pending.Add(-1)
	}
}

// post hands an operation to the inner provider (or completes it with its
// status when it cannot run), through the caller's scratch.
func (j *jetty) post(s scheduled, scratch *[1]ub.WR) {
	if s.status != ub.StatusSuccess {
		j.send.push(ub.Completion{Status: s.status, Op: s.op, UserCtx: s.ctx})
		return
	}
	// Every inner send-side completion carries an id the CQ maps back to
	// the user's context (and, for held ones, their due time).
	var release time.Time
	if s.hold {
		release = s.due
	}
	s.wr.UserCtx = j.send.track(s.ctx, release)
	scratch[0] = s.wr
	_, err := j.inner.PostSend(scratch[:])
	scratch[0] = ub.WR{} // hold no segment
	if err != nil {
		j.send.push(ub.Completion{Status: ub.StatusFlushed, Op: s.op, UserCtx: s.ctx})
	}
}

// flush completes every request still held back with StatusFlushed.
func (j *jetty) flush() {
	for {
		s, ok := j.q.pop()
		if !ok {
			return
		}
		j.send.push(ub.Completion{Status: ub.StatusFlushed, Op: s.op, UserCtx: s.ctx})
	}
}

// held is a jetty's queue of operations held back, in order, up to
// queueDepth. It grows as operations come: a channel that deep, made for
// every jetty, cost each connection over 3 MB up front, all of it scanned
// by the garbage collector.
type held struct {
	mu   sync.Mutex
	ops  []scheduled // from head
	head int
	wake chan struct{} // a push rings it for the scheduler
}

// push queues s; it reports false when queueDepth operations are held.
func (h *held) push(s scheduled) bool {
	h.mu.Lock()
	if len(h.ops)-h.head >= queueDepth {
		h.mu.Unlock()
		return false
	}
	if h.head > 0 && len(h.ops) == cap(h.ops) {
		// Full, with room at the front: move the held ones there rather
		// than grow (a queue that never empties would grow for ever).
		n := copy(h.ops, h.ops[h.head:])
		clear(h.ops[n:])
		h.ops, h.head = h.ops[:n], 0
	}
	h.ops = append(h.ops, s)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
	return true
}

// pop takes the oldest operation, if any.
func (h *held) pop() (scheduled, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.head == len(h.ops) {
		return scheduled{}, false
	}
	s := h.ops[h.head]
	h.ops[h.head] = scheduled{} // hold no segment
	if h.head++; h.head == len(h.ops) {
		h.ops, h.head = h.ops[:0], 0
	}
	return s, true
}

// stop ends the scheduler and waits for it, so nothing is posted to inner
// objects that are about to be closed. Held-back operations complete with
// StatusFlushed.
func (j *jetty) stop() {
	j.once.Do(func() { close(j.done) })
	<-j.exited
}

// Close stops the scheduler (held-back requests complete with
// StatusFlushed), closes the inner jetty and lets the context forget it:
// kept, every closed connection's jetties stayed in memory with their
// queues.
func (j *jetty) Close() error {
	j.stop()
	j.c.mu.Lock()
	delete(j.c.jets, j)
	j.c.mu.Unlock()
	return j.inner.Close()
}
