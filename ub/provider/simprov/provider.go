package simprov

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/topology"

	// The providers sim runs over.
	_ "github.com/ubkit-io/ubkit/ub/provider/shmprov"
	_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov"
)

// Name is the provider's registered name.
const Name = "sim"

func init() { ub.Register(Name, provider{}) }

type provider struct{}

// errClosed is returned for calls on a closed context or jetty.
var errClosed = fmt.Errorf("simprov: %w", ub.ErrClosed)

var (
	_ ub.NodeProvider = provider{}
	_ ub.NodeInfo     = (*Context)(nil)
)

// Options keys understood by Open, besides the inner provider's own.
const (
	// OptTopology names the topology: a shipped example ("dev4") or a file.
	// Default: the UB_TOPOLOGY variable, else this host alone.
	OptTopology = "topology"
	// OptNode is the node this context plays. Default: UB_NODE.
	OptNode = "node"
	// OptOver is the provider underneath: "shm" (default) or "tcp".
	OptOver = "over"
	// OptFabric names the simulation's shared state (link bookings,
	// faults): processes that give the same topology and name share it, so
	// several independent simulations of one topology can run on a host.
	// Default: one per topology.
	OptFabric = "fabric"
)

func (provider) Open(ctx context.Context, cfg ub.Config) (ub.Context, error) {
	t, err := loadTopology(cfg.Options[OptTopology])
	if err != nil {
		return nil, err
	}
	node := cfg.Options[OptNode]
	if node == "" {
		n, err := topology.LocalNode(t)
		if err != nil {
			return nil, fmt.Errorf("simprov: which node does this process play? %w (nodes: %s)", err, nodeNames(t))
		}
		node = n.Name
	}
	return open(ctx, t, node, cfg)
}

// OpenNode opens a context that plays node of t (ub.NodeProvider), for a
// process that knows its place, such as a transport endpoint. The
// options OptTopology and OptNode must be unset: t and node say it.
func (provider) OpenNode(ctx context.Context, t *topology.Topology, node string, cfg ub.Config) (ub.Context, error) {
	for _, opt := range []string{OptTopology, OptNode} {
		if v := cfg.Options[opt]; v != "" {
			return nil, fmt.Errorf("simprov: OpenNode plays node %q of topology %q, but Options[%q] says %q: leave it unset", node, t.Name, opt, v)
		}
	}
	return open(ctx, t, node, cfg)
}

// open opens a context that plays node of t.
func open(ctx context.Context, t *topology.Topology, node string, cfg ub.Config) (ub.Context, error) {
	idx, ok := t.NodeIndex(node)
	if !ok || t.Nodes[idx].IsSwitch() {
		return nil, fmt.Errorf("simprov: node %q is not a compute node of topology %q (nodes: %s)", node, t.Name, nodeNames(t))
	}
	over := cfg.Options[OptOver]
	if over == "" {
		over = "shm"
	}
	if over == Name {
		return nil, fmt.Errorf("simprov: %w: sim cannot run over itself", ub.ErrInvalidArgument)
	}
	inner, err := ub.Open(ctx, over, cfg)
	if err != nil {
		return nil, err
	}
	f, err := OpenFabricNamed(t, cfg.Options[OptFabric])
	if err != nil {
		inner.Close()
		return nil, err
	}
	c := &Context{inner: inner, t: t, node: node, fabric: f, jets: map[*jetty]struct{}{}}
	if over == "shm" {
		c.hostBandwidth, c.hostOverhead = measureHost(inner)
	}
	return c, nil
}

func loadTopology(src string) (*topology.Topology, error) {
	if src == "" {
		return topology.FromEnv()
	}
	if t, err := topology.Example(src); err == nil {
		return t, nil
	}
	return topology.Load(src)
}

func nodeNames(t *topology.Topology) string {
	var names []string
	for _, n := range t.Nodes {
		if !n.IsSwitch() {
			names = append(names, n.Name)
		}
	}
	if len(names) > 8 {
		names = append(names[:8], "...")
	}
	return strings.Join(names, ", ")
}

// Context is a node's endpoint on the simulated super node.
type Context struct {
	inner  ub.Context
	t      *topology.Topology
	node   string
	fabric *Fabric
	mu     sync.Mutex
	jets   map[*jetty]struct{} // open jetties, whose schedulers Close stops
	// ops is held for reading by posts and for writing by Close, so the
	// fabric is not unmapped under a post.
	ops    sync.RWMutex
	closed bool
	// hostBandwidth is what the inner provider copies per second here, and
	// hostOverhead what an operation costs it besides (measured at Open for
	// shm; 0 means unknown), to start one-sided operations early enough to
	// end on time.
	hostBandwidth float64
	hostOverhead  time.Duration
	stats         stats
}

