package topology

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func link(a, b string, bw float64, lat time.Duration) Link {
	return Link{A: a, B: b, Bandwidth: bw, Latency: lat}
}

// TestValidateGo checks the problems found in topologies built in Go: field
// paths and messages exactly, no lines.
func TestValidateGo(t *testing.T) {
	ok := []Node{{Name: "n0"}, {Name: "n1"}}
	okLinks := []Link{link("n0", "n1", 5e9, time.Microsecond)}
	for _, tc := range []struct {
		name  string
		topo  string
		nodes []Node
		links []Link
		want  []string
	}{
		{name: "valid", topo: "t", nodes: ok, links: okLinks},
		{name: "one node", topo: "t", nodes: ok[:1]},
		{name: "zero latency", topo: "t", nodes: ok, links: []Link{link("n0", "n1", 5e9, 0)}},
		{name: "empty", want: []string{"name: missing", "nodes: a topology needs at least one node"}},
		{
			name: "node names", topo: "t",
			nodes: []Node{{Name: "n0"}, {Name: "n1"}, {Name: ""}, {Name: "a b"}, {Name: "n1"}, {Name: "-x"}},
			links: []Link{link("n0", "n1", 1, 0)},
			want: []string{
				"nodes[2].name: missing",
				`nodes[3].name: "a b" is not a valid node name: use 1 to 253 letters, digits, '.', '-' or '_', starting with a letter or digit`,
				`nodes[4].name: duplicate node "n1" (first at nodes[1])`,
				`nodes[5].name: "-x" is not a valid node name: use 1 to 253 letters, digits, '.', '-' or '_', starting with a letter or digit`,
			},
		},
		{
			name: "node fields", topo: "t",
			nodes: []Node{
				{Name: "n0", Kind: "router", CPUs: -1, NUMANodes: -2, MemoryBytes: -5 << 30, Labels: map[string]string{"": "x"}},
				{Name: "n1", Devices: []Device{{Kind: "TPU", Count: -1, MemoryBytes: -1}, {Count: 2}}},
			},
			links: okLinks,
			want: []string{
				`nodes[0].kind: unknown kind "router" (use compute or switch)`,
				"nodes[0].cpus: must not be negative, got -1",
				"nodes[0].numa_nodes: must not be negative, got -2",
				"nodes[0].memory: must not be negative, got -5GiB",
				"nodes[0].labels: empty label key",
				`nodes[1].devices[0].kind: unknown device kind "TPU" (use GPU, NPU or KAE)`,
				"nodes[1].devices[0].count: must not be negative, got -1",
				"nodes[1].devices[0].memory: must not be negative, got -1B",
				"nodes[1].devices[1].kind: missing (use GPU, NPU or KAE)",
			},
		},
		{
			name: "switch hosts nothing", topo: "t",
			nodes: []Node{{Name: "n0"}, {Name: "sw", Kind: Switch, CPUs: 4, NUMANodes: 1, MemoryBytes: 1 << 30, Devices: []Device{{Kind: GPU, Count: 1}}}},
			links: []Link{link("n0", "sw", 1, 0)},
			want: []string{
				"nodes[1].cpus: a switch hosts nothing: want 0, got 4",
				"nodes[1].numa_nodes: a switch hosts nothing: want 0, got 1",
				"nodes[1].memory: a switch hosts nothing: want 0, got 1GiB",
				"nodes[1].devices: a switch hosts no devices",
			},
		},
		{
			name: "links", topo: "t",
			nodes: []Node{{Name: "n0"}, {Name: "n1"}, {Name: "n2"}},
			links: []Link{
				link("n0", "n1", -5e9, time.Microsecond),
				link("n1", "n2", 5e9, -time.Microsecond),
				link("n1", "n9", 5e9, 0),
				link("", "n1", 5e9, 0),
				link("n2", "n2", 5e9, 0),
				link("n1", "n0", 5e9, 0),
				link("n0", "n2", 0, 2*time.Hour),
			},
			want: []string{
				"links[0].bandwidth: must be positive, got -5GB/s",
				"links[1].latency: must not be negative, got -1µs",
				`links[2].b: unknown node "n9"`,
				"links[3].a: missing",
				`links[4]: self-link on "n2"`,
				`links[5]: duplicate link between "n1" and "n0" (first at links[0]); describe parallel links as one with their summed bandwidth`,
				"links[6].bandwidth: must be positive, got 0B/s",
				"links[6].latency: must be at most 1h0m0s, got 2h0m0s",
			},
		},
		{
			name: "disconnected", topo: "t",
			nodes: []Node{{Name: "n0"}, {Name: "n1"}, {Name: "n2"}, {Name: "n3"}, {Name: "n4"}},
			links: []Link{link("n0", "n1", 1, 0), link("n2", "n3", 1, 0)},
			want: []string{
				`nodes[2]: node "n2" is not connected to node "n0"`,
				`nodes[3]: node "n3" is not connected to node "n0"`,
				`nodes[4]: node "n4" is not connected to node "n0"`,
			},
		},
		{
			name: "disconnected from the first valid node", topo: "t",
			nodes: []Node{{Name: "bad name"}, {Name: "n1"}, {Name: "n2"}},
			want: []string{
				`nodes[0].name: "bad name" is not a valid node name: use 1 to 253 letters, digits, '.', '-' or '_', starting with a letter or digit`,
				`nodes[2]: node "n2" is not connected to node "n1"`,
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, err := New(tc.topo, tc.nodes, tc.links)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if err := topo.Validate(); err != nil {
					t.Fatalf("Validate after New: %v", err)
				}
				return
			}
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("New = %v, want a *ValidationError", err)
			}
			var got []string
			for _, p := range verr.Problems {
				if p.Line != 0 {
					t.Errorf("problem %q has line %d, want 0", p, p.Line)
				}
				got = append(got, p.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("problems:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(tc.want, "\n\t"))
			}
			bad := &Topology{Name: tc.topo, Nodes: tc.nodes, Links: tc.links}
			if err := bad.Validate(); err == nil || err.Error() != verr.Error() {
				t.Errorf("Validate = %v, want %v", err, verr)
			}
		})
	}
}

