// Package v1alpha1 holds ubkit's Kubernetes API types, group
// supernode.ubkit.io, version v1alpha1: SuperNode, one logical view of a UB
// super node (its member Nodes, their health, pooled memory and
// accelerators, interconnect and topology tiers), written by the
// controller in k8s/supernode.
//
// The types carry kubebuilder markers; `make generate` runs controller-gen
// for the deepcopy functions (zz_generated.deepcopy.go), the CRD
// (k8s/config/crd) and the controller's RBAC (k8s/config/rbac), and a test
// fails when the checked-in output is stale. It is an API package: no
// clients, no logic beyond names and helpers on the types.
//
// +kubebuilder:object:generate=true
// +groupName=supernode.ubkit.io
package v1alpha1
