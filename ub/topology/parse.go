package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaxFileSize bounds what Load and FromEnv read: a real topology file is a
// few hundred kilobytes at most.
const MaxFileSize = 64 << 20

// Parse reads a topology from YAML or JSON, validates it and computes its
// path tables. The format is described in docs/topology.md:
//
//	name: dev4
//	nodes:
//	  - {name: n0, cpus: 4, memory: 8GiB, devices: [{kind: GPU, count: 1, memory: 16GiB}]}
//	  - {name: n1, cpus: 4, memory: 8GiB}
//	links:
//	  - {a: n0, b: n1, bandwidth: 5GB/s, latency: 20us}
//
// Input that starts with '{' followed by a quoted key (or '}') is read as
// JSON, so syntax errors are reported in JSON's terms, with line and column.
// Anything else is YAML, one document, including a flow mapping with
// unquoted keys such as {name: x, nodes: [...]}. Anchors, aliases and merge
// keys work, and keys that start with "x-" are ignored, so templates can be
// defined under them as in Compose files.
//
// Problems with the content, from an unknown field to a disconnected node,
// are returned together in a *[ValidationError] whose problems carry the
// line they are on.
func Parse(data []byte) (*Topology, error) {
	root, err := parseTree(data)
	if err != nil {
		return nil, err
	}
	d := &decoder{pos: positions{}, failed: map[string]bool{}, budget: decodeBudget}
	t := d.topology(root)
	probs := d.probs
	if d.budget >= 0 {
		for _, p := range validate(t, d.pos, !d.failed["links"]) {
			if !d.failed[p.Path] {
				probs = append(probs, p)
			}
		}
	}
	if len(probs) > 0 {
		sort.SliceStable(probs, func(i, j int) bool { return probs[i].Line < probs[j].Line })
		return nil, &ValidationError{Topology: t.Name, Problems: probs}
	}
	t.routes = computeRoutes(t)
	return t, nil
}

// Load reads and parses a topology file (see [Parse]). Errors name the file.
func Load(path string) (*Topology, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s: larger than %s: not a topology file", path, FormatBytes(MaxFileSize))
	}
	return data, nil
}

// parseTree turns YAML or JSON text into a YAML node tree.
func parseTree(data []byte) (*yaml.Node, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a byte order mark
	text := bytes.TrimLeft(data, " \t\r\n")
	if len(text) == 0 {
		return nil, errors.New("topology: empty input")
	}
	if text[0] == '{' {
		// JSON, unless the first key is unquoted: then it is a YAML flow
		// mapping such as {name: x, nodes: [...]}.
		if rest := bytes.TrimLeft(text[1:], " \t\r\n"); len(rest) == 0 || rest[0] == '"' || rest[0] == '}' {
			return jsonTree(data)
		}
	}
	return yamlTree(data)
}

