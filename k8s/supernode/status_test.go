package supernode

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

// member is a Node of super node "sn" with ready as its Ready condition
// (empty: none), memory and npus in its capacity, and rack if not empty.
func member(name string, ready corev1.ConditionStatus, memory string, npus int64, rack string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelSuperNode: "sn"}}}
	if rack != "" {
		n.Labels[v1alpha1.LabelRack] = rack
	}
	n.Status.Capacity = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memory)}
	if npus > 0 {
		n.Status.Capacity[resourceNPU] = *resource.NewQuantity(npus, resource.DecimalSI)
	}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "Kubelet" + string(ready)}}
	}
	return n
}

// t0 is the time of the statuses status computes; testGrace the grace of
// their deleted members.
var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

const testGrace = 10 * time.Minute

// status is computeStatus at t0, no member moved.
func status(sn *v1alpha1.SuperNode, nodes []corev1.Node) v1alpha1.SuperNodeStatus {
	st, _ := computeStatus(sn, nodes, nil, t0, testGrace)
	return st
}

func superNode(prev v1alpha1.SuperNodeStatus) *v1alpha1.SuperNode {
	return &v1alpha1.SuperNode{ObjectMeta: metav1.ObjectMeta{Name: "sn", Generation: 3}, Spec: v1alpha1.SuperNodeSpec{ID: "sn"}, Status: prev}
}

func wantCondition(t *testing.T, st v1alpha1.SuperNodeStatus, typ string, status metav1.ConditionStatus, reason string, msg ...string) {
	t.Helper()
	c := meta.FindStatusCondition(st.Conditions, typ)
	if c == nil {
		t.Fatalf("no %s condition in %+v", typ, st.Conditions)
	}
	if c.Status != status || c.Reason != reason || c.ObservedGeneration != 3 {
		t.Errorf("%s: %s %s (generation %d), want %s %s (3)", typ, c.Status, c.Reason, c.ObservedGeneration, status, reason)
	}
	for _, m := range msg {
		if !strings.Contains(c.Message, m) {
			t.Errorf("%s's message %q lacks %q", typ, c.Message, m)
		}
	}
}

