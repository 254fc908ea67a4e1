#!/usr/bin/env bash
# Generates, with the pinned controller-gen, the deepcopy functions of
# k8s/api/v1alpha1, the CRDs (k8s/config/crd) and the SuperNode
# controller's RBAC (k8s/config/rbac, from the markers in k8s/supernode).
# `make generate` runs it into the tree; k8s/api/v1alpha1's
# TestGeneratedUpToDate runs it into a temporary directory and compares.
#
# usage: generate.sh [object-dir crd-dir rbac-dir]   (run from the module root)
set -euo pipefail
CONTROLLER_GEN=${CONTROLLER_GEN:-sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0}
object=${1:-k8s/api/v1alpha1}
crd=${2:-k8s/config/crd}
rbac=${3:-k8s/config/rbac}
go run "$CONTROLLER_GEN" object paths=./k8s/api/... output:object:dir="$object"
go run "$CONTROLLER_GEN" crd:crdVersions=v1 rbac:roleName=ubkit-supernode-controller \
	paths=./k8s/api/... paths=./k8s/supernode/... \
	output:crd:artifacts:config="$crd" output:rbac:artifacts:config="$rbac"