// copyTime estimates how long the inner provider takes to run a one-sided
// operation of size bytes, from its post to its completion.
func (c *Context) copyTime(size int64) time.Duration {
	if c.hostBandwidth <= 0 {
		return 0
	}
	return c.hostOverhead + time.Duration(float64(size)/c.hostBandwidth*1e9)
}

// measureHost times writes with the inner provider to itself: the best of
// a few 1 MiB ones gives its bandwidth, the best of a few 64-byte ones its
// cost per operation. Zeros mean it could not tell.
func measureHost(in ub.Context) (bandwidth float64, overhead time.Duration) {
	const size = 1 << 20
	seg, err := in.AllocSegment(2*size, ub.SegmentConfig{Access: ub.AccessWrite, Token: 1})
	if err != nil {
		return 0, 0
	}
	defer seg.Close()
	r, err := in.ImportSegment(seg.Desc(), 1)
	if err != nil {
		return 0, 0
	}
	defer r.Close()
	q, err := in.NewCQ(ub.CQConfig{})
	if err != nil {
		return 0, 0
	}
	defer q.Close()
	j, err := in.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	if err != nil {
		return 0, 0
	}
	defer j.Close()
	out := make([]ub.Completion, 1)
	best := func(n, bytes int) (time.Duration, bool) {
		b := time.Duration(1 << 62)
		for range n {
			start := time.Now()
			if _, err := j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: seg, Len: bytes}, Remote: ub.Remote{Seg: r, Offset: size}}}); err != nil {
				return 0, false
			}
			if n, _ := q.Poll(out); n != 1 || out[0].Status != ub.StatusSuccess {
				return 0, false // an asynchronous provider: no estimate
			}
			b = min(b, time.Since(start))
		}
		return b, true
	}
	big, ok1 := best(4, size)
	small, ok2 := best(16, 64)
	if !ok1 || !ok2 {
		return 0, 0
	}
	return size / big.Seconds(), small
}

func (c *Context) EID() ub.EID      { return c.inner.EID() }
func (c *Context) Provider() string { return Name }

// Node returns the node this context plays.
func (c *Context) Node() string { return c.node }

// Topology returns the simulated super node.
func (c *Context) Topology() *topology.Topology { return c.t }

// Fabric returns the shared link state, for fault injection.
func (c *Context) Fabric() *Fabric { return c.fabric }

func (c *Context) Close() error {
	c.ops.Lock()
	if c.closed {
		c.ops.Unlock()
		return nil
	}
	c.closed = true
	c.ops.Unlock()
	c.mu.Lock()
	jets := c.jets
	c.jets = nil
	c.mu.Unlock()
	for j := range jets {
		j.stop()
	}
	return errors.Join(c.inner.Close(), c.fabric.Close())
}

// Descriptor names carry the node: "<node>|<inner provider>|<inner name>".
func wrapName(node, provider, name string) string { return node + "|" + provider + "|" + name }

func unwrapName(s string) (node, provider, name string, err error) {
	parts := strings.SplitN(s, "|", 3)
	if len(parts) != 3 || parts[0] == "" {
		return "", "", "", fmt.Errorf("simprov: %w: %q is not a sim descriptor name", ub.ErrBadDescriptor, s)
	}
	return parts[0], parts[1], parts[2], nil
}

type segment struct {
	ub.Segment
	c *Context
}

func (c *Context) AllocSegment(size int, cfg ub.SegmentConfig) (ub.Segment, error) {
	s, err := c.inner.AllocSegment(size, cfg)
	if err != nil {
		return nil, err
	}
	return &segment{Segment: s, c: c}, nil
}

// RegisterSegment registers the caller's memory with the provider
// underneath (under its rules: shm takes only memory in a named shm
// segment), as AllocSegment allocates there; operations on it are
// shaped and faulted as on an allocated segment.
func (c *Context) RegisterSegment(mem []byte, cfg ub.SegmentConfig) (ub.Segment, error) {
	s, err := c.inner.RegisterSegment(mem, cfg)
	if err != nil {
		return nil, err
	}
	return &segment{Segment: s, c: c}, nil
}