// The pools count the Ready members only, once each; a member not Ready
// or deleted makes the super node Degraded, naming it; a deleted member
// stays as Missing, since then; a status computed again from the same
// Nodes is the same status, transition times included.
func TestComputeStatus(t *testing.T) {
	nodes := []corev1.Node{
		member("b", corev1.ConditionTrue, "1Ti", 8, "r1"),
		member("a", corev1.ConditionTrue, "512Gi", 8, "r1"),
		member("c", corev1.ConditionTrue, "512Gi", 0, "r2"),
	}
	st := status(superNode(v1alpha1.SuperNodeStatus{}), nodes)
	if st.Phase != v1alpha1.PhaseReady || st.MemberCount != 3 || st.ReadyCount != 3 || st.NPUs != 16 || st.Memory.String() != "2Ti" {
		t.Fatalf("all Ready: phase %s, %d/%d members, %d NPUs, memory %s; want Ready, 3/3, 16, 2Ti", st.Phase, st.ReadyCount, st.MemberCount, st.NPUs, st.Memory.String())
	}
	if st.Members[0].Name != "a" || st.Members[2].Name != "c" {
		t.Errorf("members not in name order: %+v", st.Members)
	}
	if len(st.Tiers) != 2 || st.Tiers[0].Key != v1alpha1.LabelRack || st.Tiers[0].Groups != 2 {
		t.Errorf("tiers %+v, want 2 racks under one super node", st.Tiers)
	}
	wantCondition(t, st, v1alpha1.ConditionReady, metav1.ConditionTrue, v1alpha1.ReasonAllMembersReady, "all 3")
	wantCondition(t, st, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonAllMembersReady)

	// Level-triggered: the same Nodes give the same status, so the
	// controller writes nothing.
	again := status(superNode(st), nodes)
	if !equality.Semantic.DeepEqual(st, again) {
		t.Errorf("the same Nodes again gave another status:\n%+v\n%+v", st, again)
	}

	// b goes NotReady: Degraded, b named, its memory and NPUs out of the pools.
	before := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady).LastTransitionTime
	nodes[0] = member("b", corev1.ConditionFalse, "1Ti", 8, "r1")
	down := status(superNode(st), nodes)
	if down.Phase != v1alpha1.PhaseDegraded || down.ReadyCount != 2 || down.NPUs != 8 || down.Memory.String() != "1Ti" {
		t.Errorf("b NotReady: phase %s, %d ready, %d NPUs, memory %s; want Degraded, 2, 8, 1Ti", down.Phase, down.ReadyCount, down.NPUs, down.Memory.String())
	}
	if down.Members[1].Health != v1alpha1.MemberNotReady || down.Members[1].Reason != "KubeletFalse" {
		t.Errorf("b: %+v, want NotReady with the Node's reason", down.Members[1])
	}
	wantCondition(t, down, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonMembersNotReady, "2 of 3", "not ready: b")
	wantCondition(t, down, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersNotReady, "not ready: b")

	// c is deleted and a has no Ready condition: c stays, Missing; a is Unknown.
	gone := status(superNode(down), []corev1.Node{member("a", "", "512Gi", 8, "r1"), nodes[0]})
	if gone.MemberCount != 3 || gone.ReadyCount != 0 || gone.Members[2].Health != v1alpha1.MemberMissing || gone.Members[2].Rack != "r2" ||
		gone.Members[2].MissingSince == nil || !gone.Members[2].MissingSince.Equal(&metav1.Time{Time: t0}) || gone.Members[1].MissingSince != nil ||
		gone.Members[0].Health != v1alpha1.MemberUnknown || !gone.Memory.IsZero() || gone.NPUs != 0 {
		t.Errorf("c gone, a Unknown: %+v", gone)
	}
	wantCondition(t, gone, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersMissing, "not ready: a, b", "missing: c")

	// All back: Ready again; a condition whose status did not change
	// keeps its transition time.
	nodes[0] = member("b", corev1.ConditionTrue, "1Ti", 8, "r1")
	back := status(superNode(gone), nodes)
	if back.Phase != v1alpha1.PhaseReady || back.ReadyCount != 3 {
		t.Errorf("all back: phase %s, %d ready", back.Phase, back.ReadyCount)
	}
	stayed := superNode(back)
	stayed.Status.Conditions[0].LastTransitionTime = before
	if c := meta.FindStatusCondition(status(stayed, nodes).Conditions, v1alpha1.ConditionReady); !c.LastTransitionTime.Equal(&before) {
		t.Errorf("an unchanged Ready moved its transition time from %v to %v", before, c.LastTransitionTime)
	}
}

// No members: Empty, neither Ready nor Degraded. A condition names at
// most maxNamed members and how many more.
func TestComputeStatusEmptyAndMany(t *testing.T) {
	st := status(superNode(v1alpha1.SuperNodeStatus{}), nil)
	if st.Phase != v1alpha1.PhaseEmpty || st.MemberCount != 0 || len(st.Tiers) != 0 {
		t.Errorf("no members: %+v", st)
	}
	wantCondition(t, st, v1alpha1.ConditionReady, metav1.ConditionFalse, v1alpha1.ReasonNoMembers, v1alpha1.LabelSuperNode+"=sn")
	wantCondition(t, st, v1alpha1.ConditionDegraded, metav1.ConditionFalse, v1alpha1.ReasonNoMembers)

	var nodes []corev1.Node
	for i := range 30 {
		nodes = append(nodes, member(fmt.Sprintf("n%02d", i), corev1.ConditionFalse, "1Gi", 0, ""))
	}
	st = status(superNode(v1alpha1.SuperNodeStatus{}), nodes)
	wantCondition(t, st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersNotReady, "n00, ", "n19 and 10 more")
	if len(st.Tiers) != 1 || st.Tiers[0].Key != "supernode" {
		t.Errorf("members without racks: tiers %+v, want the super node alone", st.Tiers)
	}
}

