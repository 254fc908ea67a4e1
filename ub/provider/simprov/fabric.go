package simprov

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// Fabric is the shared state of a simulated super node on this host: for
// every link, when it is next free and its faults; for every node, whether
// it crashed. All processes that play nodes of the same topology share it.
type Fabric struct {
	t     *topology.Topology
	seg   *shm.Segment
	links map[[2]int]int // node index pair -> link index

	routes sync.Map // [2]int node indices -> []int link indices of the path
}

// Layout: magic u64 at 0, then per link a 64-byte record (busy-until ns
// u64, down u32, slow u32 in percent), then per node a u32 crashed flag.
const (
	fabricMagic  = 0x5342_4146_4b42_55 // "UBKFABS"
	linkRecord   = 64
	linksOff     = 64
	offBusyUntil = 0
	offDown      = 8
	offSlow      = 12
)

func fabricName(t *topology.Topology) string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|", t.Name)
	for _, n := range t.Nodes {
		fmt.Fprintf(h, "%s,", n.Name)
	}
	for _, l := range t.Links {
		fmt.Fprintf(h, "%s-%s:%v:%v,", l.A, l.B, l.Bandwidth, l.Latency)
	}
	return fmt.Sprintf("sim-%x", h.Sum64())
}

// OpenFabric opens (creating it if it does not exist yet) the shared state
// of topology t.
func OpenFabric(t *topology.Topology) (*Fabric, error) { return OpenFabricNamed(t, "") }

// OpenFabricNamed opens the shared state of topology t that goes by name
// (see OptFabric; "" is OpenFabric's): letters, digits, '-' and '_', at
// most 64.
func OpenFabricNamed(t *topology.Topology, ns string) (*Fabric, error) {
	size := linksOff + len(t.Links)*linkRecord + 4*len(t.Nodes)
	name := fabricName(t)
	if ns != "" {
		if len(ns) > 64 || strings.Trim(ns, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			return nil, fmt.Errorf("simprov: fabric name %q: use at most 64 letters, digits, '-' and '_'", ns)
		}
		name += "-" + ns
	}
	seg, err := shm.CreateSegment(name, size, &shm.SegmentConfig{Keep: true})
	created := err == nil
	if errors.Is(err, os.ErrExist) {
		seg, err = shm.OpenSegment(name)
	}
	if err != nil {
		return nil, fmt.Errorf("simprov: fabric %s: %w", name, err)
	}
	magic, err := seg.Uint64At(0)
	if err != nil || seg.Size() < size {
		seg.Close()
		return nil, fmt.Errorf("simprov: fabric %s has the wrong size for this topology", name)
	}
	// The magic's low half is the word a process that opens the fabric
	// while its creator is still setting it up sleeps on.
	ready, err := seg.Uint32At(0)
	if err != nil {
		seg.Close()
		return nil, fmt.Errorf("simprov: fabric %s: %w", name, err)
	}
	if created {
		magic.Store(fabricMagic)
		shm.Wake(ready)
	} else {
		// Another process is creating it: wait a second at most for the
		// magic (a creator that died before writing it leaves the
		// fabric unusable until it is removed).
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := shm.Wait{}.Until(ctx, ready, func(uint32) bool { return magic.Load() == fabricMagic })
		cancel()
		if err != nil {
			seg.Close()
			return nil, fmt.Errorf("simprov: fabric %s is not initialized (its creator did not finish; remove it): %w", name, err)
		}
	}
	f := &Fabric{t: t, seg: seg, links: map[[2]int]int{}}
	for i, l := range t.Links {
		a, _ := t.NodeIndex(l.A)
		b, _ := t.NodeIndex(l.B)
		f.links[[2]int{a, b}] = i
		f.links[[2]int{b, a}] = i
	}
	return f, nil
}

// Close unmaps the fabric. The shared state stays for the other processes;
// Remove deletes it.
func (f *Fabric) Close() error { return f.seg.Close() }

// Remove deletes the fabric's shared state (faults and link reservations).
func (f *Fabric) Remove() error { return f.seg.Unlink() }

func (f *Fabric) word64(off int) *atomic.Uint64 {
	w, _ := f.seg.Uint64At(off)
	return w
}

func (f *Fabric) word32(off int) *atomic.Uint32 {
	w, _ := f.seg.Uint32At(off)
	return w
}

func (f *Fabric) linkIndex(a, b string) (int, error) {
	i, ok1 := f.t.NodeIndex(a)
	j, ok2 := f.t.NodeIndex(b)
	if !ok1 || !ok2 {
		return 0, fmt.Errorf("simprov: unknown node in link %s-%s", a, b)
	}
	l, ok := f.links[[2]int{i, j}]
	if !ok {
		return 0, fmt.Errorf("simprov: no link between %s and %s", a, b)
	}
	return l, nil
}

// SetLinkDown takes the link between a and b down (or back up): operations
// whose path crosses it complete with StatusLinkDown.
func (f *Fabric) SetLinkDown(a, b string, down bool) error {
	l, err := f.linkIndex(a, b)
	if err != nil {
		return err
	}
	v := uint32(0)
	if down {
		v = 1
	}
	f.word32(linksOff + l*linkRecord + offDown).Store(v)
	return nil
}

