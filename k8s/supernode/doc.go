// Package supernode is the SuperNode controller: it makes Kubernetes know
// a UB super node as one thing. For every value of the
// supernode.ubkit.io/id label of the Nodes it keeps a SuperNode
// (k8s/api/v1alpha1) whose status gathers the members' health, pooled
// memory and accelerators, interconnect bandwidth and topology tiers; it
// annotates the members with the pool they belong to, exports Volcano
// HyperNodes when Volcano's CRD is installed, records Events when a super
// node degrades or recovers, and counts what it does in Prometheus
// metrics.
//
// It is a controller-runtime reconciler (New, then SetupWithManager or
// Run); k8s/cmd/supernode-controller is its command. It does not make
// pooled capacity schedulable: that is the DRA driver's job.
package supernode