func TestValidationErrorText(t *testing.T) {
	one := &ValidationError{Topology: "dev4", Problems: []Problem{{Path: "links[2].b", Line: 14, Msg: `unknown node "n9"`}}}
	if got, want := one.Error(), `topology "dev4": links[2].b: unknown node "n9" (line 14)`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	two := &ValidationError{Problems: []Problem{{Path: "name", Msg: "missing"}, {Msg: "too big"}}}
	if got, want := two.Error(), "topology: 2 problems:\n\tname: missing\n\ttoo big"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestInvalidFiles parses every file in testdata/invalid and compares its
// problems with its "# want:" lines, line numbers included.
func TestInvalidFiles(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.*[ln]") // .yaml and .json
	if len(files) == 0 {
		t.Fatal("no files in testdata/invalid")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			// The expected problems are comments at the top of a YAML file,
			// or in FILE.want for JSON, which has no comments.
			wants := data
			if w, err := os.ReadFile(file + ".want"); err == nil {
				wants = w
			}
			var want []string
			for line := range strings.Lines(string(wants)) {
				if w, ok := strings.CutPrefix(line, "# want: "); ok {
					want = append(want, strings.TrimRight(w, "\n"))
				}
			}
			if len(want) == 0 {
				t.Fatal(`no "# want: " lines`)
			}
			_, err = Load(file)
			if err == nil {
				t.Fatal("loaded without error")
			}
			var got []string
			var verr *ValidationError
			if errors.As(err, &verr) {
				for _, p := range verr.Problems {
					got = append(got, p.String())
				}
			} else {
				got = []string{strings.TrimPrefix(err.Error(), file+": ")}
			}
			if !slices.Equal(got, want) {
				t.Errorf("problems:\n\t%s\nwant:\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
			}
		})
	}
}