func yamlTree(data []byte) (root *yaml.Node, err error) {
	defer func() {
		// The YAML parser is outside code fed with outside input: a panic in
		// it must not take the process down.
		if r := recover(); r != nil {
			root, err = nil, fmt.Errorf("topology: invalid YAML: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return nil, errors.New("topology: empty input")
		}
		return nil, fmt.Errorf("topology: invalid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		return nil, fmt.Errorf("topology: invalid YAML: more than one document (a second starts at line %d)", next.Line)
	case err != io.EOF:
		return nil, fmt.Errorf("topology: invalid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return nil, errors.New("topology: empty input")
	}
	return doc.Content[0], nil
}

// jsonTree parses JSON into the same node tree the YAML parser makes, with
// lines and columns, so one decoder serves both formats.
func jsonTree(data []byte) (*yaml.Node, error) {
	j := &jsonParser{dec: json.NewDecoder(bytes.NewReader(data)), data: data}
	j.dec.UseNumber()
	root, err := j.value(0)
	if err == nil {
		if _, err = j.dec.Token(); err == nil {
			line, col := j.where(j.dec.InputOffset() - 1)
			return nil, fmt.Errorf("topology: invalid JSON at line %d, column %d: more data after the top-level object", line, col)
		}
		if err == io.EOF {
			return root, nil
		}
	}
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &syn):
		line, col := j.where(syn.Offset)
		return nil, fmt.Errorf("topology: invalid JSON at line %d, column %d: %v", line, col, syn)
	case errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF:
		return nil, errors.New("topology: invalid JSON: unexpected end of input")
	}
	return nil, fmt.Errorf("topology: invalid JSON: %w", err)
}

type jsonParser struct {
	dec  *json.Decoder
	data []byte
}

// where converts a byte offset into a 1-based line and column.
func (j *jsonParser) where(off int64) (line, col int) {
	off = min(max(off, 0), int64(len(j.data)))
	before := j.data[:off]
	line = bytes.Count(before, []byte("\n")) + 1
	col = len(before) - bytes.LastIndexByte(before, '\n')
	return line, col
}

func (j *jsonParser) value(depth int) (*yaml.Node, error) {
	if depth > 64 {
		line, _ := j.where(j.dec.InputOffset())
		return nil, fmt.Errorf("nested more than 64 levels deep at line %d", line)
	}
	tok, err := j.dec.Token()
	if err != nil {
		return nil, err
	}
	line, col := j.where(j.dec.InputOffset())
	n := &yaml.Node{Kind: yaml.ScalarNode, Line: line, Column: col}
	switch v := tok.(type) {
	case json.Delim:
		if v == '{' {
			n.Kind, n.Tag = yaml.MappingNode, "!!map"
		} else {
			n.Kind, n.Tag = yaml.SequenceNode, "!!seq"
		}
		for j.dec.More() {
			if n.Kind == yaml.MappingNode {
				key, err := j.value(depth + 1) // a string: Token checks the syntax
				if err != nil {
					return nil, err
				}
				n.Content = append(n.Content, key)
			}
			val, err := j.value(depth + 1)
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, val)
		}
		if _, err := j.dec.Token(); err != nil { // the closing delimiter
			return nil, err
		}
	case string:
		n.Tag, n.Value = "!!str", v
	case json.Number:
		n.Tag, n.Value = "!!int", v.String()
		if strings.ContainsAny(n.Value, ".eE") {
			n.Tag = "!!float"
		}
	case bool:
		n.Tag, n.Value = "!!bool", strconv.FormatBool(v)
	case nil:
		n.Tag, n.Value = "!!null", "null"
	}
	return n, nil
}

// decodeBudget bounds the nodes the decoder visits, so a document that
// multiplies itself through aliases ("billion laughs") is refused quickly;
// maxProblems bounds the problems it reports.
const (
	decodeBudget = 1 << 20
	maxProblems  = 100
)

// decoder turns a node tree into a Topology, collecting every problem.
type decoder struct {
	pos    positions
	failed map[string]bool // paths with a decoding problem: validation stays quiet about them
	probs  []Problem
	budget int // nodes left to visit; negative once decoding has stopped
}

