package simprov

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
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
		return nil, errors.New("simprov: sim cannot run over itself")
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
		c.hostBandwidth = measureHost(inner)
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
	// hostBandwidth is what the inner provider copies per second here
	// (measured at Open for shm; 0 means unknown), to start one-sided
	// operations early enough to end on time.
	hostBandwidth float64
}

// copyTime estimates how long the inner provider takes to move size bytes.
func (c *Context) copyTime(size int64) time.Duration {
	if c.hostBandwidth <= 0 {
		return 0
	}
	return time.Duration(float64(size) / c.hostBandwidth * 1e9)
}

// measureHost times 1 MiB writes with the inner provider to itself.
func measureHost(in ub.Context) float64 {
	const size = 1 << 20
	seg, err := in.AllocSegment(2*size, ub.SegmentConfig{Access: ub.AccessWrite, Token: 1})
	if err != nil {
		return 0
	}
	defer seg.Close()
	r, err := in.ImportSegment(seg.Desc(), 1)
	if err != nil {
		return 0
	}
	defer r.Close()
	q, err := in.NewCQ(ub.CQConfig{})
	if err != nil {
		return 0
	}
	defer q.Close()
	j, err := in.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	if err != nil {
		return 0
	}
	defer j.Close()
	out := make([]ub.Completion, 1)
	best := time.Duration(1 << 62)
	for range 4 {
		start := time.Now()
		if _, err := j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: seg, Len: size}, Remote: ub.Remote{Seg: r, Offset: size}}}); err != nil {
			return 0
		}
		if n, _ := q.Poll(out); n != 1 || out[0].Status != ub.StatusSuccess {
			return 0 // an asynchronous provider: no estimate
		}
		best = min(best, time.Since(start))
	}
	return size / best.Seconds()
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
		return "", "", "", fmt.Errorf("simprov: %q is not a sim descriptor name", s)
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
		return nil, fmt.Errorf("simprov: cannot import a %q segment", desc.Provider)
	}
	node, prov, name, err := unwrapName(desc.Name)
	if err != nil {
		return nil, err
	}
	if _, ok := c.t.NodeIndex(node); !ok {
		return nil, fmt.Errorf("simprov: segment of node %q, which topology %q does not have", node, c.t.Name)
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
		return nil, fmt.Errorf("simprov: cannot import a %q jetty", desc.Provider)
	}
	node, prov, name, err := unwrapName(desc.Name)
	if err != nil {
		return nil, err
	}
	if _, ok := c.t.NodeIndex(node); !ok {
		return nil, fmt.Errorf("simprov: jetty of node %q, which topology %q does not have", node, c.t.Name)
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
	mu    sync.Mutex
	local []ub.Completion // sim's own, ready at once
	// pending are inner completions in arrival order, each releasable at
	// its time; later ones wait behind an earlier held one, so order is kept.
	pending []timed
	ids     map[uint64]tracked
	nextID  uint64
	buf     []ub.Completion
}

// kicker is an inner completion queue whose waits sim's own completions
// can end (the inner queue knows nothing of them): shmprov's and tcpprov's.
type kicker interface {
	Kick()
	Kicks() uint64
	WaitKick(ctx context.Context, since uint64) error
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
	return &cq{inner: in, ids: map[uint64]tracked{}, buf: make([]ub.Completion, 64)}, nil
}

// push adds a completion sim decided (a fault, a flush) behind every
// completion already drained from the inner queue. One of a request still
// in flight in the provider underneath can still come after it.
func (q *cq) push(c ub.Completion) {
	q.mu.Lock()
	q.drain()
	q.pending = append(q.pending, timed{c: c})
	q.mu.Unlock()
	if k, ok := q.inner.(kicker); ok {
		k.Kick()
	}
}

// Kick makes a Wait in progress return (with nothing new to Poll, unless
// something came meanwhile), for a waiter that wants to look again: a
// receiver that sent something and now expects an answer polls rather than
// sleeps. A queue over a provider whose waits cannot be kicked ignores it.
func (q *cq) Kick() {
	if k, ok := q.inner.(kicker); ok {
		k.Kick()
	}
}

// track registers a request about to be posted and returns the id it
// carries to the inner provider.
func (q *cq) track(ctx uint64, release time.Time) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	q.ids[q.nextID] = tracked{ctx, release}
	return q.nextID
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

func (q *cq) Poll(out []ub.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := copy(out, q.local)
	q.local = q.local[n:]
	err := q.drain()
	now := time.Now()
	k := 0
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

// next reports whether Poll has something now and, if not, when the first
// held completion is released (zero if none is pending).
func (q *cq) next() (bool, time.Time, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.local) > 0 {
		return true, time.Time{}, nil
	}
	if err := q.drain(); err != nil {
		return false, time.Time{}, err
	}
	if len(q.pending) == 0 {
		return false, time.Time{}, nil
	}
	r := q.pending[0].release
	return !r.After(time.Now()), r, nil
}

// Wait sleeps until a held completion's release time (yielding for the last
// stretch, which timers cannot hit), and otherwise blocks on the inner
// queue at once, until a completion or a Kick. It does not poll an empty
// queue: a goroutine that polls with runtime.Gosched keeps its processor
// busy, and a busy processor never looks at Go's netpoller, so the sockets
// and bells of everything else in the process (a proxy's other side, the
// inner queue's own bell) went unserved until the poll ended. A caller
// that knows an answer is due polls with Poll before it waits.
func (q *cq) Wait(ctx context.Context) error { return q.WaitKick(ctx, q.Kicks()) }

// Kicks is how many times the queue was kicked (0 over a provider whose
// queues cannot be).
func (q *cq) Kicks() uint64 {
	if k, ok := q.inner.(kicker); ok {
		return k.Kicks()
	}
	return 0
}

// WaitKick is Wait that also returns once the queue was kicked since Kicks
// returned since: a waiter that reads Kicks before it lets others know it
// sleeps loses no kick made meanwhile.
func (q *cq) WaitKick(ctx context.Context, since uint64) error {
	k, kickable := q.inner.(kicker)
	entry := since
	for first := true; ; first = false {
		// A push after the look below kicks the inner wait: count the
		// kicks before looking (the first look counts from since).
		if kickable && !first {
			since = k.Kicks()
		}
		ok, release, err := q.next()
		if ok || err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !release.IsZero() {
			if d := time.Until(release) - spinBelow; d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				}
			} else {
				runtime.Gosched()
			}
			continue
		}
		if kickable {
			err = k.WaitKick(ctx, since)
			if err == nil && k.Kicks() != entry {
				// Kicked (by Kick, or by push for a completion of sim's
				// own): the waiter looks again.
				return nil
			}
		} else {
			// An inner queue that cannot be kicked is looked at every
			// millisecond.
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