func (s *segment) Desc() ub.SegmentDesc {
	d := s.Segment.Desc()
	d.Name = wrapName(s.c.node, d.Provider, d.Name)
	d.Provider = Name
	return d
}

type remoteSegment struct {
	ub.RemoteSegment
	desc ub.SegmentDesc
	node string
}

func (c *Context) ImportSegment(desc ub.SegmentDesc, token ub.Token) (ub.RemoteSegment, error) {
	if desc.Provider != Name {
		return nil, fmt.Errorf("simprov: %w: cannot import a %q segment", ub.ErrBadDescriptor, desc.Provider)
	}
	node, prov, name, err := unwrapName(desc.Name)
	if err != nil {
		return nil, err
	}
	if _, ok := c.t.NodeIndex(node); !ok {
		return nil, fmt.Errorf("simprov: %w: segment of node %q, which topology %q does not have", ub.ErrBadDescriptor, node, c.t.Name)
	}
	in := desc
	in.Provider, in.Name = prov, name
	r, err := c.inner.ImportSegment(in, token)
	if err != nil {
		return nil, err
	}
	return &remoteSegment{RemoteSegment: r, desc: desc, node: node}, nil
}

func (r *remoteSegment) Desc() ub.SegmentDesc { return r.desc }

type target struct {
	ub.Target
	desc ub.JettyDesc
	node string
}

func (c *Context) ImportJetty(desc ub.JettyDesc, token ub.Token) (ub.Target, error) {
	if desc.Provider != Name {
		return nil, fmt.Errorf("simprov: %w: cannot import a %q jetty", ub.ErrBadDescriptor, desc.Provider)
	}
	node, prov, name, err := unwrapName(desc.Name)
	if err != nil {
		return nil, err
	}
	if _, ok := c.t.NodeIndex(node); !ok {
		return nil, fmt.Errorf("simprov: %w: jetty of node %q, which topology %q does not have", ub.ErrBadDescriptor, node, c.t.Name)
	}
	in := desc
	in.Provider, in.Name = prov, name
	t, err := c.inner.ImportJetty(in, token)
	if err != nil {
		return nil, err
	}
	return &target{Target: t, desc: desc, node: node}, nil
}

func (t *target) Desc() ub.JettyDesc { return t.desc }

// cq is the inner completion queue plus completions sim itself decides
// (faults). Completions of its jetties' requests come back from the inner
// provider under an id; the cq restores the user's context and holds a
// one-sided operation's completion until its simulated arrival.
type cq struct {
	inner ub.CQ
	stats *stats
	// feeders are the jetties whose send queue this is: a waiter posts
	// their light held operations when due itself, rather than wait for
	// their schedulers to post them and then for a wake-up (copied on
	// write).
	feeders atomic.Pointer[[]*jetty]
	// cover is when the waiter that claimed the feeders looks at them
	// next, in Unix nanoseconds (0: no waiter has): a scheduler whose next
	// start is not before it stands by, rather than race the waiter for
	// the post. The waiter rings them when it leaves.
	cover atomic.Int64
	mu    sync.Mutex
	// pending are inner completions in arrival order, each releasable at
	// its time; later ones wait behind an earlier held one, so order is kept.
	pending []timed
	ids     map[uint64]tracked
	nextID  uint64
	buf     []ub.Completion
	// intrs counts the interrupts of a queue over one that is not a
	// ub.Interrupter (over one that is, the inner queue counts them).
	intrs atomic.Uint64
}

type tracked struct {
	ctx     uint64
	release time.Time
}

type timed struct {
	c       ub.Completion
	release time.Time
}

func (c *Context) NewCQ(cfg ub.CQConfig) (ub.CQ, error) {
	in, err := c.inner.NewCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &cq{inner: in, stats: &c.stats, ids: map[uint64]tracked{}, buf: make([]ub.Completion, 64)}, nil
}

// addFeeder and removeFeeder record that j's send queue is q, and no
// longer is.
func (q *cq) addFeeder(j *jetty) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var fs []*jetty
	if old := q.feeders.Load(); old != nil {
		fs = slices.Clone(*old)
	}
	fs = append(fs, j)
	q.feeders.Store(&fs)
}

func (q *cq) removeFeeder(j *jetty) {
	q.mu.Lock()
	defer q.mu.Unlock()
	old := q.feeders.Load()
	if old == nil {
		return
	}
	fs := slices.DeleteFunc(slices.Clone(*old), func(f *jetty) bool { return f == j })
	q.feeders.Store(&fs)
}

