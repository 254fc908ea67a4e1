package topology

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Problem is one thing wrong with a topology.
type Problem struct {
	// Path names the field, as in "links[2].bandwidth" or "nodes[3]"; empty
	// for the document as a whole.
	Path string
	// Line is the line of the source text the field is on; 0 when unknown
	// (a topology built in Go, or a field that is missing).
	Line int
	// Msg says what is wrong.
	Msg string
}

// String formats the problem as "path: msg (line N)".
func (p Problem) String() string {
	s := p.Msg
	if p.Path != "" {
		s = p.Path + ": " + s
	}
	if p.Line > 0 {
		s += " (line " + strconv.Itoa(p.Line) + ")"
	}
	return s
}

// ValidationError lists every problem found in a topology, in document order.
type ValidationError struct {
	// Topology is the topology's name, if it has one.
	Topology string
	// Problems has at least one element.
	Problems []Problem
}

// Error lists the problems, one per line after the first when there are
// several.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("topology")
	if e.Topology != "" {
		fmt.Fprintf(&b, " %q", e.Topology)
	}
	if len(e.Problems) == 1 {
		b.WriteString(": " + e.Problems[0].String())
		return b.String()
	}
	fmt.Fprintf(&b, ": %d problems:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n\t" + p.String())
	}
	return b.String()
}

// positions maps field paths ("links[2].b") to the source line they are on.
type positions map[string]int

