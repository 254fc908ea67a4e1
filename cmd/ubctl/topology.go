package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ubkit-io/ubkit/ub/topology"
)

const topologyUsage = `usage:
  ubctl topology show [-f FILE | -example NAME]
        print a summary: nodes, links and sample path costs
        (default: the topology in UB_TOPOLOGY, else this host)
  ubctl topology validate FILE...
        check topology files; prints "ok" per valid file, lists every problem
  ubctl topology render [-f FILE | -example NAME] [-format dot|svg] [-o FILE]
        draw the topology as Graphviz DOT or as a self-contained SVG
        (default format: from the -o extension, else svg)

examples: ` + "%s" + `
`

func topologyHelp() string {
	return fmt.Sprintf(topologyUsage, strings.Join(topology.ExampleNames(), ", "))
}

func topologyCmd(args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("missing subcommand\n\n%s", topologyHelp())
	}
	switch args[0] {
	case "show":
		return topologyShow(args[1:], out)
	case "validate":
		return topologyValidate(args[1:], out)
	case "render":
		return topologyRender(args[1:], out)
	case "help", "-h", "--help":
		fmt.Fprint(out, topologyHelp())
		return nil
	}
	return fmt.Errorf("unknown subcommand %q\n\n%s", args[0], topologyHelp())
}

// topoSource is the -f/-example pair of flags shared by show and render.
type topoSource struct {
	file, example string
}

func (s *topoSource) register(fs *flag.FlagSet) {
	fs.StringVar(&s.file, "f", "", "topology file (YAML or JSON)")
	fs.StringVar(&s.example, "example", "", "a shipped example: "+strings.Join(topology.ExampleNames(), ", "))
}

// load returns the topology and a few words on where it came from.
func (s *topoSource) load() (*topology.Topology, string, error) {
	switch {
	case s.file != "" && s.example != "":
		return nil, "", errors.New("-f and -example exclude each other")
	case s.file != "":
		t, err := topology.Load(s.file)
		return t, "file " + s.file, err
	case s.example != "":
		t, err := topology.Example(s.example)
		return t, "example " + s.example, err
	}
	from := "discovered on this host; " + topology.EnvTopology + " is unset"
	if v := os.Getenv(topology.EnvTopology); strings.TrimSpace(v) != "" {
		from = topology.EnvTopology
		if !strings.Contains(v, "\n") && !strings.HasPrefix(strings.TrimSpace(v), "{") {
			from += "=" + v
		}
	}
	t, err := topology.FromEnv()
	return t, from, err
}

func topologyShow(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("topology show", flag.ContinueOnError)
	var src topoSource
	src.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (use -f FILE)", fs.Arg(0))
	}
	t, from, err := src.load()
	if err != nil {
		return err
	}
	return showTopology(out, t, from, src.file == "" && src.example == "")
}

func showTopology(out io.Writer, t *topology.Topology, from string, fromEnv bool) error {
	s := summarizeTopology(t)
	fmt.Fprintf(out, "topology %s (%s)\n", t.Name, from)
	fmt.Fprintf(out, "  %s\n", s.headline())
	if fromEnv {
		if n, err := topology.LocalNode(t); err == nil {
			fmt.Fprintf(out, "  this process plays node %s\n", n.Name)
		} else {
			fmt.Fprintf(out, "  this process plays no node: %v\n", err)
		}
	}

	fmt.Fprintln(out, "\nnodes")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tKIND\tCPUS\tNUMA\tMEMORY\tDEVICES\tLABELS")
	for i := range t.Nodes {
		n := &t.Nodes[i]
		if n.IsSwitch() {
			fmt.Fprintf(tw, "  %s\tswitch\t-\t-\t-\t-\t%s\n", n.Name, labelList(n))
			continue
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Kind, countOrDash(n.CPUs), countOrDash(n.NUMANodes),
			sizeOrDash(n.MemoryBytes), dashIfEmpty(deviceSummary(n, true)), labelList(n))
	}
	tw.Flush()

	if len(t.Links) > 0 {
		fmt.Fprintln(out, "\nlinks")
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		if len(t.Links) <= 32 {
			fmt.Fprintln(tw, "  A\tB\tBANDWIDTH\tLATENCY")
			for _, l := range t.Links {
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%v\n", l.A, l.B, topology.FormatBandwidth(l.Bandwidth), l.Latency)
			}
		} else {
			fmt.Fprintln(tw, "  LINKS\tBETWEEN\tBANDWIDTH\tLATENCY")
			for _, c := range s.classes {
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%v\n", c.count, c.describe(s), topology.FormatBandwidth(c.bw), c.lat)
			}
		}
		tw.Flush()
	}

	fmt.Fprintln(out, "\npath costs")
	for _, line := range s.pathLines(t) {
		fmt.Fprintln(out, "  "+line)
	}
	return nil
}

