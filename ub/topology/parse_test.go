package topology

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

const smallYAML = `
# A comment.
name: small
nodes:
  - name: n0
    cpus: 4
    numa_nodes: 1
    memory: 8GiB
    devices:
      - {kind: npu, count: 2, memory: 32GiB}
      - {kind: KAE}
    labels: {rack: r0, spare: null, slot: 7}
  - {name: sw, kind: Switch}
  - {name: n1, memory: 1073741824}
links:
  - {a: n0, b: sw, bandwidth: 5GB/s, latency: 20us}
  - {a: sw, b: n1, bandwidth: 40000000000, latency: 0}
`

const smallJSON = `{
	"name": "small",
	"nodes": [
		{"name": "n0", "cpus": 4, "numa_nodes": 1, "memory": "8GiB",
		 "devices": [{"kind": "npu", "count": 2, "memory": "32GiB"}, {"kind": "KAE"}],
		 "labels": {"rack": "r0", "spare": null, "slot": 7}},
		{"name": "sw", "kind": "Switch"},
		{"name": "n1", "memory": 1073741824}
	],
	"links": [
		{"a": "n0", "b": "sw", "bandwidth": "5GB/s", "latency": "20us"},
		{"a": "sw", "b": "n1", "bandwidth": 4e10, "latency": 0}
	]
}`

var smallWant = Topology{
	Name: "small",
	Nodes: []Node{
		{
			Name: "n0", Kind: Compute, CPUs: 4, NUMANodes: 1, MemoryBytes: 8 << 30,
			Devices: []Device{{Kind: NPU, Count: 2, MemoryBytes: 32 << 30}, {Kind: KAE, Count: 1}},
			Labels:  map[string]string{"rack": "r0", "spare": "", "slot": "7"},
		},
		{Name: "sw", Kind: Switch},
		{Name: "n1", Kind: Compute, MemoryBytes: 1 << 30},
	},
	Links: []Link{
		{A: "n0", B: "sw", Bandwidth: 5e9, Latency: 20 * time.Microsecond},
		{A: "sw", B: "n1", Bandwidth: 40e9},
	},
}

func sameData(a, b *Topology) bool {
	return a.Name == b.Name && reflect.DeepEqual(a.Nodes, b.Nodes) && reflect.DeepEqual(a.Links, b.Links)
}

// TestParseFormats reads the same topology written as block YAML, JSON,
// JSON indented with tabs after a byte order mark, and a YAML flow mapping
// that is not JSON.
func TestParseFormats(t *testing.T) {
	for name, text := range map[string]string{
		"yaml":      smallYAML,
		"json":      smallJSON,
		"bom json":  "\xef\xbb\xbf\n" + smallJSON,
		"yaml flow": strings.NewReplacer(`"`, ``, "\t", " ").Replace(smallJSON),
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Parse([]byte(text))
			if err != nil {
				t.Fatal(err)
			}
			if !sameData(got, &smallWant) {
				t.Errorf("got  %+v\nwant %+v", *got, smallWant)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty", "", "topology: empty input"},
		{"blank", " \n\t\n", "topology: empty input"},
		{"comments only", "# nothing\n", "topology: empty input"},
		{"yaml syntax", "name: x\nnodes:\n  - name: a\n   b: c\n", "topology: invalid YAML: line 2: did not find expected '-' indicator"},
		{"yaml tab", "name: x\n\tnodes: []\n", "topology: invalid YAML: line 2: found a tab character that violates indentation"},
		{"two documents", "name: x\n---\nname: y\n", "topology: invalid YAML: more than one document (a second starts at line 2)"},
		{"json trailing comma", "{\n  \"name\": \"x\",\n  \"nodes\": [1,]\n}", "topology: invalid JSON at line 3, column 15: invalid character ']' looking for beginning of value"},
		{"json truncated", `{"name": "x", "nodes": [`, "topology: invalid JSON: unexpected end of input"},
		{"json extra", `{"name": "x"} {"name": "y"}`, "topology: invalid JSON at line 1, column 15: more data after the top-level object"},
		{"json deep", strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100), "topology: invalid JSON: nested more than 64 levels deep at line 1"},
		{"json bad key", `{"name": "x", 3: 4}`, "topology: invalid JSON at line 1, column 15: invalid character '3' looking for beginning of object key string"},
		{"not a mapping", "- a\n- b\n", "topology: want a mapping with name, nodes and links, got a list (line 1)"},
		{"scalar", "hello", `topology: want a mapping with name, nodes and links, got "hello" (line 1)`},
		{"json list", `["a"]`, "topology: want a mapping with name, nodes and links, got a list (line 1)"},
		{"no nodes", "name: x\n", "topology \"x\": nodes: a topology needs at least one node"},
		{"null nodes", "name: x\nnodes: ~\n", "topology \"x\": nodes: a topology needs at least one node (line 2)"},
		{"unknown top-level field", "name: x\nnode: []\nnodes: [{name: a}]\n", "topology \"x\": unknown field \"node\" (known: name, nodes, links) (line 2)"},
		{"too many devices", "name: x\nnodes: [{name: a, devices: [" + strings.Repeat("{kind: GPU},", 1025) + "]}]", "topology \"x\": nodes[0].devices: 1025 entries, more than the limit of 1024 (line 2)"},
		{"count range", "name: x\nnodes: [{name: a, cpus: 99999999999}]", "topology \"x\": nodes[0].cpus: \"99999999999\" is out of range (line 2)"},
		{"label key", "name: x\nnodes: [{name: a, labels: {[k]: v}}]", "topology \"x\": nodes[0].labels: a key must be a string, got a list (line 2)"},
		{"merge cycle", "name: x\nnodes:\n  - &a {<<: *a, name: n}\n", "topology \"x\": nodes[0]: merge keys nested too deeply (line 3)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil || err.Error() != tc.want {
				t.Errorf("Parse error:\n\t%v\nwant:\n\t%s", err, tc.want)
			}
		})
	}
}