// line returns the line of path, or of its closest enclosing element
// ("links[2]" for a missing "links[2].latency").
func (p positions) line(path string) int {
	for path != "" {
		if l, ok := p[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// Validate checks t and returns a *[ValidationError] listing every problem,
// or nil. It checks that:
//   - the topology has a name and 1 to [MaxNodes] nodes and at most
//     [MaxLinks] links;
//   - every node has a valid, unique name and a known kind; counts and sizes
//     are not negative; a switch has no CPUs, memory, NUMA nodes or devices;
//   - every device has a known kind and a count and memory that are not
//     negative;
//   - every link joins two different known nodes, at most one link joins a
//     pair, bandwidth is positive and finite, and latency is not negative
//     (zero is allowed: a negligible latency) nor above an hour (surely a
//     typo, and it keeps path sums far from overflowing);
//   - every node can reach the first one (the first with a valid name).
func (t *Topology) Validate() error {
	if probs := validate(t, nil, true); len(probs) > 0 {
		return &ValidationError{Topology: t.Name, Problems: probs}
	}
	return nil
}

// maxLatency bounds a link's latency.
const maxLatency = time.Hour

type validator struct {
	pos     positions
	probs   []Problem
	badName map[int]bool // nodes whose name is already reported
}

func (v *validator) add(path, format string, args ...any) {
	v.probs = append(v.probs, Problem{Path: path, Line: v.pos.line(path), Msg: fmt.Sprintf(format, args...)})
}

// validate returns t's problems; pos gives their lines, and connectivity is
// checked only if asked (not when the links could not be read at all).
func validate(t *Topology, pos positions, checkConnected bool) []Problem {
	v := &validator{pos: pos, badName: map[int]bool{}}
	if t.Name == "" {
		v.add("name", "missing")
	}
	if len(t.Nodes) == 0 {
		v.add("nodes", "a topology needs at least one node")
	}
	if len(t.Nodes) > MaxNodes {
		v.add("nodes", "%d nodes, more than the limit of %d", len(t.Nodes), MaxNodes)
		return v.probs
	}
	if len(t.Links) > MaxLinks {
		v.add("links", "%d links, more than the limit of %d", len(t.Links), MaxLinks)
		return v.probs
	}
	index := make(map[string]int, len(t.Nodes))
	for i := range t.Nodes {
		v.node(i, &t.Nodes[i], index)
	}
	adj := make([][]int, len(t.Nodes))
	seen := make(map[[2]string]int, len(t.Links))
	for i, l := range t.Links {
		p := "links[" + strconv.Itoa(i) + "]"
		a, okA := v.end(p+".a", l.A, index)
		b, okB := v.end(p+".b", l.B, index)
		switch {
		case okA && okB && a == b:
			v.add(p, "self-link on %q", l.A)
		case okA && okB:
			key := [2]string{l.A, l.B}
			if key[0] > key[1] {
				key[0], key[1] = key[1], key[0]
			}
			if first, dup := seen[key]; dup {
				v.add(p, "duplicate link between %q and %q (first at links[%d]); describe parallel links as one with their summed bandwidth", l.A, l.B, first)
			} else {
				seen[key] = i
				adj[a] = append(adj[a], b)
				adj[b] = append(adj[b], a)
			}
		}
		switch {
		case !(l.Bandwidth > 0):
			v.add(p+".bandwidth", "must be positive, got %s", FormatBandwidth(l.Bandwidth))
		case math.IsInf(l.Bandwidth, 1):
			v.add(p+".bandwidth", "must be finite")
		}
		switch {
		case l.Latency < 0:
			v.add(p+".latency", "must not be negative, got %v", l.Latency)
		case l.Latency > maxLatency:
			v.add(p+".latency", "must be at most %v, got %v", maxLatency, l.Latency)
		}
	}
	if checkConnected {
		v.connected(t, adj)
	}
	return v.probs
}

func (v *validator) node(i int, n *Node, index map[string]int) {
	p := "nodes[" + strconv.Itoa(i) + "]"
	first, dup := index[n.Name]
	switch {
	case n.Name == "":
		v.add(p+".name", "missing")
	case !validName(n.Name):
		v.add(p+".name", "%q is not a valid node name: use 1 to 253 letters, digits, '.', '-' or '_', starting with a letter or digit", n.Name)
	case dup:
		v.add(p+".name", "duplicate node %q (first at nodes[%d])", n.Name, first)
	default:
		index[n.Name] = i
	}
	if _, ok := index[n.Name]; !ok || index[n.Name] != i {
		v.badName[i] = true
	}
	switch n.Kind {
	case "", Compute, Switch:
	default:
		v.add(p+".kind", "unknown kind %q (use compute or switch)", n.Kind)
	}
	v.notNegative(p+".cpus", int64(n.CPUs), strconv.Itoa(n.CPUs))
	v.notNegative(p+".numa_nodes", int64(n.NUMANodes), strconv.Itoa(n.NUMANodes))
	v.notNegative(p+".memory", n.MemoryBytes, FormatBytes(n.MemoryBytes))
	if n.Kind == Switch {
		if n.CPUs > 0 {
			v.add(p+".cpus", "a switch hosts nothing: want 0, got %d", n.CPUs)
		}
		if n.NUMANodes > 0 {
			v.add(p+".numa_nodes", "a switch hosts nothing: want 0, got %d", n.NUMANodes)
		}
		if n.MemoryBytes > 0 {
			v.add(p+".memory", "a switch hosts nothing: want 0, got %s", FormatBytes(n.MemoryBytes))
		}
		if len(n.Devices) > 0 {
			v.add(p+".devices", "a switch hosts no devices")
		}
	}
	for k, d := range n.Devices {
		dp := p + ".devices[" + strconv.Itoa(k) + "]"
		switch d.Kind {
		case GPU, NPU, KAE:
		case "":
			v.add(dp+".kind", "missing (use GPU, NPU or KAE)")
		default:
			v.add(dp+".kind", "unknown device kind %q (use GPU, NPU or KAE)", d.Kind)
		}
		v.notNegative(dp+".count", int64(d.Count), strconv.Itoa(d.Count))
		v.notNegative(dp+".memory", d.MemoryBytes, FormatBytes(d.MemoryBytes))
	}
	for key := range n.Labels {
		if key == "" {
			v.add(p+".labels", "empty label key")
		}
	}
}

func (v *validator) notNegative(path string, n int64, shown string) {
	if n < 0 {
		v.add(path, "must not be negative, got %s", shown)
	}
}

// end checks one end of a link.
func (v *validator) end(path, name string, index map[string]int) (int, bool) {
	if name == "" {
		v.add(path, "missing")
		return 0, false
	}
	i, ok := index[name]
	if !ok {
		v.add(path, "unknown node %q", name)
	}
	return i, ok
}

// connected reports every node that cannot reach nodes[0] over valid links,
// except nodes whose name is already reported (no link can name them).
func (v *validator) connected(t *Topology, adj [][]int) {
	if len(t.Nodes) < 2 {
		return
	}
	root := 0
	for v.badName[root] {
		if root++; root == len(t.Nodes) {
			return
		}
	}
	reached := make([]bool, len(t.Nodes))
	reached[root] = true
	queue := []int{root}
	for len(queue) > 0 {
		u := queue[0]
		queue = queue[1:]
		for _, w := range adj[u] {
			if !reached[w] {
				reached[w] = true
				queue = append(queue, w)
			}
		}
	}
	for i, ok := range reached {
		if !ok && !v.badName[i] {
			v.add("nodes["+strconv.Itoa(i)+"]", "node %q is not connected to node %q", t.Nodes[i].Name, t.Nodes[root].Name)
		}
	}
}

// validName reports whether s can name a node: a host name fits, and so does
// anything that can sit in a ub://node/service address unescaped.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case (c == '.' || c == '-' || c == '_') && i > 0:
		default:
			return false
		}
	}
	return true
}
