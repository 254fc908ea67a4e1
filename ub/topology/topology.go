package topology

import (
	"errors"
	"fmt"
	"time"
)

// ErrUnknownNode is wrapped by the errors of look-ups that name a node the
// topology does not have.
var ErrUnknownNode = errors.New("topology: unknown node")

// Limits on the size of a topology. Path tables take about 44 bytes per
// ordered pair of nodes (MaxNodes nodes: about 180 MiB) and are computed in
// O(nodes × links × log nodes); a real super node is far below both limits.
const (
	MaxNodes = 2048
	MaxLinks = 32768
)

// NodeKind says what a node is for.
type NodeKind string

// Node kinds. The zero value "" means [Compute].
const (
	// Compute is a server: it has CPUs, memory and devices and runs
	// processes. It may also forward traffic between its links.
	Compute NodeKind = "compute"
	// Switch is a UB switch: it forwards traffic between its links and hosts
	// nothing (no CPUs, memory or devices, and no process plays it).
	Switch NodeKind = "switch"
)

// DeviceKind names a kind of accelerator.
type DeviceKind string

// Device kinds.
const (
	// GPU is a graphics processor used for compute.
	GPU DeviceKind = "GPU"
	// NPU is a neural processing unit such as Huawei Ascend.
	NPU DeviceKind = "NPU"
	// KAE is a Kunpeng Accelerator Engine (compression, crypto).
	KAE DeviceKind = "KAE"
)

// Topology is a super node: a name, its nodes and the links between them.
//
// Build one with [New], [Parse], [Load], [FromEnv], [Example] or [Discover];
// they validate it and compute the path tables that [Topology.PathCost]
// reads. Those tables are not updated if Nodes or Links are changed
// afterwards: treat a Topology as immutable and build a new one instead.
type Topology struct {
	// Name names the super node.
	Name string
	// Nodes are the servers and switches, in file order; path look-ups by
	// index ([Topology.NodeIndex]) use this order.
	Nodes []Node
	// Links join pairs of nodes in both directions.
	Links []Link

	routes *routes
}

// Node is one server (Kind [Compute]) or UB switch (Kind [Switch]).
type Node struct {
	// Name identifies the node: 1 to 253 letters, digits, '.', '-' or '_',
	// starting with a letter or digit (a host name fits).
	Name string
	// Kind is Compute or Switch; "" means Compute.
	Kind NodeKind
	// CPUs is the number of logical CPUs (0: unknown or none).
	CPUs int
	// NUMANodes is the number of NUMA nodes (0: unknown).
	NUMANodes int
	// MemoryBytes is the node's main memory in bytes (0: unknown or none).
	MemoryBytes int64
	// Devices are the node's accelerators.
	Devices []Device
	// Labels are free-form key/value pairs (rack, zone, role, ...).
	Labels map[string]string
}

// IsSwitch reports whether n is a UB switch.
func (n *Node) IsSwitch() bool { return n.Kind == Switch }

// DeviceCount returns how many devices of the kind the node has.
func (n *Node) DeviceCount(kind DeviceKind) int {
	total := 0
	for _, d := range n.Devices {
		if d.Kind == kind {
			total += d.Count
		}
	}
	return total
}

// Device is a group of identical accelerators on a node.
type Device struct {
	// Kind is GPU, NPU or KAE.
	Kind DeviceKind
	// Count is how many there are.
	Count int
	// MemoryBytes is the memory of each one (HBM for an NPU or GPU); 0 if
	// unknown or none.
	MemoryBytes int64
}

// Link joins nodes A and B in both directions. Each direction has the full
// bandwidth. Parallel links between the same two nodes are not allowed:
// describe them as one link with their summed bandwidth.
type Link struct {
	// A and B name the two nodes.
	A, B string
	// Bandwidth is in bytes per second, in each direction.
	Bandwidth float64
	// Latency is the one-way latency of the link, switch traversal included.
	// Zero means negligible.
	Latency time.Duration
}

// New validates the nodes and links and returns a Topology with its path
// tables computed. It copies the slices (not the devices or labels they
// hold) and fills in an empty Node.Kind as Compute. An invalid topology
// yields a *[ValidationError] listing every problem.
func New(name string, nodes []Node, links []Link) (*Topology, error) {
	t := &Topology{
		Name:  name,
		Nodes: append([]Node(nil), nodes...),
		Links: append([]Link(nil), links...),
	}
	for i := range t.Nodes {
		if t.Nodes[i].Kind == "" {
			t.Nodes[i].Kind = Compute
		}
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	t.routes = computeRoutes(t)
	return t, nil
}

// NodeIndex returns the index in t.Nodes of the named node, for
// [Topology.PathCostIdx].
func (t *Topology) NodeIndex(name string) (int, bool) {
	if t.routes == nil {
		return 0, false
	}
	i, ok := t.routes.index[name]
	return i, ok
}

func (t *Topology) lookup(name string) (int, error) {
	if t.routes == nil {
		return 0, errNotBuilt
	}
	i, ok := t.routes.index[name]
	if !ok {
		return 0, fmt.Errorf("%w %q in %q", ErrUnknownNode, name, t.Name)
	}
	return i, nil
}

var errNotBuilt = errors.New("topology: no path tables: make the Topology with New, Parse, Load, FromEnv, Example or Discover")

// LinkBandwidth is node's UB link bandwidth in bytes per second: the
// widest of its links, what one transfer into or out of it can get at
// most; 0 if it has none (or no node has that name).
func (t *Topology) LinkBandwidth(node string) float64 {
	var bw float64
	for _, l := range t.Links {
		if (l.A == node || l.B == node) && l.Bandwidth > bw {
			bw = l.Bandwidth
		}
	}
	return bw
}
