// Package discovery is ubkit's node-side discovery agent: it finds what a
// Kubernetes node of a UB super node has (its super-node identity from
// ub/topology, NVIDIA GPUs, Ascend NPUs, Kunpeng KAE engines through uacce,
// huge pages and NUMA nodes), checks driver, firmware and kernel versions
// against what the operator expects, and publishes the result the Node
// Feature Discovery way: an NFD local feature file (features.d), NodeFeature
// objects when NFD's CRD is installed, and, behind one option, labels put
// on the Node directly.
//
// [Scan] reads a root directory (a fixture tree in tests) and returns a
// [Report]; a file it cannot understand is an error of that one device, and a
// driver whose version does not match is a [Condition], never a failure of
// the scan. [Agent] scans on an interval and whenever a cheap check finds a
// device that came or went, and publishes only when what the node is
// changed (not its free counters); a device that disappears is logged and
// its labels and features removed.
//
// It is not NFD: it does not run rules or label other nodes, and it does not
// allocate devices (the device plugin and DRA driver do).
package discovery
