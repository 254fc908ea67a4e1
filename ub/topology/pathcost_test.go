package topology

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

const us = time.Microsecond

func mustNew(t testing.TB, nodes []string, links ...Link) *Topology {
	t.Helper()
	ns := make([]Node, len(nodes))
	for i, n := range nodes {
		ns[i] = Node{Name: n}
	}
	topo, err := New("test", ns, links)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func TestPathCost(t *testing.T) {
	// The widest path beats the fastest for big transfers only:
	// a-b direct is 1µs at 1GB/s, a-c-b is 4µs at 100GB/s.
	detour := mustNew(t, []string{"a", "b", "c"},
		link("a", "b", 1e9, us),
		link("a", "c", 100e9, 2*us),
		link("c", "b", 100e9, 2*us),
	)
	// Shortest-widest is not found hop by hop: s-v direct is the widest way
	// to v (10GB/s, 5µs), but to reach t over v-t (5GB/s) the narrower
	// s-u-v (8GB/s, 1µs) is as wide and faster. s-t direct is the fastest
	// path (1.5µs) but only 1GB/s.
	shortestWidest := mustNew(t, []string{"s", "u", "v", "t"},
		link("s", "v", 10e9, 5*us),
		link("s", "u", 8e9, us/2),
		link("u", "v", 8e9, us/2),
		link("v", "t", 5e9, us),
		link("s", "t", 1e9, 3*us/2),
	)
	// Equal latency: the fastest path is the wider one.
	tie := mustNew(t, []string{"a", "b", "c", "d"},
		link("a", "b", 5e9, us), link("b", "d", 5e9, us),
		link("a", "c", 10e9, us), link("c", "d", 10e9, us),
	)
	// Zero-latency links are allowed.
	free := mustNew(t, []string{"a", "b", "c"}, link("a", "b", 2e9, 0), link("b", "c", 4e9, 0))
	for _, tc := range []struct {
		name     string
		topo     *Topology
		from, to string
		bytes    int64
		want     Cost
		path     []string
	}{
		{"detour 64B takes the direct link", detour, "a", "b", 64,
			Cost{Latency: us, Bandwidth: 1e9, Hops: 1, Transfer: us + 64}, []string{"a", "b"}},
		{"detour 1GiB takes the wide way", detour, "a", "b", 1 << 30,
			// 4µs + 2^30 B / 100e9 B/s = 4µs + 10737418.24ns
			Cost{Latency: 4 * us, Bandwidth: 100e9, Hops: 2, Transfer: 4*us + 10737418}, []string{"a", "b"}},
		{"detour reversed", detour, "b", "a", 1 << 30,
			Cost{Latency: 4 * us, Bandwidth: 100e9, Hops: 2, Transfer: 4*us + 10737418}, []string{"b", "a"}},
		{"zero bytes is the latency", detour, "a", "c", 0,
			Cost{Latency: 2 * us, Bandwidth: 100e9, Hops: 1, Transfer: 2 * us}, []string{"a", "c"}},
		{"same node", detour, "c", "c", 1 << 30,
			Cost{Bandwidth: math.Inf(1)}, []string{"c"}},
		{"shortest-widest small", shortestWidest, "s", "t", 64,
			Cost{Latency: 3 * us / 2, Bandwidth: 1e9, Hops: 1, Transfer: 3*us/2 + 64}, []string{"s", "t"}},
		{"shortest-widest 1MB", shortestWidest, "s", "t", 1e6,
			// 2µs + 1e6 B / 5e9 B/s = 2µs + 200µs, not 6µs + 200µs
			Cost{Latency: 2 * us, Bandwidth: 5e9, Hops: 3, Transfer: 202 * us}, []string{"s", "t"}},
		{"to v, 1MB: direct is wider", shortestWidest, "s", "v", 1e6,
			// direct: 5µs + 100µs; via u: 1µs + 125µs
			Cost{Latency: 5 * us, Bandwidth: 10e9, Hops: 1, Transfer: 105 * us}, []string{"s", "u", "v"}},
		{"to v, 64B: via u is faster", shortestWidest, "v", "s", 64,
			Cost{Latency: us, Bandwidth: 8e9, Hops: 2, Transfer: us + 8}, []string{"v", "u", "s"}},
		{"equal latency, wider wins", tie, "a", "d", 10e9,
			Cost{Latency: 2 * us, Bandwidth: 10e9, Hops: 2, Transfer: 2*us + time.Second}, []string{"a", "c", "d"}},
		{"zero latency", free, "a", "c", 2e9,
			Cost{Latency: 0, Bandwidth: 2e9, Hops: 2, Transfer: time.Second}, []string{"a", "b", "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.topo.PathCost(tc.from, tc.to, tc.bytes)
			if err != nil || got != tc.want {
				t.Errorf("PathCost = %+v, %v\nwant         %+v", got, err, tc.want)
			}
			i, _ := tc.topo.NodeIndex(tc.from)
			j, _ := tc.topo.NodeIndex(tc.to)
			if idx := tc.topo.PathCostIdx(i, j, tc.bytes); idx != got {
				t.Errorf("PathCostIdx = %+v, PathCost = %+v", idx, got)
			}
			path, err := tc.topo.Path(tc.from, tc.to)
			if err != nil || !slices.Equal(path, tc.path) {
				t.Errorf("Path = %q, %v; want %q", path, err, tc.path)
			}
		})
	}
}

func TestPathCostErrors(t *testing.T) {
	topo := mustNew(t, []string{"a", "b"}, link("a", "b", 1e9, us))
	if _, err := topo.PathCost("a", "x", 1); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("unknown to: %v", err)
	}
	if _, err := topo.PathCost("x", "a", 1); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("unknown from: %v", err)
	}
	if _, err := topo.Path("a", "x"); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("Path unknown: %v", err)
	}
	if _, err := topo.PathCost("a", "b", -1); err == nil {
		t.Error("negative size accepted")
	}
	if c := topo.PathCostIdx(0, 1, -1); c.Transfer != us {
		t.Errorf("PathCostIdx with a negative size = %+v", c)
	}
	if c := topo.PathCostIdx(0, 1, math.MaxInt64); c.Transfer != math.MaxInt64 {
		t.Errorf("huge transfer = %v, want the largest Duration", c.Transfer)
	}
	if _, ok := topo.NodeIndex("x"); ok {
		t.Error("NodeIndex(x) found")
	}
	var zero Topology
	if _, err := zero.PathCost("a", "b", 1); err == nil {
		t.Error("PathCost on a zero Topology succeeded")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("PathCostIdx out of range did not panic")
			}
		}()
		topo.PathCostIdx(0, 2, 1)
	}()
}

