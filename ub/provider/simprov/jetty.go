package simprov

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

// queueDepth bounds the operations a jetty holds back at once.
const queueDepth = 4096

// inlineBelow is how close to its start an operation may be for PostSend
// to post it itself (spinning the rest of the way) rather than hand it to
// the jetty's scheduler: on fast simulated links (a microsecond) the
// hand-off between goroutines would cost more than the link.
const inlineBelow = 2 * time.Microsecond

// waiterPostMax is the largest operation (in bytes) a waiter on the send
// queue posts itself: the copy of a larger one (4 µs and more here) costs
// more than the scheduler's wake-up, and the scheduler makes it on another
// processor while the poster produces its next payload.
const waiterPostMax = 64 << 10

// scheduled is an operation held back until its simulated arrival. A
// one-sided operation starts early enough for the host's own copy to end
// by its due time (its completion is held until then); a send is delivered
// at its due time, so the receiver never sees it early.
type scheduled struct {
	start  time.Time // when to post it to the inner provider
	due    time.Time // when it has arrived over the simulated path
	timed  bool      // it crosses simulated links: its lateness is measured
	heavy  bool      // over waiterPostMax: the scheduler posts it
	wr     ub.WR     // already translated to the inner provider's objects
	status ub.Status
	op     ub.Opcode
	ctx    uint64
	id     uint64 // what the inner completion carries (0 if none is asked for)
}

type jetty struct {
	inner     ub.Jetty
	c         *Context
	send      *cq
	mode      ub.Mode
	q         held
	done      chan struct{} // closed under mu, so no push follows the scheduler's flush
	exited    chan struct{}
	once      sync.Once
	mu        sync.Mutex
	last      time.Time // due time of the previous operation: order is kept
	lastStart time.Time
	pending   atomic.Int64 // operations handed to the scheduler, not yet posted
	bound     *target

	// pmu serialises the posts to the inner provider, in order: PostSend's
	// own, and those of held operations, which the scheduler and the
	// waiters on the send queue make, whoever comes first. postWR is the
	// scratch of the calls (which take a slice; a slice literal escapes
	// through the interface).
	pmu    sync.Mutex
	postWR [1]ub.WR
	// PostRecv's scratch.
	rmu     sync.Mutex
	recvWRs []ub.RecvWR
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
	send.addFeeder(j)
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
// then (unless a waiter on the send queue does first). Requests keep their
// order.
func (j *jetty) PostSend(wrs []ub.WR) (int, error) {
	// The requests leave now: the time the locks and bookkeeping below take
	// is part of their simulated latency, not added to it.
	now := time.Now()
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
		s, err := j.schedule(wr, now)
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
		if s.status == ub.StatusSuccess {
			// The inner completion carries an id the queue maps back to
			// the user's context and the time to release it: known from
			// now on, so a waiter can wait for exactly that time.
			var release time.Time
			if s.timed {
				release = s.due
			}
			s.id = j.send.track(s.ctx, release)
			s.wr.UserCtx = s.id
		}
		// With nothing held back, an operation due to start now is posted
		// here: order is kept, and no goroutine hand-off is paid.
		if j.pending.Load() == 0 && time.Until(s.start) <= inlineBelow {
			t := time.Now()
			for t.Before(s.start) {
				t = time.Now()
			}
			j.pmu.Lock()
			j.post(s, t)
			j.pmu.Unlock()
			continue
		}
		j.pending.Add(1)
		if !j.q.push(s) {
			j.pending.Add(-1)
			j.send.untrack(s.id)
			return i, fmt.Errorf("simprov: %w: %d operations already held back on this jetty", ub.ErrSendQueueFull, queueDepth)
		}
	}
	return len(wrs), nil
}

// schedule translates wr to the inner provider and books its path for
// requests that leave at now.
func (j *jetty) schedule(wr ub.WR, now time.Time) (scheduled, error) {
	s := scheduled{wr: wr, op: wr.Op, ctx: wr.UserCtx, due: now}
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
	s.heavy = size > waiterPostMax
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
		s.timed = remote != j.c.node
		switch wr.Op {
		case ub.OpWrite, ub.OpRead, ub.OpCAS, ub.OpFetchAdd:
			s.start = s.due.Add(-j.c.copyTime(size))
		}
	}
	return s, nil
}

