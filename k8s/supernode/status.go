package supernode

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// Extended resources of the accelerators (the names k8stest and the
// device plugin use).
const (
	resourceNPU corev1.ResourceName = "ubkit.io/npu"
	resourceGPU corev1.ResourceName = "ubkit.io/gpu"
	resourceKAE corev1.ResourceName = "ubkit.io/kae"
)

// maxNamed bounds the members a condition message names.
const maxNamed = 20

// maxMissing bounds the Missing members a status keeps: under node
// churn beyond it, the ones gone longest are dropped before their grace
// ends.
const maxMissing = 1000

// computeStatus is the status of super node sn given its member Nodes
// now, its previous status, the previous members that are Nodes no
// longer labelled for it (moved: relabelled, or unlabelled), the time
// and the grace period of deleted members. A previous member neither
// among nodes nor moved has been deleted: it is Missing, from when it
// was first found so (MissingSince), until grace has passed since; at
// most maxMissing are kept, the latest gone. A moved member is dropped
// at once. next is how long until the first Missing member's grace ends
// (0: none is Missing), when the status is due again.
//
// It is a pure function of its arguments; conditions keep their
// transition time unless their status changes.
func computeStatus(sn *v1alpha1.SuperNode, nodes []corev1.Node, moved map[string]bool, now time.Time, grace time.Duration) (st v1alpha1.SuperNodeStatus, next time.Duration) {
	prev := sn.Status
	st = v1alpha1.SuperNodeStatus{
		ObservedGeneration: sn.Generation,
		Conditions:         slices.Clone(prev.Conditions),
	}
	present := map[string]bool{}
	var memory resource.Quantity
	var bandwidth float64
	racks := map[string]bool{}
	unracked := false
	for i := range nodes {
		n := &nodes[i]
		present[n.Name] = true
		m := v1alpha1.MemberStatus{Name: n.Name, Rack: n.Labels[v1alpha1.LabelRack]}
		m.Health, m.Reason = nodeHealth(n)
		st.Members = append(st.Members, m)
		if m.Rack != "" {
			racks[m.Rack] = true
		} else {
			unracked = true
		}
		if m.Health != v1alpha1.MemberReady {
			continue
		}
		// Pools count what is usable: the Ready members'.
		if q, ok := n.Status.Capacity[corev1.ResourceMemory]; ok {
			memory.Add(q)
		}
		st.NPUs += count(n, resourceNPU)
		st.GPUs += count(n, resourceGPU)
		st.KAEs += count(n, resourceKAE)
		if b, ok := nodeBandwidth(n); ok && (bandwidth == 0 || b < bandwidth) {
			bandwidth = b
		}
	}
	// Seconds, as the apiserver keeps a time: a status computed again
	// compares equal to the one saved.
	found := metav1.NewTime(now.Truncate(time.Second))
	var gone []v1alpha1.MemberStatus
	for _, m := range prev.Members {
		if present[m.Name] || moved[m.Name] {
			continue
		}
		since := found
		if m.Health == v1alpha1.MemberMissing && m.MissingSince != nil {
			since = *m.MissingSince
		}
		if !now.Before(since.Add(grace)) {
			continue // deleted for the whole grace: dropped
		}
		gone = append(gone, v1alpha1.MemberStatus{Name: m.Name, Health: v1alpha1.MemberMissing, Rack: m.Rack, MissingSince: &since})
	}
	if len(gone) > maxMissing {
		slices.SortFunc(gone, func(a, b v1alpha1.MemberStatus) int {
			return cmp.Or(b.MissingSince.Compare(a.MissingSince.Time), strings.Compare(a.Name, b.Name))
		})
		gone = gone[:maxMissing]
	}
	for _, m := range gone {
		if d := m.MissingSince.Add(grace).Sub(now); next == 0 || d < next {
			next = d
		}
	}
	st.Members = append(st.Members, gone...)
	slices.SortFunc(st.Members, func(a, b v1alpha1.MemberStatus) int { return strings.Compare(a.Name, b.Name) })
	if !memory.IsZero() {
		st.Memory = resource.MustParse(memory.String()) // canonical form, so that equal statuses compare equal
	}
	if bandwidth > 0 {
		st.InterconnectBandwidth = topology.FormatBandwidth(bandwidth)
	}
	if len(racks) > 0 && !unracked {
		st.Tiers = []v1alpha1.Tier{{Tier: 1, Key: v1alpha1.LabelRack, Groups: int32(len(racks))}, {Tier: 2, Key: "supernode", Groups: 1}}
	} else if len(nodes) > 0 {
		st.Tiers = []v1alpha1.Tier{{Tier: 1, Key: "supernode", Groups: 1}}
	}

	var notReady, missing []string
	for _, m := range st.Members {
		switch m.Health {
		case v1alpha1.MemberReady:
			st.ReadyCount++
		case v1alpha1.MemberMissing:
			missing = append(missing, m.Name)
		default:
			notReady = append(notReady, m.Name)
		}
	}
	st.MemberCount = int32(len(st.Members))
	gen := sn.Generation
	switch {
	case st.MemberCount == 0:
		st.Phase = v1alpha1.PhaseEmpty
		setCondition(&st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNoMembers, "no Node has the label "+v1alpha1.LabelSuperNode+"="+sn.Spec.ID, gen)
		setCondition(&st, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonNoMembers, "no members", gen)
	case len(notReady)+len(missing) == 0:
		st.Phase = v1alpha1.PhaseReady
		msg := fmt.Sprintf("all %d members are Ready", st.MemberCount)
		setCondition(&st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonAllMembersReady, msg, gen)
		setCondition(&st, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAllMembersReady, msg, gen)
	default:
		st.Phase = v1alpha1.PhaseDegraded
		reason := v1alpha1.ReasonMembersNotReady
		if len(missing) > 0 {
			reason = v1alpha1.ReasonMembersMissing
		}
		var parts []string
		if len(notReady) > 0 {
			parts = append(parts, "not ready: "+names(notReady))
		}
		if len(missing) > 0 {
			parts = append(parts, "missing: "+names(missing))
		}
		msg := fmt.Sprintf("%d of %d members are Ready; %s", st.ReadyCount, st.MemberCount, strings.Join(parts, "; "))
		setCondition(&st, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, msg, gen)
		setCondition(&st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, reason, msg, gen)
	}
	return st, next
}

