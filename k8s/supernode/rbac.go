package supernode

// What the controller does, as controller-gen's RBAC markers; `make
// generate` turns them into k8s/config/rbac/role.yaml: a ClusterRole for
// what is cluster-wide, and a Role in the leader election namespace
// (DefaultLeaderElectionNamespace) for its Lease and the Events leader
// election records about it. k8s/config/rbac/binding.yaml binds both to
// the controller's service account. Each verb is one a client call of
// the controller makes (TestRBAC holds the list to exactly this):
//
//   - Nodes: list and watch (the cache), patch (the members'
//     annotations, and their removal from Nodes that left).
//   - SuperNodes: list and watch (the cache), create; their status:
//     update; their finalizers: update, which the apiserver asks of one
//     who sets an owner reference with blockOwnerDeletion to a SuperNode
//     (the HyperNodes) where OwnerReferencesPermissionEnforcement is on.
//   - events.k8s.io Events: create and patch (the SuperNode's Degraded
//     and Recovered, through the manager's event recorder).
//   - HyperNodes: list (uncached: a SuperNode's, and one by its name
//     to adopt; and watch, with list, for the cache the controller
//     watches them through when their CRD is there at start), create,
//     update, delete.
//   - In the election namespace: Leases, create, and get and update of
//     the controller's own; core Events, create and patch (client-go's
//     leader election records its transitions the old way).
//
// +kubebuilder:rbac:groups="",resources=nodes,verbs=list;watch;patch
// +kubebuilder:rbac:groups=supernode.ubkit.io,resources=supernodes,verbs=list;watch;create
// +kubebuilder:rbac:groups=supernode.ubkit.io,resources=supernodes/status,verbs=update
// +kubebuilder:rbac:groups=supernode.ubkit.io,resources=supernodes/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=topology.volcano.sh,resources=hypernodes,verbs=list;watch;create;update;delete
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=create,namespace=ubkit-system
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;update,resourceNames=ubkit-supernode-controller,namespace=ubkit-system
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch,namespace=ubkit-system