// run posts held-back operations when their time comes: it sleeps until
// shortly before the first one's start, yields until the start, and posts
// every operation due by then. While a waiter on the send queue has claimed
// the jetty's light operations (see cq.cover) it stands by until rung.
func (j *jetty) run() {
	defer close(j.exited)
	var next, now time.Time // now: when the last yield saw next come
	var heavy bool
	covered := func() bool {
		c := j.send.cover.Load()
		return c != 0 && c <= next.UnixNano()
	}
	closing := func() bool {
		select {
		case <-j.done:
			return true
		default:
			return false
		}
	}
	for {
		next, heavy = j.postDue(false, now)
		now = time.Time{}
		if next.IsZero() || !heavy && covered() {
			select {
			case <-j.q.wake:
				continue
			case <-j.done:
				j.flush()
				return
			}
		}
		if !sleepUntil(next, j.done) {
			j.flush()
			return
		}
		now = yieldUntil(next, func() bool { return closing() || !heavy && covered() })
	}
}

// postDue posts, in order, every held operation whose start has come (up
// to the first heavy one, if light), and returns the start of the first one
// still held (zero if none is) and whether that one is heavy. A caller that
// has just read the clock passes the time as now (zero: postDue reads it).
func (j *jetty) postDue(light bool, now time.Time) (next time.Time, heavy bool) {
	j.pmu.Lock()
	defer j.pmu.Unlock()
	for first := true; ; first = false {
		if !first || now.IsZero() {
			now = time.Now()
		}
		s, next, heavy, ok := j.q.popDue(now, light)
		if !ok {
			return next, heavy
		}
		j.post(s, now)
		if j.pending.Add(-1) == 0 {
			return time.Time{}, false // nothing more: spare a look at the clock
		}
	}
}

// post hands an operation to the inner provider at now (or completes it
// with its status when it cannot run). The caller holds pmu.
func (j *jetty) post(s scheduled, now time.Time) {
	if s.status != ub.StatusSuccess {
		j.send.push(ub.Completion{Status: s.status, Op: s.op, UserCtx: s.ctx})
		return
	}
	if s.timed {
		j.c.stats.posts.record(s.start, now)
	}
	j.postWR[0] = s.wr
	_, err := j.inner.PostSend(j.postWR[:])
	j.postWR[0] = ub.WR{} // hold no segment
	if err != nil {
		j.send.untrack(s.id)
		j.send.push(ub.Completion{Status: ub.StatusFlushed, Op: s.op, UserCtx: s.ctx})
	}
}

// flush completes every request still held back with StatusFlushed.
func (j *jetty) flush() {
	j.pmu.Lock()
	defer j.pmu.Unlock()
	for {
		s, ok := j.q.pop()
		if !ok {
			return
		}
		j.pending.Add(-1)
		j.send.untrack(s.id)
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
	h.ring()
	return true
}

// ring wakes the scheduler, if it waits.
func (h *held) ring() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// pop takes the oldest operation, if any.
func (h *held) pop() (scheduled, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.take()
}

// popDue takes the oldest operation if its start is not after now (and,
// if light, it is not heavy); if it takes none, it returns the oldest's
// start (zero when the queue is empty) and whether that one is heavy.
func (h *held) popDue(now time.Time, light bool) (s scheduled, next time.Time, heavy, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.head < len(h.ops) {
		if o := &h.ops[h.head]; o.start.After(now) || light && o.heavy {
			return scheduled{}, o.start, o.heavy, false
		}
	}
	s, ok = h.take()
	return s, time.Time{}, false, ok
}

// take takes the oldest operation, if any. The caller holds mu.
func (h *held) take() (scheduled, bool) {
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
	j.once.Do(func() {
		j.mu.Lock()
		close(j.done)
		j.mu.Unlock()
	})
	<-j.exited
}

// Close stops the scheduler (held-back requests complete with
// StatusFlushed), closes the inner jetty and lets the context forget it:
// kept, every closed connection's jetties stayed in memory with their
// queues.
func (j *jetty) Close() error {
	j.stop()
	j.send.removeFeeder(j)
	j.c.mu.Lock()
	delete(j.c.jets, j)
	j.c.mu.Unlock()
	return j.inner.Close()
}