// ringFeeders wakes the schedulers of the feeders that hold operations.
func (q *cq) ringFeeders() {
	fs := q.feeders.Load()
	if fs == nil {
		return
	}
	for _, j := range *fs {
		if j.pending.Load() > 0 {
			j.q.ring()
		}
	}
}

// postFeeders posts the light held operations of this queue's jetties
// whose start has come, and returns the start of the first light one still
// held (zero if none is): heavy ones are their schedulers' to post. A
// caller that has just read the clock passes the time as now (zero:
// postFeeders reads it). The caller holds no lock of the queue's.
func (q *cq) postFeeders(now time.Time) time.Time {
	fs := q.feeders.Load()
	if fs == nil {
		return time.Time{}
	}
	var first time.Time
	for _, j := range *fs {
		if j.pending.Load() == 0 {
			continue
		}
		if next, heavy := j.postDue(true, now); !heavy && !next.IsZero() && (first.IsZero() || next.Before(first)) {
			first = next
		}
	}
	return first
}

// push adds a completion sim decided (a fault, a flush) behind every
// completion already drained from the inner queue. One of a request still
// in flight in the provider underneath can still come after it.
func (q *cq) push(c ub.Completion) {
	q.mu.Lock()
	q.drain()
	q.pending = append(q.pending, timed{c: c})
	q.mu.Unlock()
	q.Interrupt()
}

// Interrupt makes a Wait in progress return (with nothing new to Poll,
// unless something came meanwhile), for a waiter that wants to look again
// (ub.Interrupter): a receiver that sent something and now expects an
// answer polls rather than sleeps. Over an inner queue that is an
// Interrupter it interrupts that queue's wait; over one that is not, a
// wait notices within the millisecond it waits on the inner queue at a
// time.
func (q *cq) Interrupt() {
	if k, ok := q.inner.(ub.Interrupter); ok {
		k.Interrupt()
		return
	}
	q.intrs.Add(1)
}

// track registers a request and returns the id it carries to the inner
// provider: its completion is released at release (zero: at once).
func (q *cq) track(ctx uint64, release time.Time) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	q.ids[q.nextID] = tracked{ctx, release}
	return q.nextID
}

// untrack forgets a request that will not reach the inner provider.
func (q *cq) untrack(id uint64) {
	q.mu.Lock()
	delete(q.ids, id)
	q.mu.Unlock()
}

// isReceive tells a receive-side completion (which carries the receiver's
// own context) from the completion of one of our requests.
func isReceive(c ub.Completion) bool {
	return c.Op == ub.OpRecv || (c.Op == ub.OpWriteImm && c.HasImm)
}

// drain moves inner completions to pending, mapping ids back.
func (q *cq) drain() error {
	for {
		n, err := q.inner.Poll(q.buf)
		if err != nil {
			return err
		}
		for _, c := range q.buf[:n] {
			var release time.Time
			if !isReceive(c) {
				if t, ok := q.ids[c.UserCtx]; ok {
					delete(q.ids, c.UserCtx)
					c.UserCtx, release = t.ctx, t.release
				}
			}
			q.pending = append(q.pending, timed{c, release})
		}
		if n < len(q.buf) {
			return nil
		}
	}
}

// Poll also posts the light held operations of the queue's jetties that
// are due, so a caller that polls sees them on time.
func (q *cq) Poll(out []ub.Completion) (int, error) {
	q.postFeeders(time.Time{})
	q.mu.Lock()
	defer q.mu.Unlock()
	err := q.drain()
	now := time.Now()
	n, k := 0, 0
	for n < len(out) && k < len(q.pending) && !q.pending[k].release.After(now) {
		out[n] = q.pending[k].c
		k++
		n++
	}
	if k > 0 {
		// Keep the rest at the front (usually nothing): the array is
		// reused rather than a slice moving forward through new ones.
		q.pending = append(q.pending[:0], q.pending[k:]...)
	}
	return n, err
}

// next reports whether Poll has something at now, the time it looked, and
// the release time of the first completion pending (zero if none is, or it
// is not held).
func (q *cq) next() (ok bool, release, now time.Time, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.drain(); err != nil {
		return false, time.Time{}, time.Time{}, err
	}
	if len(q.pending) == 0 {
		return false, time.Time{}, time.Time{}, nil
	}
	r := q.pending[0].release
	if r.IsZero() {
		return true, r, time.Time{}, nil
	}
	now = time.Now()
	return !r.After(now), r, now, nil
}