func topologyValidate(args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("no files\n\n%s", topologyHelp())
	}
	var bad []string
	for _, file := range args {
		t, err := topology.Load(file)
		if err == nil {
			fmt.Fprintf(out, "%s: ok (%d nodes, %d links)\n", file, len(t.Nodes), len(t.Links))
			continue
		}
		var verr *topology.ValidationError
		if !errors.As(err, &verr) {
			bad = append(bad, err.Error())
			continue
		}
		for _, p := range verr.Problems {
			where := file
			if p.Line > 0 {
				where += ":" + strconv.Itoa(p.Line)
			}
			p.Line = 0
			bad = append(bad, where+": "+p.String())
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("invalid topology:\n%s", strings.Join(bad, "\n"))
	}
	return nil
}

func topologyRender(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("topology render", flag.ContinueOnError)
	var src topoSource
	src.register(fs)
	format := fs.String("format", "", "dot or svg (default: from the -o extension, else svg)")
	output := fs.String("o", "", "write to this file instead of standard output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (use -f FILE)", fs.Arg(0))
	}
	if *format == "" {
		switch strings.ToLower(filepath.Ext(*output)) {
		case ".dot", ".gv":
			*format = "dot"
		default:
			*format = "svg"
		}
	}
	if *format != "dot" && *format != "svg" {
		return fmt.Errorf("unknown format %q (use dot or svg)", *format)
	}
	t, _, err := src.load()
	if err != nil {
		return err
	}
	var b strings.Builder
	if *format == "dot" {
		writeDOT(&b, t)
	} else {
		writeSVG(&b, t)
	}
	if *output == "" {
		_, err = io.WriteString(out, b.String())
		return err
	}
	if err := os.WriteFile(*output, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s (%s, %d nodes, %d links)\n", *output, *format, len(t.Nodes), len(t.Links))
	return nil
}

// topoSummary is what show and render say about a topology as a whole.
type topoSummary struct {
	compute, switches []int // node indices
	cpus              int
	memory            int64
	devices           map[topology.DeviceKind][2]int64 // count, total memory
	classes           []topoLinkClass
}

// topoLinkClass groups links that join the same kinds of node with the same
// bandwidth and latency: "384 links compute ↔ switch, 392GB/s, 500ns".
type topoLinkClass struct {
	kinds string // "compute ↔ switch"
	bw    float64
	lat   time.Duration
	count int
	ends  [2]map[string]bool
	links []int
}

func summarizeTopology(t *topology.Topology) *topoSummary {
	s := &topoSummary{devices: map[topology.DeviceKind][2]int64{}}
	for i := range t.Nodes {
		n := &t.Nodes[i]
		if n.IsSwitch() {
			s.switches = append(s.switches, i)
			continue
		}
		s.compute = append(s.compute, i)
		s.cpus += n.CPUs
		s.memory += n.MemoryBytes
		for _, d := range n.Devices {
			v := s.devices[d.Kind]
			s.devices[d.Kind] = [2]int64{v[0] + int64(d.Count), v[1] + int64(d.Count)*d.MemoryBytes}
		}
	}
	for li, l := range t.Links {
		a, _ := t.NodeIndex(l.A)
		b, _ := t.NodeIndex(l.B)
		ka, kb := nodeKindName(&t.Nodes[a]), nodeKindName(&t.Nodes[b])
		ea, eb := l.A, l.B
		if ka > kb {
			ka, kb, ea, eb = kb, ka, eb, ea
		}
		kinds := ka + " ↔ " + kb
		k := slices.IndexFunc(s.classes, func(c topoLinkClass) bool { return c.kinds == kinds && c.bw == l.Bandwidth && c.lat == l.Latency })
		if k < 0 {
			k = len(s.classes)
			s.classes = append(s.classes, topoLinkClass{kinds: kinds, bw: l.Bandwidth, lat: l.Latency,
				ends: [2]map[string]bool{{}, {}}})
		}
		c := &s.classes[k]
		c.count++
		c.ends[0][ea], c.ends[1][eb] = true, true
		c.links = append(c.links, li)
	}
	return s
}

func nodeKindName(n *topology.Node) string {
	if n.IsSwitch() {
		return "switch"
	}
	return "compute"
}

// describe says which nodes a class joins; "every compute node ↔ every
// switch" when it is a complete bipartite fan-out.
func (c *topoLinkClass) describe(s *topoSummary) string {
	if c.kinds == "compute ↔ switch" && len(c.ends[0]) == len(s.compute) && len(c.ends[1]) == len(s.switches) &&
		c.count == len(s.compute)*len(s.switches) {
		return "every compute node ↔ every switch"
	}
	return c.kinds
}