// SetLinkSlow makes the link between a and b factor times slower: its
// latency multiplied and its bandwidth divided by factor (1 restores it).
func (f *Fabric) SetLinkSlow(a, b string, factor float64) error {
	if factor < 1 || factor > 1e6 {
		return fmt.Errorf("simprov: slow factor %v must be between 1 and 1e6", factor)
	}
	l, err := f.linkIndex(a, b)
	if err != nil {
		return err
	}
	f.word32(linksOff + l*linkRecord + offSlow).Store(uint32(factor * 100))
	return nil
}

// SetNodeCrashed marks a node crashed (or recovered): operations to it
// complete with StatusPeerDead.
func (f *Fabric) SetNodeCrashed(node string, crashed bool) error {
	i, ok := f.t.NodeIndex(node)
	if !ok {
		return fmt.Errorf("simprov: unknown node %q", node)
	}
	v := uint32(0)
	if crashed {
		v = 1
	}
	f.word32(f.nodesOff() + 4*i).Store(v)
	return nil
}

func (f *Fabric) nodesOff() int { return linksOff + len(f.t.Links)*linkRecord }

func (f *Fabric) crashed(node int) bool { return f.word32(f.nodesOff()+4*node).Load() != 0 }

// route is what an operation of some size between two nodes costs now.
type route struct {
	down    bool
	crashed bool
	// start is when the transfer can begin (links busy until then), due when
	// it has arrived.
	due time.Time
}

// reserve books a transfer of bytes from node a to node b along the fastest
// path: each link is occupied for bytes over its (possibly slowed)
// bandwidth, after the flows already booked on it; the transfer arrives
// after the path's latency plus its time on the bottleneck.
func (f *Fabric) reserve(a, b string, bytes int64, now time.Time) (route, error) {
	bi, ok := f.t.NodeIndex(b)
	if !ok {
		return route{}, fmt.Errorf("simprov: unknown node %q", b)
	}
	if f.crashed(bi) {
		return route{crashed: true}, nil
	}
	if a == b {
		return route{due: now}, nil
	}
	ai, ok := f.t.NodeIndex(a)
	if !ok {
		return route{}, fmt.Errorf("simprov: unknown node %q", a)
	}
	links, err := f.pathLinks(ai, bi)
	if err != nil {
		return route{}, err
	}
	var latency time.Duration
	var xfer time.Duration
	type hop struct {
		l   int
		dur time.Duration
	}
	var small [8]hop
	hops := small[:0]
	start := now.UnixNano()
	for _, l := range links {
		rec := linksOff + l*linkRecord
		if f.word32(rec+offDown).Load() != 0 {
			return route{down: true}, nil
		}
		slow := float64(f.word32(rec+offSlow).Load()) / 100
		if slow < 1 {
			slow = 1
		}
		link := f.t.Links[l]
		latency += time.Duration(float64(link.Latency) * slow)
		d := time.Duration(float64(bytes) / (link.Bandwidth / slow) * 1e9)
		xfer = max(xfer, d)
		hops = append(hops, hop{l, d})
		if busy := int64(f.word64(rec + offBusyUntil).Load()); busy > start {
			start = busy
		}
	}
	// Book every link from the common start.
	for _, h := range hops {
		w := f.word64(linksOff + h.l*linkRecord + offBusyUntil)
		end := uint64(start + int64(h.dur))
		for {
			cur := w.Load()
			if cur >= end || w.CompareAndSwap(cur, end) {
				break
			}
		}
	}
	return route{due: time.Unix(0, start).Add(latency + xfer)}, nil
}

// pathLinks returns the links of the path from node index a to b, worked
// out once per pair (the topology does not change; links going down or
// slowing down are read from the fabric on every operation).
func (f *Fabric) pathLinks(a, b int) ([]int, error) {
	key := [2]int{a, b}
	if v, ok := f.routes.Load(key); ok {
		return v.([]int), nil
	}
	path, err := f.t.Path(f.t.Nodes[a].Name, f.t.Nodes[b].Name)
	if err != nil {
		return nil, err
	}
	links := make([]int, 0, len(path))
	for k := 1; k < len(path); k++ {
		l, err := f.linkIndex(path[k-1], path[k])
		if err != nil {
			return nil, err
		}
		links = append(links, l)
	}
	f.routes.Store(key, links)
	return links, nil
}

// LinkState describes the link between a and b now: "up", "down" or
// "up, 10x slower".
func (f *Fabric) LinkState(a, b string) string {
	l, err := f.linkIndex(a, b)
	if err != nil {
		return err.Error()
	}
	rec := linksOff + l*linkRecord
	if f.word32(rec+offDown).Load() != 0 {
		return "down"
	}
	if slow := f.word32(rec + offSlow).Load(); slow > 100 {
		return fmt.Sprintf("up, %gx slower", float64(slow)/100)
	}
	return "up"
}