// Wait waits for the first completion Poll will return. When it knows
// when that is due (a held completion's release, or the start of a light
// held operation of the queue's jetties, which it then posts itself), it sleeps
// on the inner queue until shortly before, and yields the processor,
// looking at the clock, for the last stretch, which timers cannot hit.
// Otherwise it blocks on the inner queue at once, until a completion or an
// Interrupt. It does not poll an empty queue: a goroutine that polls with
// runtime.Gosched keeps its processor busy, and a busy processor never
// looks at Go's netpoller, so the sockets and bells of everything else in
// the process (a proxy's other side, the inner queue's own bell) went
// unserved until the poll ended. A caller that knows an answer is due
// polls with Poll before it waits.
func (q *cq) Wait(ctx context.Context) error { return q.WaitInterrupt(ctx, q.Interrupts()) }

// Interrupts is how many times the queue was interrupted, by Interrupt or
// by a completion of sim's own.
func (q *cq) Interrupts() uint64 {
	if k, ok := q.inner.(ub.Interrupter); ok {
		return k.Interrupts()
	}
	return q.intrs.Load()
}

// WaitInterrupt is Wait that also returns once the queue was interrupted
// since Interrupts returned since: a waiter that reads Interrupts before it
// lets others know it sleeps loses no interrupt made meanwhile. A held
// completion it waited for is counted in the context's Stats, late by the
// time from its release to the return.
func (q *cq) WaitInterrupt(ctx context.Context, since uint64) error {
	k, kickable := q.inner.(ub.Interrupter)
	entry := since
	began := time.Now()
	// kicked says whether the queue was interrupted since the wait began.
	kicked := func() bool {
		if kickable {
			return k.Interrupts() != entry
		}
		return q.intrs.Load() != entry
	}
	// A waiter that knows when to look next claims the feeders (one at a
	// time), and gives them back to their schedulers when it stops. When
	// it looks later than it said, a scheduler that stood by for an
	// operation the waiter did not see yet (pushed meanwhile) must look
	// again.
	claimed := false
	claim := func(due time.Time) {
		if !claimed {
			claimed = q.cover.CompareAndSwap(0, due.UnixNano())
		} else if old := q.cover.Swap(due.UnixNano()); due.UnixNano() > old {
			q.ringFeeders()
		}
	}
	unclaim := func() {
		if claimed {
			claimed = false
			q.cover.Store(0)
			q.ringFeeders()
		}
	}
	defer unclaim()
	var now time.Time // when the last yield saw its deadline come
	for first := true; ; first = false {
		// A push after the look below interrupts the inner wait: count
		// the interrupts before looking (the first look counts from
		// since).
		if kickable && !first {
			since = k.Interrupts()
		}
		start := q.postFeeders(now)
		ok, release, looked, err := q.next()
		if err != nil {
			return err
		}
		if ok {
			if release.After(began) {
				q.stats.completions.record(release, looked)
			}
			return nil
		}
		now = time.Time{}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !kickable && kicked() {
			return nil
		}
		due := release
		if !start.IsZero() && (due.IsZero() || start.Before(due)) {
			due = start
		}
		if !due.IsZero() {
			claim(due)
			if want := due.Add(-time.Duration(timerMargin.Load())); time.Until(want) > 0 {
				// Sleep until shortly before, woken by anything that
				// comes meanwhile.
				wctx, cancel := context.WithDeadline(ctx, want)
				if kickable {
					err = k.WaitInterrupt(wctx, since)
				} else {
					err = q.inner.Wait(wctx)
				}
				cancel()
				switch {
				case ctx.Err() != nil:
					return ctx.Err()
				case errors.Is(err, context.DeadlineExceeded):
					learnTimer(want, time.Now())
				case err != nil:
					return err
				case kicked():
					return nil
				}
				continue
			}
			now = yieldUntil(due, func() bool {
				ok, _, _, err := q.next()
				return ok || err != nil || kicked() || ctx.Err() != nil
			})
			if kicked() {
				return nil
			}
			continue
		}
		unclaim()
		if kickable {
			err = k.WaitInterrupt(ctx, since)
			if err == nil && kicked() {
				// Interrupted (by Interrupt, or by push for a completion
				// of sim's own): the waiter looks again.
				return nil
			}
		} else {
			// An inner queue that cannot be interrupted is looked at
			// every millisecond.
			wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			err = q.inner.Wait(wctx)
			cancel()
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		}
	}
}

func (q *cq) Close() error { return q.inner.Close() }
