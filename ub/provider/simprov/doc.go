// Package simprov is the "sim" provider of the ub verbs API: a simulated
// super node. It wraps another provider ("shm" by default, or "tcp") with a
// topology: each process plays one node, and an operation between two nodes
// takes the path's latency plus its bytes over the path's bandwidth, with
// each link's bandwidth shared by the flows that cross it. Faults (a link
// down, a slow link, a crashed node) are injected through a [Fabric] and
// surface as completion errors of the operations they touch, and only of
// those.
//
//	import _ "github.com/ubkit-io/ubkit/ub/provider/simprov"
//	ctx, err := ub.Open(context.Background(), "sim", ub.Config{Options: map[string]string{
//		"topology": "dev4", // an example name or a file; default UB_TOPOLOGY
//		"node":     "node1", // default UB_NODE
//	}})
//
// A process that knows which node it plays (a transport endpoint) opens
// it with ub.OpenNode instead, giving the topology and the node; the
// options "topology" and "node" stay unset then.
//
// The link state and faults live in a shared-memory segment named after the
// topology, so every process of the simulated super node on this host sees
// the same links (with "tcp" underneath, each host has its own view).
//
// A simulated link cannot be faster than the host under it: a latency below
// the inner provider's own, or a bandwidth above it, is not reached. Nor is
// it ever faster than configured: nothing arrives before its simulated
// time. It can be slower, on a loaded machine that runs the simulator late;
// [Context.Stats] says by how much, by the simulator's own clock.
package simprov
