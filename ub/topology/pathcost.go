package topology

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Cost is what it takes to move a number of bytes from one node to another
// along the better of two precomputed paths (see [Topology.PathCost]).
type Cost struct {
	// Latency is the sum of the link latencies along the path.
	Latency time.Duration
	// Bandwidth is the path's bottleneck: the smallest link bandwidth on it,
	// in bytes per second. It is +Inf from a node to itself (no link is
	// crossed).
	Bandwidth float64
	// Hops is the number of links crossed (0 from a node to itself).
	Hops int
	// Transfer is the time to deliver the bytes: Latency + bytes/Bandwidth,
	// rounded to the nanosecond (capped at the largest Duration).
	Transfer time.Duration
}

// String formats c as "1µs, 392GB/s, 2 hops, transfer 3.675µs".
func (c Cost) String() string {
	return fmt.Sprintf("%v, %s, %d hops, transfer %v", c.Latency, FormatBandwidth(c.Bandwidth), c.Hops, c.Transfer)
}

// pairCost is the precomputed pair of paths between two nodes: the one with
// the least latency (ties: fewest hops, then widest) and the one with the
// widest bottleneck (ties: least latency, then fewest hops).
type pairCost struct {
	fastLat, wideLat   int64
	fastBW, wideBW     float64
	fastHops, wideHops int32
}

// routes are the path tables of a topology, computed once by New or Parse.
type routes struct {
	n     int
	index map[string]int
	pairs []pairCost // pairs[i*n+j]
	pred  []int32    // pred[i*n+j]: the node before j on the fastest path from i
}

// PathCost returns the cost of moving bytes from node from to node to: of
// the two precomputed paths between them, the minimum-latency path and the
// widest (maximum-bottleneck) path, the one whose Latency + bytes/Bandwidth
// is smaller (the minimum-latency one on a tie). Small messages therefore
// take the fastest path and bulk transfers the widest. From a node to
// itself the cost is zero with an infinite Bandwidth. Unknown names give an
// error wrapping [ErrUnknownNode]; a negative size is an error.
func (t *Topology) PathCost(from, to string, bytes int64) (Cost, error) {
	i, err := t.lookup(from)
	if err != nil {
		return Cost{}, err
	}
	j, err := t.lookup(to)
	if err != nil {
		return Cost{}, err
	}
	if bytes < 0 {
		return Cost{}, fmt.Errorf("topology: negative size %d", bytes)
	}
	return t.PathCostIdx(i, j, bytes), nil
}

// PathCostIdx is [Topology.PathCost] for node indices (positions in
// t.Nodes, see [Topology.NodeIndex]): it neither allocates nor looks up a
// map. A negative size counts as zero. It panics if i or j is out of range,
// like a slice index, or if t was not made by this package (New, Parse,
// ...), which [Topology.PathCost] reports as an error.
func (t *Topology) PathCostIdx(i, j int, bytes int64) Cost {
	r := t.routes
	if uint(i) >= uint(r.n) || uint(j) >= uint(r.n) {
		panic(fmt.Sprintf("topology: node index out of range [%d, %d] with %d nodes", i, j, r.n))
	}
	if i == j {
		return Cost{Bandwidth: math.Inf(1)}
	}
	p := &r.pairs[i*r.n+j]
	fast := transferTime(p.fastLat, p.fastBW, bytes)
	wide := transferTime(p.wideLat, p.wideBW, bytes)
	if wide < fast {
		return Cost{Latency: time.Duration(p.wideLat), Bandwidth: p.wideBW, Hops: int(p.wideHops), Transfer: wide}
	}
	return Cost{Latency: time.Duration(p.fastLat), Bandwidth: p.fastBW, Hops: int(p.fastHops), Transfer: fast}
}

func transferTime(lat int64, bw float64, bytes int64) time.Duration {
	if bytes <= 0 {
		return time.Duration(lat)
	}
	x := float64(bytes)/bw*1e9 + 0.5
	if x >= float64(math.MaxInt64-lat) {
		return math.MaxInt64
	}
	return time.Duration(lat + int64(x))
}

