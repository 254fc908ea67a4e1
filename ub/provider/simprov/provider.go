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

// Options keys understood by Open, besides the inner provider's own.
const (
	// OptTopology names the topology: a shipped example ("dev4") or a file.
	// Default: the UB_TOPOLOGY variable, else this host alone.
	OptTopology = "topology"
	// OptNode is the node this context plays. Default: UB_NODE.
	OptNode = "node"
	// OptOver is the provider underneath: "shm" (default) or "tcp".
	OptOver = "over"
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
	f, err := OpenFabric(t)
	if err != nil {
		inner.Close()
		return nil, err
	}
	return &Context{inner: inner, t: t, node: node, fabric: f}, nil
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
	jets   []*jetty
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
	c.mu.Lock()
	jets := c.jets
	c.jets = nil
	c.mu.Unlock()
	for _, j := range jets {
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
// (faults).
type cq struct {
	inner ub.CQ
	mu    sync.Mutex
	local []ub.Completion
	ready chan struct{}
}

func (c *Context) NewCQ(cfg ub.CQConfig) (ub.CQ, error) {
	in, err := c.inner.NewCQ(cfg)
	if err != nil {
		return nil, err
	}
	return &cq{inner: in, ready: make(chan struct{}, 1)}, nil
}

func (q *cq) push(c ub.Completion) {
	q.mu.Lock()
	q.local = append(q.local, c)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *cq) Poll(out []ub.Completion) (int, error) {
	q.mu.Lock()
	n := copy(out, q.local)
	q.local = q.local[n:]
	q.mu.Unlock()
	m, err := q.inner.Poll(out[n:])
	return n + m, err
}

// Wait first polls the inner queue for up to waitSpin, yielding between
// looks (a held-back operation is usually about to complete, and handing a
// completion between goroutines costs microseconds a simulated link does
// not have), then blocks on it.
func (q *cq) Wait(ctx context.Context) error {
	start := time.Now()
	buf := make([]ub.Completion, 16)
	for {
		q.mu.Lock()
		n := len(q.local)
		q.mu.Unlock()
		if n > 0 {
			return nil
		}
		m, err := q.inner.Poll(buf)
		if err != nil {
			return err
		}
		if m > 0 {
			q.mu.Lock()
			q.local = append(q.local, buf[:m]...)
			q.mu.Unlock()
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(start) < waitSpin {
			runtime.Gosched()
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		err = q.inner.Wait(wctx)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, context.DeadlineExceeded):
			return err
		}
	}
}

// waitSpin is how long Wait polls before it blocks.
const waitSpin = 100 * time.Microsecond

func (q *cq) Close() error { return q.inner.Close() }