func (d *decoder) fail(path string, n *yaml.Node, format string, args ...any) {
	if len(d.probs) >= maxProblems {
		d.stop(n, fmt.Sprintf("too many problems; stopped after %d", maxProblems))
		return
	}
	line := d.pos.line(path)
	if n != nil {
		line = n.Line
	}
	d.probs = append(d.probs, Problem{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
	d.failed[path] = true
}

// deref follows aliases. It returns nil, having stopped the decoding with a
// problem, when the budget is spent or the alias leads nowhere.
func (d *decoder) deref(n *yaml.Node) *yaml.Node {
	at := n
	for hops := 0; n != nil && n.Kind == yaml.AliasNode; hops++ {
		if hops > 64 {
			n = nil
			break
		}
		n = n.Alias
	}
	if n == nil {
		d.stop(at, "an alias that leads nowhere")
		return nil
	}
	if d.budget <= 0 {
		d.stop(n, "the document expands to too many values (aliases nested too deeply?)")
		return nil
	}
	d.budget--
	return n
}

// stop ends decoding with a last problem, once.
func (d *decoder) stop(n *yaml.Node, msg string) {
	if d.budget < 0 {
		return
	}
	d.budget = -1
	line := 0
	if n != nil {
		line = n.Line
	}
	d.probs = append(d.probs, Problem{Line: line, Msg: msg})
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return quote(n.Value)
	}
	return "nothing"
}

// quote quotes s for a message, cut short if long.
func quote(s string) string {
	if r := []rune(s); len(r) > 40 {
		s = string(r[:40]) + "…"
	}
	return strconv.Quote(s)
}

func elem(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

func field(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// fields returns the values of a mapping by key, merge keys (<<) applied,
// and reports duplicate and unknown keys. It returns nil if n is not a
// mapping.
func (d *decoder) fields(path string, n *yaml.Node, known ...string) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	if !d.collect(path, n, known, out, map[string]int{}, 0) {
		return nil
	}
	return out
}

func (d *decoder) collect(path string, n *yaml.Node, known []string, out map[string]*yaml.Node, lines map[string]int, depth int) bool {
	if n = d.deref(n); n == nil {
		return false
	}
	if n.Kind != yaml.MappingNode {
		what := "a mapping"
		if path == "" {
			what = "a mapping with name, nodes and links"
		}
		d.fail(path, n, "want %s, got %s", what, describe(n))
		return false
	}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.deref(n.Content[i]), n.Content[i+1]
		if k == nil {
			return false
		}
		if k.Kind != yaml.ScalarNode {
			d.fail(path, k, "a key must be a string, got %s", describe(k))
			continue
		}
		if k.Tag == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if strings.HasPrefix(k.Value, "x-") {
			continue // an extension field, for anchors: ignored
		}
		if first, dup := lines[k.Value]; dup && depth == 0 {
			d.fail(path, k, "duplicate key %s (first at line %d)", quote(k.Value), first)
			continue
		}
		if _, set := out[k.Value]; set {
			continue // an explicit key wins over a merged one
		}
		if !slices.Contains(known, k.Value) {
			d.fail(path, k, "unknown field %s (known: %s)", quote(k.Value), strings.Join(known, ", "))
			continue
		}
		lines[k.Value] = k.Line
		out[k.Value] = v
	}
	for _, m := range merges {
		if depth >= 8 {
			d.fail(path, m, "merge keys nested too deeply")
			return false
		}
		if m = d.deref(m); m == nil {
			return false
		}
		list := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			list = m.Content
		}
		for _, src := range list {
			if !d.collect(path, src, known, out, lines, depth+1) {
				return false
			}
		}
	}
	return true
}

// value returns the node of a field, recording its line; nil if the field
// is absent or the budget is spent.
func (d *decoder) value(path string, f map[string]*yaml.Node, key string) *yaml.Node {
	n, ok := f[key]
	if !ok {
		return nil
	}
	n = d.deref(n)
	if n != nil {
		d.pos[field(path, key)] = n.Line
	}
	return n
}