// TestParseAliasBomb checks that a document that multiplies itself through
// aliases is refused rather than expanded.
func TestParseAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("x-0: &a0 {name: n, kind: compute}\n")
	for i := 1; i <= 12; i++ {
		b.WriteString("x-" + strconv.Itoa(i) + ": &a" + strconv.Itoa(i) + " [")
		for range 10 {
			b.WriteString("*a" + strconv.Itoa(i-1) + ",")
		}
		b.WriteString("]\n")
	}
	b.WriteString("name: bomb\nnodes:\n  - {name: n0, devices: *a12}\n")
	parsed := make(chan error, 1)
	go func() {
		_, err := Parse([]byte(b.String()))
		parsed <- err
	}()
	select {
	case err := <-parsed:
		if err == nil {
			t.Fatal("parsed")
		}
	case <-time.After(10 * time.Second): // a hang guard: expanding the bomb takes for ever
		t.Fatal("Parse is expanding the aliases")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "small.yaml")
	if err := os.WriteFile(good, []byte(smallYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Load(good)
	if err != nil {
		t.Fatal(err)
	}
	if !sameData(got, &smallWant) {
		t.Errorf("got %+v", *got)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("name: b\nnodes: [{name: a}, {name: a}]\n"), 0o600)
	_, err = Load(bad)
	var verr *ValidationError
	if !errors.As(err, &verr) || !strings.HasPrefix(err.Error(), bad+": ") {
		t.Errorf("Load(bad) = %v, want a *ValidationError naming the file", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
}

// TestValidFiles loads every file in testdata/valid and the shipped
// examples, and checks that validation agrees.
func TestValidFiles(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*")
	examples, _ := filepath.Glob("examples/*.yaml")
	for _, file := range append(files, examples...) {
		topo, err := Load(file)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if err := topo.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", file, err)
		}
	}
}

// TestParseMergeFanOut checks that merge keys fanning out through aliases
// stop at the budget and the problem limit instead of running for seconds.
func TestParseMergeFanOut(t *testing.T) {
	// With an unknown field every merge is a problem; with a known one,
	// none is, and only the budget stops it.
	for _, field := range []string{"junk", "cpus"} {
		var b strings.Builder
		b.WriteString("x-0: &m0 {" + field + ": 1}\n")
		for i := 1; i <= 7; i++ {
			b.WriteString("x-" + strconv.Itoa(i) + ": &m" + strconv.Itoa(i) + " {<<: [")
			for range 10 {
				b.WriteString("*m" + strconv.Itoa(i-1) + ",")
			}
			b.WriteString("]}\n")
		}
		b.WriteString("name: fan\nnodes:\n  - {<<: *m7, name: n0}\n")
		_, err := Parse([]byte(b.String()))
		var verr *ValidationError
		if !errors.As(err, &verr) {
			t.Fatalf("%s: Parse = %v", field, err)
		}
		if n := len(verr.Problems); n > maxProblems+1 {
			t.Errorf("%s: %d problems", field, n)
		}
		if last := verr.Problems[len(verr.Problems)-1]; !strings.Contains(last.Msg, "stopped after") && !strings.Contains(last.Msg, "too many values") {
			t.Errorf("%s: last problem %q", field, last)
		}
	}
}

// TestDocExample checks that the YAML and JSON examples of
// docs/topology.md, kept in testdata/valid, say the same thing.
func TestDocExample(t *testing.T) {
	y, err := Load("testdata/valid/two-racks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	j, err := Load("testdata/valid/two-racks.json")
	if err != nil {
		t.Fatal(err)
	}
	if !sameData(y, j) {
		t.Errorf("YAML %+v\nJSON %+v", *y, *j)
	}
	doc, err := os.ReadFile("../../docs/topology.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{"testdata/valid/two-racks.yaml", "testdata/valid/two-racks.json"} {
		data, _ := os.ReadFile(file)
		text := string(data)
		if i := strings.Index(text, "name: two-racks"); i > 0 {
			text = text[i:] // the YAML file starts with a comment the doc does not have
		}
		if !strings.Contains(string(doc), text) {
			t.Errorf("docs/topology.md does not hold %s as it is", file)
		}
	}
}