// TestRoutesBruteForce compares the precomputed paths of random small
// graphs with an enumeration of every simple path.
func TestRoutesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 2000 {
		n := 2 + rng.IntN(6)
		names := make([]string, n)
		for i := range names {
			names[i] = "n" + strconv.Itoa(i)
		}
		var links []Link
		seen := map[[2]int]bool{}
		for i := 1; i < n; i++ { // a random spanning tree keeps it connected
			j := rng.IntN(i)
			seen[[2]int{j, i}] = true
			links = append(links, randomLink(rng, names[j], names[i]))
		}
		for range rng.IntN(2 * n) {
			i, j := rng.IntN(n), rng.IntN(n)
			if i > j {
				i, j = j, i
			}
			if i != j && !seen[[2]int{i, j}] {
				seen[[2]int{i, j}] = true
				links = append(links, randomLink(rng, names[i], names[j]))
			}
		}
		topo := mustNew(t, names, links...)
		r := topo.routes
		for i := range n {
			for j := range n {
				if i == j {
					continue
				}
				fast, wide := bruteForce(topo, i, j)
				p := r.pairs[i*n+j]
				if got := (pathStat{p.fastLat, p.fastBW, p.fastHops}); got != fast {
					t.Fatalf("graph %d %v: fastest %d→%d = %+v, want %+v", iter, links, i, j, got, fast)
				}
				if got := (pathStat{p.wideLat, p.wideBW, p.wideHops}); got != wide {
					t.Fatalf("graph %d %v: widest %d→%d = %+v, want %+v", iter, links, i, j, got, wide)
				}
				if a, b := topo.PathCostIdx(i, j, 1<<20), topo.PathCostIdx(j, i, 1<<20); a != b {
					t.Fatalf("graph %d: cost %d→%d = %+v, back = %+v", iter, i, j, a, b)
				}
				path, _ := topo.Path(names[i], names[j])
				if lat, hops := pathLatency(topo, path); lat != fast.lat || hops != fast.hops {
					t.Fatalf("graph %d: Path %v has latency %d in %d hops, want %+v", iter, path, lat, hops, fast)
				}
			}
		}
	}
}

