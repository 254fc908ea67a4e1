package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/ub/topology"
)

func runTopology(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := topologyCmd(args, &out)
	return out.String(), err
}

func TestTopologyShow(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"cm384", []string{"show", "-example", "cm384"}, []string{
			"topology cm384 (example cm384)",
			"48 compute nodes, 8 switches, 9216 CPUs, 72TiB memory, 384 NPU (48TiB)",
			"node07  compute  192   8     1.5TiB  8 NPU × 128GiB  rack=rack02",
			"ubsw7   switch   -     -     -       -               role=ub-plane",
			"384    every compute node ↔ every switch  392GB/s    500ns",
			"between compute nodes (1128 pairs):",
			"all 1128 pairs  node00 ↔ node01  1µs      392GB/s    2     1µs  3.675µs",
		}},
		{"dev4", []string{"show", "-example", "dev4"}, []string{
			"4 compute nodes, 24 CPUs, 64GiB memory, 4 NPU (128GiB), 1 GPU (24GiB), 1 KAE",
			"n0  n1  5GB/s      20µs",
			"all 6 pairs  n0 ↔ n1  20µs     5GB/s      1     20.013µs  229.715µs",
		}},
		{"laptop", []string{"show", "-example", "laptop"}, []string{
			"1 compute node, 8 CPUs, 16GiB memory",
			"a single node: every path is local",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := runTopology(t, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestTopologyShowPaths(t *testing.T) {
	// A star whose short arm is narrow: the nearest pair (x, c), the
	// farthest (a, b) and the slowest for 1 MiB (a, c) are three pairs.
	file := writeTopologyFile(t, "paths.yaml", `
name: paths
nodes: [{name: x}, {name: a}, {name: b}, {name: c}]
links:
  - {a: a, b: x, bandwidth: 100GB/s, latency: 100us}
  - {a: b, b: x, bandwidth: 100GB/s, latency: 100us}
  - {a: c, b: x, bandwidth: 1GB/s, latency: 1us}
`)
	out, err := runTopology(t, "show", "-f", file)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"nearest           x ↔ c  1µs",
		"farthest          a ↔ b  200µs",
		"slowest for 1MiB  a ↔ c  101µs",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestTopologyShowFromEnv(t *testing.T) {
	t.Setenv(topology.EnvTopology, "example:dev4")
	t.Setenv(topology.EnvNode, "n2")
	out, err := runTopology(t, "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"topology dev4 (UB_TOPOLOGY=example:dev4)", "this process plays node n2"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	t.Setenv(topology.EnvTopology, "")
	t.Setenv(topology.EnvNode, "")
	out, err = runTopology(t, "show")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "(discovered on this host; UB_TOPOLOGY is unset)") || !strings.Contains(out, "this process plays node ") {
		t.Errorf("show of this host:\n%s", out)
	}
}

func writeTopologyFile(t *testing.T, name, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTopologyValidate(t *testing.T) {
	good := writeTopologyFile(t, "good.yaml", "name: g\nnodes: [{name: a}]\n")
	bad := writeTopologyFile(t, "bad.yaml", "name: b\nnodes:\n  - {name: a}\n  - {name: a}\nlinks:\n  - {a: a, b: z, bandwidth: 1GB/s, latency: 1us}\n")
	out, err := runTopology(t, "validate", good)
	if err != nil || out != good+": ok (1 nodes, 0 links)\n" {
		t.Fatalf("validate good: %q, %v", out, err)
	}
	out, err = runTopology(t, "validate", good, bad, filepath.Join(t.TempDir(), "none.yaml"))
	if out != good+": ok (1 nodes, 0 links)\n" {
		t.Errorf("validate output %q", out)
	}
	want := []string{
		"invalid topology:",
		bad + `:4: nodes[1].name: duplicate node "a" (first at nodes[0])`,
		bad + `:6: links[0].b: unknown node "z"`,
		"none.yaml: no such file or directory",
	}
	if err == nil {
		t.Fatal("validate bad succeeded")
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
	if _, err := runTopology(t, "validate"); err == nil {
		t.Error("validate without files succeeded")
	}
}

// TestTopologyExamplesValid validates the shipped example files through the
// command, as a user would.
func TestTopologyExamplesValid(t *testing.T) {
	files, _ := filepath.Glob("../../ub/topology/examples/*.yaml")
	if len(files) < 3 {
		t.Fatalf("examples: %v", files)
	}
	out, err := runTopology(t, append([]string{"validate"}, files...)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(out, ": ok (") != len(files) {
		t.Errorf("validate examples:\n%s", out)
	}
}

func TestTopologyBadArgs(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nosuch"},
		{"show", "-example", "nosuch"},
		{"show", "-f", "x", "-example", "dev4"},
		{"show", "extra"},
		{"show", "-bogus"},
		{"render", "-format", "png", "-example", "dev4"},
		{"render", "-f", "/nonexistent.yaml"},
	} {
		if _, err := runTopology(t, args...); err == nil {
			t.Errorf("topology %q succeeded", args)
		}
	}
	out, err := runTopology(t, "help")
	if err != nil || !strings.Contains(out, "ubctl topology render") || !strings.Contains(out, "cm384, dev4, laptop") {
		t.Errorf("help: %q, %v", out, err)
	}
}

// TestTopologyRenderSVG renders every example and checks that the SVG is
// well-formed XML and names what a reader needs.
func TestTopologyRenderSVG(t *testing.T) {
	for _, tc := range []struct {
		example string
		want    []string
	}{
		{"cm384", []string{
			">node07<", ">8 NPU<", ">ubsw0<", ">UB switch<", ">rack12<",
			"every compute node ↔ every switch: 392GB/s, 500ns each (384 links)",
			"any compute node ↔ any other (all 1128 pairs): 1µs, 392GB/s, 2 hops; 1MiB in 3.675µs",
		}},
		{"dev4", []string{">n0<", ">2 NPU<", ">5GB/s · 20µs<", "compute ↔ compute: 5GB/s, 20µs each (6 links)"}},
		{"laptop", []string{">laptop<", ">8 CPUs<", "a single node: nothing to route"}},
	} {
		t.Run(tc.example, func(t *testing.T) {
			out, err := runTopology(t, "render", "-example", tc.example, "-format", "svg")
			if err != nil {
				t.Fatal(err)
			}
			if err := wellFormedXML(out); err != nil {
				t.Fatalf("not XML: %v", err)
			}
			if !strings.HasPrefix(out, `<svg xmlns="http://www.w3.org/2000/svg"`) {
				t.Errorf("starts %.60q", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("SVG lacks %q", w)
				}
			}
			if strings.Contains(out, "NaN") || strings.Contains(out, "Inf") {
				t.Error("SVG has NaN or Inf coordinates")
			}
		})
	}
}

func wellFormedXML(s string) error {
	d := xml.NewDecoder(strings.NewReader(s))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func TestTopologyRenderFile(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"t.svg", "t.dot", "t.gv"} {
		path := filepath.Join(dir, name)
		out, err := runTopology(t, "render", "-example", "dev4", "-o", path)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		isSVG := strings.HasPrefix(string(data), "<svg")
		if isSVG != strings.HasSuffix(name, ".svg") || !strings.HasPrefix(out, "wrote "+path) {
			t.Errorf("%s: %q, starts %.20q", name, out, data)
		}
	}
}

// TestTopologyRenderDOT checks the DOT output with a small parser of the
// DOT grammar, since Graphviz need not be installed.
func TestTopologyRenderDOT(t *testing.T) {
	for _, example := range topology.ExampleNames() {
		out, err := runTopology(t, "render", "-example", example, "-format", "dot")
		if err != nil {
			t.Fatal(err)
		}
		topo, _ := topology.Example(example)
		nodes, edges, err := parseDOT(out)
		if err != nil {
			t.Fatalf("%s: %v\n%s", example, err, out)
		}
		if len(nodes) != len(topo.Nodes) || edges != len(topo.Links) {
			t.Errorf("%s: %d nodes and %d edges, want %d and %d", example, len(nodes), edges, len(topo.Nodes), len(topo.Links))
		}
	}
	// Names and labels that need escaping.
	topo, err := topology.New(`a "quoted" \ name`, []topology.Node{{Name: "n0", Labels: map[string]string{"rack": `r"1\`}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	writeDOT(&b, topo)
	if _, _, err := parseDOT(b.String()); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
}

// parseDOT checks that s is one undirected graph of node and edge
// statements with attribute lists, and returns the nodes it declares and
// how many edges it has.
func parseDOT(s string) (nodes map[string]bool, edges int, err error) {
	toks, err := dotTokens(s)
	if err != nil {
		return nil, 0, err
	}
	nodes = map[string]bool{}
	p := 0
	next := func() string {
		if p >= len(toks) {
			return ""
		}
		p++
		return toks[p-1]
	}
	expect := func(want string) error {
		if got := next(); got != want {
			return fmt.Errorf("token %d: got %q, want %q", p, got, want)
		}
		return nil
	}
	isID := func(tok string) bool { return strings.HasPrefix(tok, `"`) }
	attrs := func() error { // [ k=v (, k=v)* ]
		if err := expect("["); err != nil {
			return err
		}
		for {
			k := next()
			if k == "]" {
				return nil
			}
			if !isID(k) && !isDOTBareID(k) {
				return fmt.Errorf("attribute name %q", k)
			}
			if err := expect("="); err != nil {
				return err
			}
			if v := next(); !isID(v) && !isDOTBareID(v) {
				return fmt.Errorf("attribute value %q", v)
			}
			if toks[p] == "," {
				p++
			}
		}
	}
	if err := expect("graph"); err != nil {
		return nil, 0, err
	}
	if !isID(next()) {
		return nil, 0, fmt.Errorf("graph name")
	}
	if err := expect("{"); err != nil {
		return nil, 0, err
	}
	for {
		tok := next()
		switch {
		case tok == "}":
			if p != len(toks) {
				return nil, 0, fmt.Errorf("tokens after the graph")
			}
			return nodes, edges, nil
		case tok == "graph" || tok == "node" || tok == "edge":
			if err := attrs(); err != nil {
				return nil, 0, err
			}
		case isID(tok):
			if toks[p] == "--" {
				p++
				to := next()
				if !nodes[tok] || !nodes[to] {
					return nil, 0, fmt.Errorf("edge %s -- %s before its nodes", tok, to)
				}
				edges++
			} else {
				nodes[tok] = true
			}
			if toks[p] == "[" {
				if err := attrs(); err != nil {
					return nil, 0, err
				}
			}
		default:
			return nil, 0, fmt.Errorf("statement starts with %q", tok)
		}
		if err := expect(";"); err != nil {
			return nil, 0, err
		}
	}
}

func isDOTBareID(s string) bool {
	for i, c := range s {
		switch {
		case c == '_', c == '.', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '-' && i == 0: // a negative number
		default:
			return false
		}
	}
	return s != ""
}

// dotTokens splits DOT text into tokens: quoted strings (kept quoted, with
// their escapes checked), bare IDs, "--" and punctuation; // comments are
// dropped.
func dotTokens(s string) ([]string, error) {
	var toks []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			i++
		case strings.HasPrefix(s[i:], "//"):
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '"':
			j := i + 1
			for ; j < len(s) && s[j] != '"'; j++ {
				if s[j] == '\\' {
					j++
				}
				if j < len(s) && s[j] == '\n' {
					return nil, fmt.Errorf("newline in a string at %d", j)
				}
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, s[i:j+1])
			i = j + 1
		case strings.HasPrefix(s[i:], "--"):
			toks = append(toks, "--")
			i += 2
		case strings.ContainsRune("{}[]=;,", rune(c)):
			toks = append(toks, string(c))
			i++
		default:
			j := i
			for j < len(s) && isDOTBareID(s[i:j+1]) {
				j++
			}
			if j == i {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			toks = append(toks, s[i:j])
			i = j
		}
	}
	return toks, nil
}

// TestTopologyRenderShapes draws odd shapes: only switches, one switch and
// one server, a ring of servers, a two-tier tree, one-node racks.
func TestTopologyRenderShapes(t *testing.T) {
	node := func(name string, kind topology.NodeKind, rack string) topology.Node {
		n := topology.Node{Name: name, Kind: kind}
		if rack != "" {
			n.Labels = map[string]string{"rack": rack}
		}
		return n
	}
	link := func(a, b string, bw float64) topology.Link {
		return topology.Link{A: a, B: b, Bandwidth: bw, Latency: 1000}
	}
	placeOnRing := make([]topology.Node, 30)
	var ringLinks []topology.Link
	for i := range placeOnRing {
		placeOnRing[i] = node(fmt.Sprintf("host%02d", i), topology.Compute, fmt.Sprintf("r%d", i/7))
		ringLinks = append(ringLinks, link(fmt.Sprintf("host%02d", i), fmt.Sprintf("host%02d", (i+1)%30), float64(1+i%3)*1e9))
	}
	tree := []topology.Node{node("spine", topology.Switch, ""), node("leaf0", topology.Switch, ""), node("leaf1", topology.Switch, "")}
	treeLinks := []topology.Link{link("spine", "leaf0", 400e9), link("spine", "leaf1", 400e9)}
	for i := range 6 {
		name := fmt.Sprintf("s%d", i)
		tree = append(tree, node(name, topology.Compute, fmt.Sprintf("rack%d", i)))
		treeLinks = append(treeLinks, link(name, fmt.Sprintf("leaf%d", i%2), 100e9))
	}
	for _, tc := range []struct {
		name  string
		nodes []topology.Node
		links []topology.Link
	}{
		{"switches only", []topology.Node{node("a", topology.Switch, ""), node("b", topology.Switch, "")}, []topology.Link{link("a", "b", 1e9)}},
		{"one of each", []topology.Node{node("sw", topology.Switch, ""), node("c", topology.Compute, "")}, []topology.Link{link("sw", "c", 1e9)}},
		{"ring", placeOnRing, ringLinks},
		{"tree", tree, treeLinks},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := topology.New(tc.name, tc.nodes, tc.links)
			if err != nil {
				t.Fatal(err)
			}
			var svg, dot strings.Builder
			writeSVG(&svg, topo)
			if err := wellFormedXML(svg.String()); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(svg.String(), "NaN") || strings.Contains(svg.String(), "Inf") {
				t.Error("NaN or Inf in the SVG")
			}
			writeDOT(&dot, topo)
			if _, _, err := parseDOT(dot.String()); err != nil {
				t.Fatal(err)
			}
		})
	}
}