// A deleted member is Missing, the super node Degraded, from the first
// status without it until the grace has passed since, the status the
// same all the while and due again when the grace ends; then it is
// dropped and the super node is whole again. A member relabelled to
// another super node is dropped at once, degrading nothing.
func TestComputeStatusMissingGrace(t *testing.T) {
	nodes := []corev1.Node{
		member("a", corev1.ConditionTrue, "1Gi", 0, ""),
		member("b", corev1.ConditionTrue, "1Gi", 0, ""),
		member("c", corev1.ConditionTrue, "1Gi", 0, ""),
	}
	all := status(superNode(v1alpha1.SuperNodeStatus{}), nodes)
	const grace = 2 * time.Minute
	at := t0.Add(300 * time.Millisecond) // saved to the second: t0

	// c relabelled: gone from the status at once.
	moved, next := computeStatus(superNode(all), nodes[:2], map[string]bool{"c": true}, at, grace)
	if moved.Phase != v1alpha1.PhaseReady || moved.MemberCount != 2 || next != 0 {
		t.Errorf("c relabelled: phase %s, %d members, next %v; want Ready, 2, 0", moved.Phase, moved.MemberCount, next)
	}

	// c deleted: Missing since t0.
	gone, next := computeStatus(superNode(all), nodes[:2], nil, at, grace)
	c := gone.Members[2]
	if c.Name != "c" || c.Health != v1alpha1.MemberMissing || c.MissingSince == nil || !c.MissingSince.Time.Equal(t0) {
		t.Fatalf("c deleted: %+v, want Missing since %v", c, t0)
	}
	wantCondition(t, gone, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersMissing, "missing: c")
	if want := grace - 300*time.Millisecond; next != want {
		t.Errorf("c deleted: next %v, want %v (when its grace ends)", next, want)
	}

	// Within the grace: the same status (nothing to write), due when
	// the grace ends.
	later, next := computeStatus(superNode(gone), nodes[:2], nil, t0.Add(grace-time.Second), grace)
	if !equality.Semantic.DeepEqual(gone, later) || next != time.Second {
		t.Errorf("within the grace: next %v, status\n%+v\nwas\n%+v", next, later, gone)
	}

	// The grace over: dropped, Ready with two members, nothing due.
	over, next := computeStatus(superNode(later), nodes[:2], nil, t0.Add(grace), grace)
	if over.Phase != v1alpha1.PhaseReady || over.MemberCount != 2 || next != 0 {
		t.Errorf("the grace over: phase %s, %d members, next %v; want Ready, 2, 0", over.Phase, over.MemberCount, next)
	}

	// c back within the grace: a member again, not Missing since.
	back, next := computeStatus(superNode(gone), nodes, nil, t0.Add(time.Minute), grace)
	if back.Phase != v1alpha1.PhaseReady || back.Members[2].MissingSince != nil || next != 0 {
		t.Errorf("c back: %+v, next %v", back, next)
	}

	// A Missing member of a status that has no time for it (an older
	// controller's) is Missing from now.
	old := gone.DeepCopy()
	old.Members[2].MissingSince = nil
	st, _ := computeStatus(superNode(*old), nodes[:2], nil, t0.Add(time.Hour), grace)
	if m := st.Members[2]; m.Health != v1alpha1.MemberMissing || !m.MissingSince.Time.Equal(t0.Add(time.Hour)) {
		t.Errorf("Missing without a time: %+v, want Missing since %v", m, t0.Add(time.Hour))
	}
}

// Under node churn the Missing members are capped at maxMissing, the
// latest gone kept; what is due next is the earliest kept one's end of
// grace.
func TestComputeStatusMissingCap(t *testing.T) {
	prev := v1alpha1.SuperNodeStatus{}
	for i := range maxMissing + 200 {
		since := metav1.NewTime(t0.Add(time.Duration(i) * time.Second))
		prev.Members = append(prev.Members, v1alpha1.MemberStatus{Name: fmt.Sprintf("n%04d", i), Health: v1alpha1.MemberMissing, MissingSince: &since})
	}
	now := t0.Add(time.Duration(maxMissing+200) * time.Second)
	st, next := computeStatus(superNode(prev), []corev1.Node{member("a", corev1.ConditionTrue, "1Gi", 0, "")}, nil, now, time.Hour)
	if st.MemberCount != maxMissing+1 || st.Members[0].Name != "a" || st.Members[1].Name != "n0200" || st.Members[maxMissing].Name != fmt.Sprintf("n%04d", maxMissing+199) {
		t.Errorf("%d members, from %s, %s to %s; want a and n0200 to n%04d", st.MemberCount, st.Members[0].Name, st.Members[1].Name, st.Members[len(st.Members)-1].Name, maxMissing+199)
	}
	if want := time.Hour - time.Duration(maxMissing)*time.Second; next != want {
		t.Errorf("next %v, want %v (n0200's grace)", next, want)
	}
	wantCondition(t, st, v1alpha1.ConditionDegraded, metav1.ConditionTrue, v1alpha1.ReasonMembersMissing, fmt.Sprintf("and %d more", maxMissing-maxNamed))
}