func (s *topoSummary) headline() string {
	parts := []string{countNoun(len(s.compute), "compute node")}
	if len(s.switches) > 0 {
		parts = append(parts, countNoun(len(s.switches), "switch"))
	}
	if s.cpus > 0 {
		parts = append(parts, countNoun(s.cpus, "CPU"))
	}
	if s.memory > 0 {
		parts = append(parts, topology.FormatBytes(s.memory)+" memory")
	}
	for _, k := range []topology.DeviceKind{topology.NPU, topology.GPU, topology.KAE} {
		if v := s.devices[k]; v[0] > 0 {
			p := fmt.Sprintf("%d %s", v[0], k)
			if v[1] > 0 {
				p += " (" + topology.FormatBytes(v[1]) + ")"
			}
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ", ")
}

// topoPathStats sums up the path costs between compute nodes (between all
// nodes if there are fewer than two compute nodes): the nearest and
// farthest pair for 64 B, the slowest pair for 1 MiB, and whether every
// pair costs the same.
type topoPathStats struct {
	what                string // "compute node" or "node"
	pairs               int
	uniform             bool
	nearest, farthest   [2]int
	slowest             [2]int // for 1 MiB
	nearCost, farCost   topology.Cost
	slowCost, firstBulk topology.Cost
}

func (s *topoSummary) paths(t *topology.Topology) topoPathStats {
	nodes, what := s.compute, "compute node"
	if len(nodes) < 2 {
		nodes, what = append(append([]int(nil), s.compute...), s.switches...), "node"
	}
	ps := topoPathStats{what: what, uniform: true}
	for a, i := range nodes {
		for _, j := range nodes[a+1:] {
			small := t.PathCostIdx(i, j, 64)
			bulk := t.PathCostIdx(i, j, 1<<20)
			p := [2]int{i, j}
			if ps.pairs == 0 {
				ps.nearest, ps.farthest, ps.slowest = p, p, p
				ps.nearCost, ps.farCost, ps.slowCost, ps.firstBulk = small, small, bulk, bulk
			}
			ps.uniform = ps.uniform && small == ps.nearCost && bulk == ps.firstBulk
			if small.Transfer < ps.nearCost.Transfer {
				ps.nearest, ps.nearCost = p, small
			}
			if small.Transfer > ps.farCost.Transfer {
				ps.farthest, ps.farCost = p, small
			}
			if bulk.Transfer > ps.slowCost.Transfer {
				ps.slowest, ps.slowCost = p, bulk
			}
			ps.pairs++
		}
	}
	return ps
}

// rows returns the labelled pairs worth showing.
func (ps *topoPathStats) rows() []struct {
	label string
	pair  [2]int
} {
	type row = struct {
		label string
		pair  [2]int
	}
	if ps.uniform {
		return []row{{fmt.Sprintf("all %d pairs", ps.pairs), ps.nearest}}
	}
	rows := []row{{"nearest", ps.nearest}, {"farthest", ps.farthest}}
	if ps.slowest != ps.farthest {
		rows = append(rows, row{"slowest for 1MiB", ps.slowest})
	}
	return rows
}

// pathLines describes the path costs as a small table.
func (s *topoSummary) pathLines(t *topology.Topology) []string {
	ps := s.paths(t)
	if ps.pairs == 0 {
		return []string{"a single node: every path is local (no link crossed)"}
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tPAIR\tLATENCY\tBANDWIDTH\tHOPS\t64B\t1MiB")
	for _, r := range ps.rows() {
		i, j := r.pair[0], r.pair[1]
		small, bulk := t.PathCostIdx(i, j, 64), t.PathCostIdx(i, j, 1<<20)
		fmt.Fprintf(tw, "%s\t%s ↔ %s\t%v\t%s\t%d\t%v\t%v\n", r.label, t.Nodes[i].Name, t.Nodes[j].Name,
			small.Latency, costBandwidths(small, bulk), small.Hops, small.Transfer, bulk.Transfer)
	}
	tw.Flush()
	lines := []string{fmt.Sprintf("between %ss (%s):", ps.what, countNoun(ps.pairs, "pair"))}
	for l := range strings.Lines(b.String()) {
		lines = append(lines, "  "+strings.TrimRight(l, "\n"))
	}
	return lines
}

// costBandwidths shows the bottleneck of the path small messages take and, if
// bulk transfers take a wider one, that too: "10GB/s, bulk 400GB/s".
func costBandwidths(small, bulk topology.Cost) string {
	s := topology.FormatBandwidth(small.Bandwidth)
	if bulk.Bandwidth != small.Bandwidth {
		s += ", bulk " + topology.FormatBandwidth(bulk.Bandwidth)
	}
	return s
}

func countNoun(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "ch") {
		return strconv.Itoa(n) + " " + what + "es"
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func countOrDash(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func sizeOrDash(n int64) string {
	if n == 0 {
		return "-"
	}
	return topology.FormatBytes(n)
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// deviceSummary summarizes a node's devices: "8 NPU × 128GiB" (withMemory) or
// "8 NPU".
func deviceSummary(n *topology.Node, withMemory bool) string {
	var parts []string
	for _, d := range n.Devices {
		p := fmt.Sprintf("%d %s", d.Count, d.Kind)
		if withMemory && d.MemoryBytes > 0 {
			p += " × " + topology.FormatBytes(d.MemoryBytes)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " + ")
}

func labelList(n *topology.Node) string {
	keys := make([]string, 0, len(n.Labels))
	for k := range n.Labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + n.Labels[k]
	}
	return dashIfEmpty(strings.Join(keys, ","))
}

// widthByBandwidth maps a link's bandwidth to a line width between 1 and
// 4, on a log scale between the narrowest and widest link.
func widthByBandwidth(t *topology.Topology) func(bw float64) float64 {
	lo, hi := math.Inf(1), 0.0
	for _, l := range t.Links {
		lo, hi = min(lo, l.Bandwidth), max(hi, l.Bandwidth)
	}
	return func(bw float64) float64 {
		if hi <= lo {
			return 1.5
		}
		return 1 + 3*math.Log(bw/lo)/math.Log(hi/lo)
	}
}

// Drawing. Both formats draw the same picture: switches in the middle,
// compute nodes around them grouped by their "rack" label, a line per link
// (wider for more bandwidth), and a legend that states what lines would
// clutter: link bandwidth and latency per class and the path costs.

// maxLinkLabels is the most links drawn with their own label; above it the
// legend carries the figures.
const maxLinkLabels = 24

var switchPalette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

// switchColor gives each switch its own colour, so its fan of links can be
// told apart.
func switchColor(s *topoSummary, node int) string {
	return switchPalette[slices.Index(s.switches, node)%len(switchPalette)]
}

// boxText is the two lines written in a node's box.
func boxText(n *topology.Node) (name, sub string) {
	switch {
	case n.IsSwitch():
		return n.Name, "UB switch"
	case len(n.Devices) > 0:
		return n.Name, deviceSummary(n, false)
	case n.CPUs > 0:
		return n.Name, countNoun(n.CPUs, "CPU")
	}
	return n.Name, "compute"
}

// nodeTooltip is everything about a node on one line.
func nodeTooltip(n *topology.Node) string {
	if n.IsSwitch() {
		return n.Name + ": UB switch"
	}
	parts := []string{n.Name + ":"}
	if n.CPUs > 0 {
		parts = append(parts, countNoun(n.CPUs, "CPU")+",")
	}
	if n.NUMANodes > 0 {
		parts = append(parts, countNoun(n.NUMANodes, "NUMA node")+",")
	}
	if n.MemoryBytes > 0 {
		parts = append(parts, topology.FormatBytes(n.MemoryBytes)+" memory,")
	}
	if d := deviceSummary(n, true); d != "" {
		parts = append(parts, d+",")
	}
	if len(n.Labels) > 0 {
		parts = append(parts, labelList(n))
	}
	return strings.TrimSuffix(strings.Join(parts, " "), ",")
}

func linkFigures(l topology.Link) string {
	return topology.FormatBandwidth(l.Bandwidth) + " · " + l.Latency.String()
}

// alikeNodes describes the compute nodes if they are all alike ("every
// compute node: 192 CPUs, ..."), else returns "".
func alikeNodes(t *topology.Topology, s *topoSummary) string {
	if len(s.compute) == 0 {
		return ""
	}
	first := &t.Nodes[s.compute[0]]
	for _, i := range s.compute[1:] {
		n := &t.Nodes[i]
		if n.CPUs != first.CPUs || n.NUMANodes != first.NUMANodes || n.MemoryBytes != first.MemoryBytes || !slices.Equal(n.Devices, first.Devices) {
			return ""
		}
	}
	var parts []string
	if first.CPUs > 0 {
		parts = append(parts, countNoun(first.CPUs, "CPU"))
	}
	if first.NUMANodes > 0 {
		parts = append(parts, countNoun(first.NUMANodes, "NUMA node"))
	}
	if first.MemoryBytes > 0 {
		parts = append(parts, topology.FormatBytes(first.MemoryBytes)+" memory")
	}
	if d := deviceSummary(first, true); d != "" {
		parts = append(parts, d)
	}
	if len(parts) == 0 {
		return ""
	}
	who := "every compute node"
	if len(s.compute) == 1 {
		who = "the node"
	}
	return who + ": " + strings.Join(parts, ", ")
}

// legendLines are the legend's sentences after the title: one per link
// class, and the path costs.
func legendLines(t *topology.Topology, s *topoSummary) (classes []string, paths []string) {
	for i := range s.classes {
		c := &s.classes[i]
		classes = append(classes, fmt.Sprintf("%s: %s, %v each (%s)", c.describe(s),
			topology.FormatBandwidth(c.bw), c.lat, countNoun(c.count, "link")))
	}
	ps := s.paths(t)
	if ps.pairs == 0 {
		return classes, []string{"a single node: nothing to route"}
	}
	for _, r := range ps.rows() {
		i, j := r.pair[0], r.pair[1]
		small, bulk := t.PathCostIdx(i, j, 64), t.PathCostIdx(i, j, 1<<20)
		pair := t.Nodes[i].Name + " ↔ " + t.Nodes[j].Name
		if ps.uniform {
			pair = fmt.Sprintf("any %s ↔ any other (%s)", ps.what, r.label)
		} else {
			pair = r.label + " " + pair
		}
		paths = append(paths, fmt.Sprintf("%s: %v, %s, %s; 1MiB in %v", pair, small.Latency,
			costBandwidths(small, bulk), countNoun(small.Hops, "hop"), bulk.Transfer))
	}
	return classes, paths
}

var dotEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// dotQuote quotes s as a DOT string; a newline becomes a centred line break.
func dotQuote(s string) string { return `"` + dotEscaper.Replace(s) + `"` }

// writeDOT writes t as an undirected Graphviz graph for neato, with every
// node pinned where the SVG renderer puts it (dot's layered layout does not
// suit a fabric). Every attribute is plain DOT: any Graphviz can draw it.
func writeDOT(w io.Writer, t *topology.Topology) {
	s := summarizeTopology(t)
	boxes, _, _, _ := svgLayout(t, s)
	pos := make([]string, len(t.Nodes))
	for _, b := range boxes {
		// Inches, y up; a little more room than the SVG for Graphviz's
		// larger boxes.
		pos[b.node] = fmt.Sprintf("%.2f,%.2f!", b.x/60, -b.y/60)
	}
	classes, paths := legendLines(t, s)
	legend := []string{t.Name + ": " + s.headline()}
	if same := alikeNodes(t, s); same != "" {
		legend = append(legend, same)
	}
	legend = append(legend, classes...)
	legend = append(legend, paths...)
	fmt.Fprintf(w, "// %s, drawn by ubctl topology render. Draw it with: neato -Tsvg (the positions are pinned)\n", t.Name)
	fmt.Fprintf(w, "graph %s {\n", dotQuote(t.Name))
	// \l ends a left-justified line of a label.
	for k := range legend {
		legend[k] = dotEscaper.Replace(legend[k])
	}
	label := `"` + strings.Join(legend, `\l`) + `\l"`
	fmt.Fprintf(w, "\tgraph [layout=neato, splines=false, outputorder=edgesfirst, fontname=\"Helvetica\", fontsize=12, labelloc=b, labeljust=l, label=%s];\n", label)
	fmt.Fprintln(w, "\tnode [shape=box, style=\"rounded,filled\", fillcolor=\"#ffffff\", color=\"#888888\", fontname=\"Helvetica\", fontsize=11];")
	fmt.Fprintln(w, "\tedge [color=\"#777777\", fontname=\"Helvetica\", fontsize=9];")
	for i := range t.Nodes {
		n := &t.Nodes[i]
		name, sub := boxText(n)
		attrs := fmt.Sprintf("label=%s, pos=%s, tooltip=%s", dotQuote(name+"\n"+sub), dotQuote(pos[i]), dotQuote(nodeTooltip(n)))
		if n.IsSwitch() {
			attrs += fmt.Sprintf(", fillcolor=%s, color=%s, fontcolor=\"#ffffff\"", dotQuote(switchColor(s, i)), dotQuote(switchColor(s, i)))
		}
		fmt.Fprintf(w, "\t%s [%s];\n", dotQuote(n.Name), attrs)
	}
	width := widthByBandwidth(t)
	for _, l := range t.Links {
		attrs := fmt.Sprintf("penwidth=%.1f, tooltip=%s", width(l.Bandwidth), dotQuote(l.A+" ↔ "+l.B+": "+linkFigures(l)))
		a, _ := t.NodeIndex(l.A)
		b, _ := t.NodeIndex(l.B)
		switch {
		case t.Nodes[b].IsSwitch() && !t.Nodes[a].IsSwitch():
			attrs += ", color=" + dotQuote(switchColor(s, b)+"80")
		case t.Nodes[a].IsSwitch() && !t.Nodes[b].IsSwitch():
			attrs += ", color=" + dotQuote(switchColor(s, a)+"80")
		}
		if len(t.Links) <= maxLinkLabels {
			attrs += ", label=" + dotQuote(topology.FormatBandwidth(l.Bandwidth)+"\n"+l.Latency.String())
		}
		fmt.Fprintf(w, "\t%s -- %s [%s];\n", dotQuote(l.A), dotQuote(l.B), attrs)
	}
	fmt.Fprintln(w, "}")
}

// drawnBox is a node as drawn: centre, size and text.
type drawnBox struct {
	node      int
	x, y      float64
	w, h      float64
	name, sub string
}

const (
	svgBoxHeight   = 38.0
	svgNameCharW   = 7.6  // 13px bold
	svgSubCharW    = 6.2  // 11px
	svgTitleCharW  = 11.6 // 21px bold
	svgLegendCharW = 9.0  // 17px
	svgLegendLine  = 28.0
	svgBoxPad      = 16.0
	svgBoxGap      = 8.0
)

func newDrawnBox(t *topology.Topology, i int) drawnBox {
	name, sub := boxText(&t.Nodes[i])
	w := max(float64(len([]rune(name)))*svgNameCharW, float64(len([]rune(sub)))*svgSubCharW) + svgBoxPad
	return drawnBox{node: i, w: max(w, 56), h: svgBoxHeight, name: name, sub: sub}
}

// sharedArea is the area two boxes, each grown by gap/2, share.
func sharedArea(a, b *drawnBox, gap float64) float64 {
	dx := (a.w+b.w)/2 + gap - math.Abs(a.x-b.x)
	dy := (a.h+b.h)/2 + gap - math.Abs(a.y-b.y)
	return max(dx, 0) * max(dy, 0)
}

func boxesOverlap(a, b *drawnBox, gap float64) bool {
	return math.Abs(a.x-b.x) < (a.w+b.w)/2+gap && math.Abs(a.y-b.y) < (a.h+b.h)/2+gap
}

// placeOnRing places boxes on an ellipse (rx = aspect × r) starting at the top,
// clockwise, at the given slot positions out of total slots, growing r from
// minR until neighbours do not overlap.
func placeOnRing(boxes []drawnBox, slots []float64, total, minR, aspect float64) float64 {
	r := minR
	for range 200 {
		for k := range boxes {
			a := -math.Pi/2 + 2*math.Pi*slots[k]/total
			boxes[k].x, boxes[k].y = aspect*r*math.Cos(a), r*math.Sin(a)
		}
		clear := true
		for k := range boxes {
			if len(boxes) > 1 && boxesOverlap(&boxes[k], &boxes[(k+1)%len(boxes)], svgBoxGap) {
				clear = false
				break
			}
		}
		if clear {
			return r
		}
		r *= 1.04
	}
	return r
}

// rackGroup is a run of compute nodes with the same "rack" label.
type rackGroup struct {
	label      string
	first, end int // slots [first, end)
}

// svgLayout places every node: switches on an inner ring (or in the
// centre), compute nodes on an outer ellipse in rack order.
func svgLayout(t *topology.Topology, s *topoSummary) (boxes []drawnBox, groups []rackGroup, rx, ry float64) {
	inner := make([]drawnBox, len(s.switches))
	for k, i := range s.switches {
		inner[k] = newDrawnBox(t, i)
	}
	innerR := 0.0
	if len(inner) > 1 {
		slots := make([]float64, len(inner))
		for k := range slots {
			slots[k] = float64(k) + 0.5
		}
		innerR = placeOnRing(inner, slots, float64(len(inner)), 40, 1.3)
	}

	// Compute nodes in rack order (stable), a gap of half a slot between
	// racks.
	order := slices.Clone(s.compute)
	rack := func(i int) string { return t.Nodes[i].Labels["rack"] }
	var firstSeen []string
	for _, i := range order {
		if !slices.Contains(firstSeen, rack(i)) {
			firstSeen = append(firstSeen, rack(i))
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return slices.Index(firstSeen, rack(a)) - slices.Index(firstSeen, rack(b))
	})
	outer := make([]drawnBox, len(order))
	slots := make([]float64, len(order))
	pos := 0.0
	for k, i := range order {
		if k > 0 && rack(i) != rack(order[k-1]) {
			pos += 0.5
		}
		if len(firstSeen) > 1 && rack(i) != "" && (k == 0 || rack(i) != rack(order[k-1])) {
			groups = append(groups, rackGroup{label: rack(i), first: k})
		}
		if len(groups) > 0 {
			groups[len(groups)-1].end = k + 1
		}
		outer[k] = newDrawnBox(t, i)
		slots[k] = pos
		pos += 1
	}
	if len(groups) > 1 {
		pos += 0.5 // the gap between the last rack and the first
	}
	switch {
	case len(outer) == 1 && len(inner) == 0:
		// One node: in the middle.
	case len(outer) > 0:
		minR := 90.0
		if len(inner) > 0 {
			minR = innerR + 170 // room for the fan of links to be seen
		} else if len(t.Links) <= maxLinkLabels {
			minR = 130 // room for link labels
		}
		aspect := 1.25
		ry = placeOnRing(outer, slots, pos, minR, aspect)
		rx = aspect * ry
		// Spread the switches to about a third of the way out, so that
		// each one's fan of links can be followed.
		if len(inner) > 1 && innerR < 0.3*ry {
			for k := range inner {
				inner[k].x *= 0.3 * ry / innerR
				inner[k].y *= 0.3 * ry / innerR
			}
		}
	}
	boxes = append(inner, outer...)
	// The groups index the outer boxes; shift them past the switches.
	for g := range groups {
		groups[g].first += len(inner)
		groups[g].end += len(inner)
	}
	return boxes, groups, rx, ry
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

func xmlEscape(s string) string { return xmlEscaper.Replace(s) }

// writeSVG draws t as a self-contained SVG: no scripts, fonts or files
// outside it.
func writeSVG(w io.Writer, t *topology.Topology) {
	s := summarizeTopology(t)
	boxes, groups, rx, ry := svgLayout(t, s)
	at := map[int]*drawnBox{}
	for k := range boxes {
		at[boxes[k].node] = &boxes[k]
	}

	// The drawing's extent, in the layout's frame (centre at 0,0).
	minX, minY, maxX, maxY := math.Inf(1), math.Inf(1), math.Inf(-1), math.Inf(-1)
	grow := func(x0, y0, x1, y1 float64) {
		minX, minY, maxX, maxY = min(minX, x0), min(minY, y0), max(maxX, x1), max(maxY, y1)
	}
	for _, b := range boxes {
		grow(b.x-b.w/2, b.y-b.h/2, b.x+b.w/2, b.y+b.h/2)
	}
	// Rack arcs sit just outside the ring of boxes, their labels further
	// out. reach is how far a box extends from its centre in direction a.
	reach := func(b *drawnBox, a float64) float64 {
		return math.Abs(math.Cos(a))*b.w/2 + math.Abs(math.Sin(a))*b.h/2
	}
	type rackLabel struct {
		x, y   float64
		anchor string
		text   string
	}
	var arcs []string
	var rackLabels []rackLabel
	for _, g := range groups {
		// Half a slot beyond the first and last box of the rack.
		a0 := math.Atan2(boxes[g.first].y/ry, boxes[g.first].x/rx)
		a1 := math.Atan2(boxes[g.end-1].y/ry, boxes[g.end-1].x/rx)
		if a1 < a0 {
			a1 += 2 * math.Pi
		}
		pad := 0.25 * 2 * math.Pi / float64(len(s.compute)+len(groups))
		if g.end-g.first == 1 {
			pad *= 2
		}
		a0, a1 = a0-pad, a1+pad
		var pts []string
		for k := 0; k <= 32; k++ {
			a := a0 + (a1-a0)*float64(k)/32
			x, y := ellipsePoint(rx, ry, a, reach(&boxes[g.first], a)+10)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
			grow(x-5, y-5, x+5, y+5)
		}
		arcs = append(arcs, strings.Join(pts, " "))
		mid := (a0 + a1) / 2
		x, y := ellipsePoint(rx, ry, mid, reach(&boxes[g.first], mid)+26)
		anchor := "middle"
		switch {
		case math.Cos(mid) > 0.35:
			anchor = "start"
		case math.Cos(mid) < -0.35:
			anchor = "end"
		}
		y += 5 + 6*math.Sin(mid) // baseline: text hangs below points at the bottom
		rackLabels = append(rackLabels, rackLabel{x, y, anchor, g.label})
		tw := float64(len(g.label)) * 8
		switch anchor {
		case "start":
			grow(x, y-14, x+tw, y+4)
		case "end":
			grow(x-tw, y-14, x, y+4)
		default:
			grow(x-tw/2, y-14, x+tw/2, y+4)
		}
	}

	classes, paths := legendLines(t, s)
	var nodesLine []string
	if same := alikeNodes(t, s); same != "" {
		nodesLine = []string{same}
	}
	title := t.Name + ": " + s.headline()
	legendW := float64(len([]rune(title))) * svgTitleCharW
	for _, l := range slices.Concat(nodesLine, classes, paths) {
		legendW = max(legendW, float64(len([]rune(l)))*svgLegendCharW+48)
	}
	const margin = 30.0
	width := max(maxX-minX, legendW) + 2*margin
	legendTop := maxY - minY + 2*margin + 10
	legendH := 36 + svgLegendLine*float64(len(nodesLine)+len(classes)+len(paths)) + 20
	height := legendTop + legendH
	dx := margin - minX + (width-2*margin-(maxX-minX))/2
	dy := margin - minY

	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif">`+"\n",
		width, height, width, height)
	fmt.Fprintf(w, "<title>%s</title>\n", xmlEscape("topology "+t.Name))
	fmt.Fprintln(w, `<style>
.node rect { fill: #ffffff; stroke: #6b7785; stroke-width: 1.2; }
.switch rect { stroke-width: 0; }
.name { font-size: 13px; font-weight: bold; fill: #1d2733; }
.switch .name, .switch .sub { fill: #ffffff; }
.sub { font-size: 11px; fill: #4a5562; }
.rack { fill: none; stroke: #d5dbe3; stroke-width: 8; stroke-linecap: round; }
.racklabel { font-size: 14px; fill: #5f6b78; }
.link { stroke: #5b6670; }
.fan { stroke-opacity: 0.3; }
.linklabel { font-size: 10px; fill: #333333; }
.legend { font-size: 17px; fill: #1d2733; }
.legendtitle { font-size: 21px; font-weight: bold; fill: #1d2733; }
</style>`)
	fmt.Fprintf(w, `<rect x="0" y="0" width="%.0f" height="%.0f" fill="#ffffff"/>`+"\n", width, height)
	fmt.Fprintf(w, `<g transform="translate(%.1f,%.1f)">`+"\n", dx, dy)

	for _, pts := range arcs {
		fmt.Fprintf(w, `<polyline class="rack" points="%s"/>`+"\n", pts)
	}
	for _, l := range rackLabels {
		fmt.Fprintf(w, `<text class="racklabel" x="%.1f" y="%.1f" text-anchor="%s">%s</text>`+"\n", l.x, l.y, l.anchor, xmlEscape(l.text))
	}

	// Links under the boxes: fans to switches in the switch's colour,
	// others grey; width by bandwidth.
	width4 := widthByBandwidth(t)
	fmt.Fprintln(w, `<g class="links">`)
	for _, l := range t.Links {
		a, _ := t.NodeIndex(l.A)
		b, _ := t.NodeIndex(l.B)
		ba, bb := at[a], at[b]
		class, color := "link", ""
		switch {
		case t.Nodes[b].IsSwitch() && !t.Nodes[a].IsSwitch():
			class, color = "link fan", switchColor(s, b)
		case t.Nodes[a].IsSwitch() && !t.Nodes[b].IsSwitch():
			class, color = "link fan", switchColor(s, a)
		}
		style := fmt.Sprintf(` stroke-width="%.1f"`, width4(l.Bandwidth))
		if color != "" {
			style += fmt.Sprintf(` style="stroke:%s"`, color)
		}
		fmt.Fprintf(w, `<line class="%s" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"%s><title>%s</title></line>`+"\n",
			class, ba.x, ba.y, bb.x, bb.y, style, xmlEscape(l.A+" ↔ "+l.B+": "+linkFigures(l)))
	}
	fmt.Fprintln(w, `</g>`)

	for _, b := range boxes {
		n := &t.Nodes[b.node]
		class, fill := "node", ""
		if n.IsSwitch() {
			class, fill = "node switch", fmt.Sprintf(` style="fill:%s"`, switchColor(s, b.node))
		}
		fmt.Fprintf(w, `<g class="%s"><title>%s</title>`, class, xmlEscape(nodeTooltip(n)))
		fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="6"%s/>`, b.x-b.w/2, b.y-b.h/2, b.w, b.h, fill)
		fmt.Fprintf(w, `<text class="name" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, b.x, b.y-3, xmlEscape(b.name))
		fmt.Fprintf(w, `<text class="sub" x="%.1f" y="%.1f" text-anchor="middle">%s</text></g>`+"\n", b.x, b.y+12, xmlEscape(b.sub))
	}

	// Link labels last, on a white ground, when there are few links: at the
	// middle of the line, or moved along it clear of boxes and other labels.
	if len(t.Links) <= maxLinkLabels {
		taken := slices.Clone(boxes)
		for _, l := range t.Links {
			a, _ := t.NodeIndex(l.A)
			b, _ := t.NodeIndex(l.B)
			ba, bb := at[a], at[b]
			text := linkFigures(l)
			label := drawnBox{w: float64(len([]rune(text)))*5.6 + 8, h: 15}
			best, bestF := math.Inf(1), 0.5
			for _, f := range []float64{0.5, 0.4, 0.6, 0.32, 0.68, 0.25, 0.75} {
				label.x, label.y = ba.x+f*(bb.x-ba.x), ba.y+f*(bb.y-ba.y)
				covered := 0.0
				for k := range taken {
					covered += sharedArea(&label, &taken[k], 3)
				}
				if covered < best {
					best, bestF = covered, f
				}
				if covered == 0 {
					break
				}
			}
			label.x, label.y = ba.x+bestF*(bb.x-ba.x), ba.y+bestF*(bb.y-ba.y)
			taken = append(taken, label)
			fmt.Fprintf(w, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="3" fill="#ffffff" fill-opacity="0.9"/>`,
				label.x-label.w/2, label.y-label.h/2, label.w, label.h)
			fmt.Fprintf(w, `<text class="linklabel" x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", label.x, label.y+3.5, xmlEscape(text))
		}
	}
	fmt.Fprintln(w, `</g>`)

	// The legend, under the drawing.
	y := legendTop
	fmt.Fprintf(w, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#d5dbe3"/>`+"\n", margin, y-14, width-margin, y-14)
	fmt.Fprintf(w, `<text class="legendtitle" x="%.0f" y="%.1f">%s</text>`+"\n", margin, y+8, xmlEscape(title))
	y += 36
	for _, line := range nodesLine {
		fmt.Fprintf(w, `<text class="legend" x="%.0f" y="%.1f">%s</text>`+"\n", margin+46, y, xmlEscape(line))
		y += svgLegendLine
	}
	for k, line := range classes {
		c := &s.classes[k]
		if c.kinds == "compute ↔ switch" {
			// A little fan in the switches' colours.
			for f := range 3 {
				fmt.Fprintf(w, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`,
					margin, y-5, margin+34, y-11+6*float64(f), switchPalette[f], width4(c.bw))
			}
		} else {
			fmt.Fprintf(w, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#5b6670" stroke-width="%.1f"/>`,
				margin, y-5, margin+34, y-5, width4(c.bw))
		}
		fmt.Fprintf(w, `<text class="legend" x="%.0f" y="%.1f">%s</text>`+"\n", margin+46, y, xmlEscape(line))
		y += svgLegendLine
	}
	for _, line := range paths {
		fmt.Fprintf(w, `<text class="legend" x="%.0f" y="%.1f">%s</text>`+"\n", margin+46, y, xmlEscape(line))
		y += svgLegendLine
	}
	fmt.Fprintln(w, `</svg>`)
}

// ellipsePoint returns the point at parameter a on the ellipse rx × ry
// (where a box centred at that parameter sits), pushed out along the
// ellipse's normal by off.
func ellipsePoint(rx, ry, a, off float64) (x, y float64) {
	x, y = rx*math.Cos(a), ry*math.Sin(a)
	nx, ny := math.Cos(a)/rx, math.Sin(a)/ry
	norm := math.Hypot(nx, ny)
	return x + off*nx/norm, y + off*ny/norm
}
