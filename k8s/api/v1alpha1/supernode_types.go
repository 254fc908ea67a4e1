package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels and annotations of the Nodes of a super node.
const (
	// LabelSuperNode on a Node names its super node: the Node is a member
	// of the SuperNode of that name. Discovery (or k8stest) sets it.
	LabelSuperNode = "supernode.ubkit.io/id"
	// LabelRack on a Node names its rack: the first topology tier below
	// the super node.
	LabelRack = "supernode.ubkit.io/rack"
	// LabelUBBandwidth (a label or an annotation) on a Node is its UB
	// bandwidth in bytes per second, each way, as ub/topology writes
	// bandwidths ("392GB/s" as an annotation; a bare number of bytes per
	// second fits in a label).
	LabelUBBandwidth = "supernode.ubkit.io/ub-bandwidth"

	// AnnotationMemory, AnnotationGPUPool and
	// AnnotationInterconnectBandwidth are what the controller writes on
	// each member Node. The first two name the SuperNode whose memory
	// pool and accelerator pool the Node's memory and devices are part
	// of (the pool sizes are on the SuperNode's status only, so nothing
	// adds a pool up once per member); the third is the super node's
	// interconnect bandwidth between any two members.
	AnnotationMemory                = "supernode.ubkit.io/memory"
	AnnotationGPUPool               = "supernode.ubkit.io/gpu-pool"
	AnnotationInterconnectBandwidth = "supernode.ubkit.io/interconnect-bandwidth"
)

// Condition types of a SuperNode.
const (
	// ConditionReady is True when every member is Ready.
	ConditionReady = "Ready"
	// ConditionDegraded is True when a member is not Ready or has gone;
	// its message names them.
	ConditionDegraded = "Degraded"
)

// Reasons of the conditions.
const (
	ReasonAllMembersReady = "AllMembersReady"
	ReasonMembersNotReady = "MembersNotReady"
	ReasonMembersMissing  = "MembersMissing"
	ReasonNoMembers       = "NoMembers"
)

// MemberHealth is the health of one member Node.
// +kubebuilder:validation:Enum=Ready;NotReady;Unknown;Missing
type MemberHealth string

// Member health values.
const (
	// MemberReady: the Node's Ready condition is True.
	MemberReady MemberHealth = "Ready"
	// MemberNotReady: its Ready condition is False.
	MemberNotReady MemberHealth = "NotReady"
	// MemberUnknown: its Ready condition is Unknown or absent (the node
	// stopped reporting).
	MemberUnknown MemberHealth = "Unknown"
	// MemberMissing: the Node was a member and has been deleted. It
	// stays Missing for the controller's grace period (10 minutes
	// unless configured), from MissingSince, and is then dropped; a
	// Node relabelled to another super node (or unlabelled) is dropped
	// at once instead.
	MemberMissing MemberHealth = "Missing"
)

// SuperNodeSpec says which Nodes are members.
type SuperNodeSpec struct {
	// ID is the value of the supernode.ubkit.io/id label of the member
	// Nodes. It is the SuperNode's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ID string `json:"id"`
}

// MemberStatus is one member Node as the controller last saw it.
type MemberStatus struct {
	// Name is the Node's name.
	Name string `json:"name"`
	// Health is Ready, NotReady, Unknown or Missing.
	Health MemberHealth `json:"health"`
	// Reason is the Node's Ready condition reason, when not Ready.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Rack is the Node's rack (supernode.ubkit.io/rack), if labelled.
	// +optional
	Rack string `json:"rack,omitempty"`
	// MissingSince is when the controller first found a Missing member
	// gone; set only on Missing members.
	// +optional
	MissingSince *metav1.Time `json:"missingSince,omitempty"`
}

// Tier is one level of the super node's topology, Volcano's way: tier 1
// groups Nodes, each higher tier groups the tier below.
type Tier struct {
	// Tier is the level, from 1.
	Tier int32 `json:"tier"`
	// Key is what groups the members at this tier: a Node label
	// (supernode.ubkit.io/rack) or "supernode" for the whole.
	Key string `json:"key"`
	// Groups is how many groups this tier has.
	Groups int32 `json:"groups"`
}

// SuperNodeStatus is the super node in one view.
type SuperNodeStatus struct {
	// ObservedGeneration is the generation of the spec this status is for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions are Ready and Degraded.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Phase is Ready, Degraded or Empty, for the printer column.
	// +optional
	Phase string `json:"phase,omitempty"`
	// MemberCount is how many members it has, Missing ones included
	// (at most 1,000 of those, the latest gone).
	MemberCount int32 `json:"memberCount"`
	// ReadyCount is how many of them are Ready.
	ReadyCount int32 `json:"readyCount"`
	// Members are the members in name order.
	// +listType=map
	// +listMapKey=name
	// +optional
	Members []MemberStatus `json:"members,omitempty"`
	// Memory is the pooled memory: the sum of the present members'
	// memory capacity.
	// +optional
	Memory resource.Quantity `json:"memory,omitempty"`
	// NPUs, GPUs and KAEs are the pools of accelerators: the sum of the
	// present members' ubkit.io/npu, ubkit.io/gpu and ubkit.io/kae
	// capacity.
	// +optional
	NPUs int64 `json:"npus,omitempty"`
	// +optional
	GPUs int64 `json:"gpus,omitempty"`
	// +optional
	KAEs int64 `json:"kaes,omitempty"`
	// InterconnectBandwidth is the UB bandwidth between any two members,
	// each way (the least of the members' supernode.ubkit.io/ub-bandwidth),
	// as ub/topology writes it; empty if no member reports one.
	// +optional
	InterconnectBandwidth string `json:"interconnectBandwidth,omitempty"`
	// Tiers are the topology's levels, lowest first.
	// +optional
	Tiers []Tier `json:"tiers,omitempty"`
}

// SuperNode is a UB super node as Kubernetes sees it: the Nodes labelled
// supernode.ubkit.io/id=<name>, their health and their pooled capacity.
// The controller creates one for each value of that label.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=sn
// +kubebuilder:validation:XValidation:rule="self.spec.id == self.metadata.name",message="spec.id must equal the name"
// +kubebuilder:printcolumn:name="Members",type=integer,JSONPath=`.status.memberCount`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyCount`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.status.memory`
// +kubebuilder:printcolumn:name="NPUs",type=integer,JSONPath=`.status.npus`
// +kubebuilder:printcolumn:name="GPUs",type=integer,JSONPath=`.status.gpus`,priority=1
// +kubebuilder:printcolumn:name="KAEs",type=integer,JSONPath=`.status.kaes`,priority=1
// +kubebuilder:printcolumn:name="Bandwidth",type=string,JSONPath=`.status.interconnectBandwidth`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SuperNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SuperNodeSpec   `json:"spec"`
	Status SuperNodeStatus `json:"status,omitempty"`
}

// SuperNodeList is a list of SuperNodes.
//
// +kubebuilder:object:root=true
type SuperNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SuperNode `json:"items"`
}

// Phases of a SuperNode.
const (
	PhaseReady    = "Ready"
	PhaseDegraded = "Degraded"
	PhaseEmpty    = "Empty"
)
