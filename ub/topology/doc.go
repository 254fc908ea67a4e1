// Package topology describes a UB super node: its nodes (CPUs, NUMA nodes,
// memory, accelerators), the UB switches between them and the links that join
// them, and answers one question for the rest of ubkit: what does it cost to
// move n bytes from node A to node B?
//
// A [Topology] comes from a YAML or JSON file ([Parse], [Load]), from the
// UB_TOPOLOGY environment variable ([FromEnv]), from one of the shipped
// examples ([Example]) or from this host ([Discover]). Every source validates
// it ([Topology.Validate] lists every problem with its field path) and
// precomputes, for every pair of nodes, the minimum-latency path and the
// widest path, so that [Topology.PathCost] and its allocation-free variant
// [Topology.PathCostIdx] are table look-ups. [LocalNode] says which node this
// process plays (UB_NODE).
//
// The package is a pure function of its data: path costs never read a clock,
// the network or the file system. Only the sources ([Load], [FromEnv],
// [Discover], [LocalNode]) touch the outside world. It does not measure
// links, shape traffic or inject faults: the sim provider in ub does that
// with the costs computed here.
//
// A Topology is immutable once built and safe for concurrent use.
package topology