func setCondition(st *v1alpha1.SuperNodeStatus, typ string, status metav1.ConditionStatus, reason, msg string, gen int64) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// names lists up to maxNamed names, and how many more there are.
func names(ns []string) string {
	if len(ns) <= maxNamed {
		return strings.Join(ns, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ns[:maxNamed], ", "), len(ns)-maxNamed)
}

func nodeHealth(n *corev1.Node) (v1alpha1.MemberHealth, string) {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		switch c.Status {
		case corev1.ConditionTrue:
			return v1alpha1.MemberReady, ""
		case corev1.ConditionFalse:
			return v1alpha1.MemberNotReady, cmp.Or(c.Reason, "NotReady")
		default:
			return v1alpha1.MemberUnknown, cmp.Or(c.Reason, "Unknown")
		}
	}
	return v1alpha1.MemberUnknown, "NoReadyCondition"
}

func count(n *corev1.Node, r corev1.ResourceName) int64 {
	q, ok := n.Status.Capacity[r]
	if !ok {
		return 0
	}
	return q.Value()
}

// nodeBandwidth is the Node's UB bandwidth, from its annotation or label.
func nodeBandwidth(n *corev1.Node) (float64, bool) {
	s := cmp.Or(n.Annotations[v1alpha1.LabelUBBandwidth], n.Labels[v1alpha1.LabelUBBandwidth])
	if s == "" {
		return 0, false
	}
	b, err := topology.ParseBandwidth(s)
	return b, err == nil && b > 0
}

// memberAnnotations are the annotations the controller keeps on a member
// Node of super node sn.
func memberAnnotations(sn string, st *v1alpha1.SuperNodeStatus, n *corev1.Node) map[string]string {
	a := map[string]string{v1alpha1.AnnotationMemory: sn}
	if count(n, resourceNPU)+count(n, resourceGPU)+count(n, resourceKAE) > 0 {
		a[v1alpha1.AnnotationGPUPool] = sn
	}
	if st.InterconnectBandwidth != "" {
		a[v1alpha1.AnnotationInterconnectBandwidth] = st.InterconnectBandwidth
	}
	return a
}

// annotationsDiffer reports whether n lacks any of want, or has one of
// ours that want does not.
func annotationsDiffer(n *corev1.Node, want map[string]string) bool {
	for _, k := range []string{v1alpha1.AnnotationMemory, v1alpha1.AnnotationGPUPool, v1alpha1.AnnotationInterconnectBandwidth} {
		have, ok := n.Annotations[k]
		w, wok := want[k]
		if ok != wok || have != w {
			return true
		}
	}
	return false
}
