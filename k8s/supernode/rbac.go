package supernode

// What the controller does, as controller-gen's RBAC markers; `make
// generate` turns them into k8s/config/rbac/role.yaml.
//
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=supernode.ubkit.io,resources=supernodes,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=supernode.ubkit.io,resources=supernodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=topology.volcano.sh,resources=hypernodes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