// Path returns the names of the nodes along the minimum-latency path from
// from to to, both included ([from] when they are the same node).
func (t *Topology) Path(from, to string) ([]string, error) {
	i, err := t.lookup(from)
	if err != nil {
		return nil, err
	}
	j, err := t.lookup(to)
	if err != nil {
		return nil, err
	}
	r := t.routes
	path := []string{to}
	for v := j; v != i; {
		v = int(r.pred[i*r.n+v])
		path = append(path, t.Nodes[v].Name)
	}
	slices.Reverse(path)
	return path, nil
}

// edge is one direction of a link in the adjacency lists.
type edge struct {
	to  int32
	lat int64
	bw  float64
}

// level is the set of links that share one bandwidth.
type level struct {
	bw    float64
	links []int
}

const infLat = math.MaxInt64

// computeRoutes fills the path tables of a valid topology: one Dijkstra per
// source for the fastest paths, and one widest-path pass per source.
//
// The widest path cannot be found by a Dijkstra on (bandwidth, latency)
// labels, because widening is not order preserving: of two partial paths the
// wider one may end up slower once a narrower link caps both. Instead links
// are added to the graph one bandwidth level at a time, widest first, and a
// Dijkstra on latency restricted to the links added so far is continued
// after each level (adding links only ever lowers latencies). A node first
// reached at level β has a maximum bottleneck of exactly β, and its latency
// and hops at the end of that level are the least among the paths that wide.
// The cost is O(n · (E log n + L)) for n nodes, E links and L distinct
// bandwidths.
func computeRoutes(t *Topology) *routes {
	n := len(t.Nodes)
	r := &routes{
		n:     n,
		index: make(map[string]int, n),
		pairs: make([]pairCost, n*n),
		pred:  make([]int32, n*n),
	}
	for i := range t.Nodes {
		r.index[t.Nodes[i].Name] = i
	}
	adj := make([][]edge, n)
	byBW := map[float64]int{}
	var levels []level
	for li, l := range t.Links {
		a, b := int32(r.index[l.A]), int32(r.index[l.B])
		lat := int64(l.Latency)
		adj[a] = append(adj[a], edge{b, lat, l.Bandwidth})
		adj[b] = append(adj[b], edge{a, lat, l.Bandwidth})
		k, ok := byBW[l.Bandwidth]
		if !ok {
			k = len(levels)
			byBW[l.Bandwidth] = k
			levels = append(levels, level{bw: l.Bandwidth})
		}
		levels[k].links = append(levels[k].links, li)
	}
	for _, es := range adj {
		// Widest first, so a level's usable links are a prefix.
		slices.SortStableFunc(es, func(x, y edge) int { return -cmpFloat(x.bw, y.bw) })
	}
	slices.SortFunc(levels, func(x, y level) int { return -cmpFloat(x.bw, y.bw) })
	ends := make([][2]int32, len(t.Links))
	for li, l := range t.Links {
		ends[li] = [2]int32{int32(r.index[l.A]), int32(r.index[l.B])}
	}
	s := &search{
		lat:  make([]int64, n),
		bw:   make([]float64, n),
		hops: make([]int32, n),
	}
	for src := range n {
		s.fastest(r, adj, src)
		s.widest(r, adj, levels, ends, t.Links, src)
	}
	return r
}

func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// search holds the scratch space of the per-source passes.
type search struct {
	lat   []int64
	bw    []float64
	hops  []int32
	heap  labelHeap
	fresh []int32
}

