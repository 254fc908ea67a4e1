// Package config carries ubkit's Kubernetes manifests into programs: the
// CRDs that controller-gen writes into k8s/config/crd (make generate),
// embedded as they are on disk.
package config

import _ "embed"

// SuperNodeCRD is the CustomResourceDefinition of SuperNode
// (crd/supernode.ubkit.io_supernodes.yaml), as YAML.
//
//go:embed crd/supernode.ubkit.io_supernodes.yaml
var SuperNodeCRD []byte