// scalar returns the text of a scalar field. ok is false if the field is
// absent or null (then missing, if not empty, is reported as the problem) or
// not a scalar.
func (d *decoder) scalar(path string, f map[string]*yaml.Node, key, missing string) (string, bool) {
	n := d.value(path, f, key)
	p := field(path, key)
	switch {
	case n == nil && d.budget < 0:
		return "", false
	case n == nil || isNull(n):
		if missing != "" {
			d.fail(p, n, "%s", missing)
		}
		return "", false
	case n.Kind != yaml.ScalarNode:
		d.fail(p, n, "want a value, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func (d *decoder) integer(path string, f map[string]*yaml.Node, key string, def int) int {
	s, ok := d.scalar(path, f, key, "")
	if !ok {
		return def
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 32)
	switch {
	case errors.Is(err, strconv.ErrRange):
		d.fail(field(path, key), f[key], "%s is out of range", quote(s))
		return def
	case err != nil:
		d.fail(field(path, key), f[key], "want a whole number, got %s", quote(s))
		return def
	}
	return int(v)
}

func (d *decoder) size(path string, f map[string]*yaml.Node, key string) int64 {
	s, ok := d.scalar(path, f, key, "")
	if !ok {
		return 0
	}
	v, err := ParseBytes(s)
	if err != nil {
		d.fail(field(path, key), f[key], "%v", err)
	}
	return v
}

func (d *decoder) list(path string, f map[string]*yaml.Node, key string, limit int) []*yaml.Node {
	n := d.value(path, f, key)
	p := field(path, key)
	switch {
	case n == nil || isNull(n):
		return nil
	case n.Kind != yaml.SequenceNode:
		d.fail(p, n, "want a list, got %s", describe(n))
		return nil
	case len(n.Content) > limit:
		d.fail(p, n, "%d entries, more than the limit of %d", len(n.Content), limit)
		return nil
	}
	return n.Content
}

func (d *decoder) topology(root *yaml.Node) *Topology {
	t := &Topology{}
	f := d.fields("", root, "name", "nodes", "links")
	if f == nil {
		d.failed["name"], d.failed["nodes"] = true, true
		return t
	}
	t.Name, _ = d.scalar("", f, "name", "")
	nodes := d.list("", f, "nodes", MaxNodes)
	links := d.list("", f, "links", MaxLinks)
	if len(nodes) == 0 {
		// Every link would name an unknown node: fix the nodes first.
		links = nil
	}
	t.Nodes = make([]Node, len(nodes))
	for i, n := range nodes {
		d.node(elem("nodes", i), n, &t.Nodes[i])
	}
	t.Links = make([]Link, len(links))
	for i, n := range links {
		d.link(elem("links", i), n, &t.Links[i])
	}
	return t
}

func (d *decoder) node(path string, n *yaml.Node, out *Node) {
	if n := d.deref(n); n != nil {
		d.pos[path] = n.Line
	}
	f := d.fields(path, n, "name", "kind", "cpus", "numa_nodes", "memory", "devices", "labels")
	if f == nil {
		d.failed[path+".name"] = true
		return
	}
	out.Name, _ = d.scalar(path, f, "name", "")
	out.Kind = Compute
	if k, ok := d.scalar(path, f, "kind", ""); ok {
		out.Kind = NodeKind(strings.ToLower(k))
	}
	out.CPUs = d.integer(path, f, "cpus", 0)
	out.NUMANodes = d.integer(path, f, "numa_nodes", 0)
	out.MemoryBytes = d.size(path, f, "memory")
	for i, dn := range d.list(path, f, "devices", 1024) {
		dp := elem(field(path, "devices"), i)
		if dn := d.deref(dn); dn != nil {
			d.pos[dp] = dn.Line
		}
		df := d.fields(dp, dn, "kind", "count", "memory")
		if df == nil {
			continue
		}
		var dev Device
		if k, ok := d.scalar(dp, df, "kind", ""); ok {
			dev.Kind = DeviceKind(strings.ToUpper(k))
		}
		dev.Count = d.integer(dp, df, "count", 1)
		dev.MemoryBytes = d.size(dp, df, "memory")
		out.Devices = append(out.Devices, dev)
	}
	d.labels(field(path, "labels"), d.value(path, f, "labels"), out)
}

// labels reads a mapping of label names to scalar values (null is "").
func (d *decoder) labels(path string, n *yaml.Node, out *Node) {
	if n == nil || isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "want a mapping of names to values, got %s", describe(n))
		return
	}
	out.Labels = make(map[string]string, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.deref(n.Content[i]), d.deref(n.Content[i+1])
		if k == nil || v == nil {
			return
		}
		_, dup := out.Labels[k.Value]
		switch {
		case k.Kind != yaml.ScalarNode:
			d.fail(path, k, "a key must be a string, got %s", describe(k))
		case dup:
			d.fail(path, k, "duplicate label %q", k.Value)
		case v.Kind != yaml.ScalarNode:
			d.fail(field(path, k.Value), v, "want a value, got %s", describe(v))
		case isNull(v):
			out.Labels[k.Value] = ""
		default:
			out.Labels[k.Value] = v.Value
		}
	}
}

func (d *decoder) link(path string, n *yaml.Node, out *Link) {
	if n := d.deref(n); n != nil {
		d.pos[path] = n.Line
	}
	f := d.fields(path, n, "a", "b", "bandwidth", "latency")
	if f == nil {
		d.failed[path+".a"], d.failed[path+".b"], d.failed[path+".bandwidth"] = true, true, true
		return
	}
	out.A, _ = d.scalar(path, f, "a", "")
	out.B, _ = d.scalar(path, f, "b", "")
	if s, ok := d.scalar(path, f, "bandwidth", "missing"); ok {
		bw, err := ParseBandwidth(s)
		if err != nil {
			d.fail(field(path, "bandwidth"), f["bandwidth"], "%v", err)
		}
		out.Bandwidth = bw
	}
	if s, ok := d.scalar(path, f, "latency", "missing (write 0 for a negligible latency)"); ok {
		lat, err := ParseLatency(s)
		if err != nil {
			d.fail(field(path, "latency"), f["latency"], "%v", err)
		}
		out.Latency = lat
	}
}