func randomLink(rng *rand.Rand, a, b string) Link {
	// Few distinct values, so that ties happen.
	return link(a, b, float64(1+rng.IntN(4))*1e9, time.Duration(rng.IntN(4))*us)
}

type pathStat struct {
	lat  int64
	bw   float64
	hops int32
}

// bruteForce enumerates the simple paths from i to j and returns the
// lexicographic best by (latency, hops, -bandwidth) and by (-bandwidth,
// latency, hops).
func bruteForce(topo *Topology, i, j int) (fast, wide pathStat) {
	n := len(topo.Nodes)
	type edgeTo struct {
		to  int
		lat int64
		bw  float64
	}
	adj := make([][]edgeTo, n)
	for _, l := range topo.Links {
		a, _ := topo.NodeIndex(l.A)
		b, _ := topo.NodeIndex(l.B)
		adj[a] = append(adj[a], edgeTo{b, int64(l.Latency), l.Bandwidth})
		adj[b] = append(adj[b], edgeTo{a, int64(l.Latency), l.Bandwidth})
	}
	fast = pathStat{lat: math.MaxInt64}
	wide = pathStat{lat: math.MaxInt64, bw: -1}
	visited := make([]bool, n)
	var walk func(v int, s pathStat)
	walk = func(v int, s pathStat) {
		if v == j {
			if s.lat < fast.lat || s.lat == fast.lat && (s.hops < fast.hops || s.hops == fast.hops && s.bw > fast.bw) {
				fast = s
			}
			if s.bw > wide.bw || s.bw == wide.bw && (s.lat < wide.lat || s.lat == wide.lat && s.hops < wide.hops) {
				wide = s
			}
			return
		}
		visited[v] = true
		for _, e := range adj[v] {
			if !visited[e.to] {
				walk(e.to, pathStat{s.lat + e.lat, min(s.bw, e.bw), s.hops + 1})
			}
		}
		visited[v] = false
	}
	walk(i, pathStat{bw: math.Inf(1)})
	return fast, wide
}

func pathLatency(topo *Topology, path []string) (int64, int32) {
	var lat int64
	for k := 1; k < len(path); k++ {
		for _, l := range topo.Links {
			if l.A == path[k-1] && l.B == path[k] || l.B == path[k-1] && l.A == path[k] {
				lat += int64(l.Latency)
			}
		}
	}
	return lat, int32(len(path) - 1)
}

func TestCM384Costs(t *testing.T) {
	topo, err := Example("cm384")
	if err != nil {
		t.Fatal(err)
	}
	compute, switches := 0, 0
	for i := range topo.Nodes {
		n := &topo.Nodes[i]
		if n.IsSwitch() {
			switches++
			continue
		}
		compute++
		if n.DeviceCount(NPU) != 8 || n.CPUs != 192 {
			t.Errorf("%s: %d NPUs, %d CPUs", n.Name, n.DeviceCount(NPU), n.CPUs)
		}
	}
	if compute != 48 || switches != 8 || len(topo.Links) != 384 {
		t.Fatalf("cm384 has %d compute nodes, %d switches, %d links", compute, switches, len(topo.Links))
	}
	for i := range topo.Nodes {
		for j := range topo.Nodes {
			if i == j || topo.Nodes[i].IsSwitch() || topo.Nodes[j].IsSwitch() {
				continue
			}
			c := topo.PathCostIdx(i, j, 0)
			if c.Latency != us || c.Bandwidth != 392e9 || c.Hops != 2 {
				t.Fatalf("%s→%s: %+v, want 1µs, 392GB/s, 2 hops", topo.Nodes[i].Name, topo.Nodes[j].Name, c)
			}
		}
	}
}

// A node's link bandwidth is the widest of its links; none without links.
func TestLinkBandwidth(t *testing.T) {
	two, err := New("two", []Node{{Name: "a"}, {Name: "b"}, {Name: "sw", Kind: Switch}, {Name: "c"}},
		[]Link{{A: "a", B: "b", Bandwidth: 1e9}, {A: "a", B: "sw", Bandwidth: 400e9}, {A: "sw", B: "c", Bandwidth: 100e9}})
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range map[string]float64{"a": 400e9, "b": 1e9, "c": 100e9, "nowhere": 0} {
		if got := two.LinkBandwidth(node); got != want {
			t.Errorf("LinkBandwidth(%s) = %g, want %g", node, got, want)
		}
	}
}