// fastest runs a Dijkstra from src on (latency, hops, -bandwidth) labels and
// fills row src's fastest entries and predecessors.
func (s *search) fastest(r *routes, adj [][]edge, src int) {
	for v := range r.n {
		s.lat[v], s.bw[v], s.hops[v] = infLat, 0, math.MaxInt32
	}
	s.lat[src], s.bw[src], s.hops[src] = 0, math.Inf(1), 0
	row := r.pred[src*r.n : (src+1)*r.n]
	row[src] = -1
	s.heap.push(label{0, math.Inf(1), 0, int32(src)})
	for len(s.heap) > 0 {
		it := s.heap.pop()
		v := it.v
		if it.lat != s.lat[v] || it.bw != s.bw[v] || it.hops != s.hops[v] {
			continue // stale
		}
		for _, e := range adj[v] {
			c := label{it.lat + e.lat, min(it.bw, e.bw), it.hops + 1, e.to}
			if c.less(label{s.lat[e.to], s.bw[e.to], s.hops[e.to], e.to}) {
				s.lat[e.to], s.bw[e.to], s.hops[e.to] = c.lat, c.bw, c.hops
				row[e.to] = v
				s.heap.push(c)
			}
		}
	}
	pairs := r.pairs[src*r.n : (src+1)*r.n]
	for v := range pairs {
		pairs[v].fastLat, pairs[v].fastBW, pairs[v].fastHops = s.lat[v], s.bw[v], s.hops[v]
	}
}

// widest fills row src's widest entries level by level (see computeRoutes).
func (s *search) widest(r *routes, adj [][]edge, levels []level, ends [][2]int32, links []Link, src int) {
	for v := range r.n {
		s.lat[v], s.hops[v] = infLat, math.MaxInt32
	}
	s.lat[src], s.hops[src] = 0, 0
	reached := 1
	pairs := r.pairs[src*r.n : (src+1)*r.n]
	for _, lv := range levels {
		if reached == r.n {
			break
		}
		s.fresh = s.fresh[:0]
		for _, li := range lv.links {
			a, b := ends[li][0], ends[li][1]
			lat := int64(links[li].Latency)
			s.relax(a, b, lat)
			s.relax(b, a, lat)
		}
		for len(s.heap) > 0 {
			it := s.heap.pop()
			v := it.v
			if it.lat != s.lat[v] || it.hops != s.hops[v] {
				continue
			}
			for _, e := range adj[v] {
				if e.bw < lv.bw {
					break
				}
				s.relax(v, e.to, e.lat)
			}
		}
		for _, v := range s.fresh {
			pairs[v].wideLat, pairs[v].wideBW, pairs[v].wideHops = s.lat[v], lv.bw, s.hops[v]
		}
		reached += len(s.fresh)
	}
}

// relax tries the link from u to v in the widest pass.
func (s *search) relax(u, v int32, lat int64) {
	if s.lat[u] == infLat {
		return
	}
	c := label{s.lat[u] + lat, 0, s.hops[u] + 1, v}
	if c.less(label{s.lat[v], 0, s.hops[v], v}) {
		if s.lat[v] == infLat {
			s.fresh = append(s.fresh, v)
		}
		s.lat[v], s.hops[v] = c.lat, c.hops
		s.heap.push(c)
	}
}

// label is a path's cost as the searches order it.
type label struct {
	lat  int64
	bw   float64
	hops int32
	v    int32
}

// less orders by latency, then fewer hops, then wider bandwidth. Extending
// two paths by the same link keeps their order (latency and hops add, the
// bottleneck takes a minimum that can only make them equal), which is what
// a Dijkstra needs to be exact. Wider-before-fewer-hops would not: a wider
// prefix with more hops can lose its width to a narrow link and keep its
// extra hops.
func (a label) less(b label) bool {
	if a.lat != b.lat {
		return a.lat < b.lat
	}
	if a.hops != b.hops {
		return a.hops < b.hops
	}
	return a.bw > b.bw
}

// labelHeap is a binary min-heap of labels (container/heap would box them).
type labelHeap []label

func (h *labelHeap) push(x label) {
	*h = append(*h, x)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if !a[i].less(a[p]) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *labelHeap) pop() label {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	for i := 0; ; {
		l, m := 2*i+1, i
		if l < len(a) && a[l].less(a[m]) {
			m = l
		}
		if l+1 < len(a) && a[l+1].less(a[m]) {
			m = l + 1
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}
