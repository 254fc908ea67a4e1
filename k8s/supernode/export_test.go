package supernode

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

// TestHyperNodeExport: with Volcano's HyperNode CRD installed, dev4 is
// exported as a rack tier under a super node tier, and a member's
// deletion shrinks its rack; racks R1, r1 and rack_a each get a HyperNode
// of their own; HyperNodes deleted or edited by hand are put right at
// once (the watch), one whose labels were removed by hand adopted again;
// super node pair's rack b and super node pair-b each get theirs; a
// restarted controller changes none.
func TestHyperNodeExport(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	installCRD(t, c.RESTConfig(), hyperNodeCRD)
	addExample(t, c, "dev4", nil)
	cl := newClient(t, c.RESTConfig())
	stop := startController(t, c.RESTConfig(), Config{})
	waitSuperNode(t, cl, "dev4", "Ready", isReady)

	want := dev4HyperNodes()
	poll(t, "the HyperNodes of dev4", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })
	// The watch of the HyperNodes (the resync is 5 minutes).
	tamper(t, cl, want)

	// One of them, its labels removed by hand: the SuperNode's still
	// (its controller reference), labelled again.
	stripLabels(t, cl, want)

	if err := c.Client().CoreV1().Nodes().Delete(t.Context(), "dev4-n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want[dev4R1] = hyperNodeShape{1, "Node", []string{"dev4-n2"}}
	poll(t, "rack r1's HyperNode without the deleted node", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })

	// Racks R1, r1 and rack_a (label values a name cannot all be): a
	// HyperNode each, none refused, none shared.
	racks := map[string]string{"racks-0": "R1", "racks-1": "r1", "racks-2": "rack_a"}
	var rackHNs []string
	for _, name := range slices.Sorted(maps.Keys(racks)) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelSuperNode: "racks", v1alpha1.LabelRack: racks[name]}}}
		if err := cl.Create(t.Context(), n); err != nil {
			t.Fatal(err)
		}
		hn := rackHyperNodeName("racks", racks[name])
		rackHNs = append(rackHNs, hn)
		want[hn] = hyperNodeShape{1, "Node", []string{name}}
	}
	slices.Sort(rackHNs)
	want["racks"] = hyperNodeShape{2, "HyperNode", rackHNs}
	if len(want) != 3+4 {
		t.Fatalf("the racks' HyperNodes %v: want four in all", slices.Sorted(maps.Keys(want)))
	}
	waitSuperNode(t, cl, "racks", "with its 3 members", func(sn *v1alpha1.SuperNode) bool { return sn.Status.MemberCount == 3 })
	poll(t, "a HyperNode for each of racks R1, r1 and rack_a", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })

	// Super node pair's rack b and super node pair-b, whose HyperNode is
	// pair-b (<super node>-<rack> for both, once): a HyperNode each.
	for name, labels := range map[string]map[string]string{
		"pair-0":   {v1alpha1.LabelSuperNode: "pair", v1alpha1.LabelRack: "b"},
		"pair-b-0": {v1alpha1.LabelSuperNode: "pair-b"},
	} {
		if err := cl.Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil {
			t.Fatal(err)
		}
	}
	pairB := rackHyperNodeName("pair", "b")
	want["pair"] = hyperNodeShape{2, "HyperNode", []string{pairB}}
	want[pairB] = hyperNodeShape{1, "Node", []string{"pair-0"}}
	want["pair-b"] = hyperNodeShape{1, "Node", []string{"pair-b-0"}}
	poll(t, "HyperNodes for super node pair's rack b and for super node pair-b", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })

	// A restart touches no SuperNode, Node or HyperNode.
	restartWritesNothing(t, c.RESTConfig(), stop, Config{}, true)
}

// TestHyperNodeResync: a Volcano installed after the controller started
// is found, and its HyperNodes, which the controller does not watch then,
// are put right when deleted or edited by hand, by the resync (short
// here) and nothing else.
func TestHyperNodeResync(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	addExample(t, c, "dev4", nil)
	cl := newClient(t, c.RESTConfig())
	startController(t, c.RESTConfig(), Config{Options: Options{Resync: 500 * time.Millisecond}})
	waitSuperNode(t, cl, "dev4", "Ready", isReady)

	installCRD(t, c.RESTConfig(), hyperNodeCRD)
	want := dev4HyperNodes()
	poll(t, "the HyperNodes of dev4, Volcano installed later", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })
	tamper(t, cl, want)
}

// dev4R0 and dev4R1 are the HyperNodes of dev4's racks.
var (
	dev4R0 = rackHyperNodeName("dev4", "r0")
	dev4R1 = rackHyperNodeName("dev4", "r1")
)

// dev4HyperNodes are dev4's HyperNodes, all its nodes there.
func dev4HyperNodes() map[string]hyperNodeShape {
	return map[string]hyperNodeShape{
		"dev4": {2, "HyperNode", []string{dev4R0, dev4R1}},
		dev4R0: {1, "Node", []string{"dev4-n0", "dev4-n1"}},
		dev4R1: {1, "Node", []string{"dev4-n2", "dev4-n3"}},
	}
}

// stripLabels removes by hand the labels of rack r0's HyperNode, which
// say it is dev4's, and waits until the controller, finding dev4's
// controller reference on it, has labelled it again.
func stripLabels(t *testing.T, cl client.Client, want map[string]hyperNodeShape) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(HyperNodeGVK)
	if err := cl.Get(t.Context(), client.ObjectKey{Name: dev4R0}, u); err != nil {
		t.Fatal(err)
	}
	u.SetLabels(nil)
	if err := cl.Update(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	poll(t, dev4R0+", its labels removed by hand, labelled again", func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, client.ObjectKey{Name: dev4R0}, u); err != nil {
			return false, err
		}
		l := u.GetLabels()
		ok, err := hyperNodesAre(ctx, cl, want)
		return ok && l[v1alpha1.LabelSuperNode] == "dev4" && l[labelManagedBy] == managerName, err
	})
}

// tamper deletes rack r0's HyperNode and edits dev4's tier, by hand, and
// waits until the controller has made them what they should be again:
// r0's a new object.
func tamper(t *testing.T, cl client.Client, want map[string]hyperNodeShape) {
	t.Helper()
	ctx := t.Context()
	get := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(HyperNodeGVK)
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	r0 := get(dev4R0)
	if err := cl.Delete(ctx, r0); err != nil {
		t.Fatal(err)
	}
	poll(t, dev4R0+", deleted by hand, made again", func(ctx context.Context) (bool, error) {
		ok, err := hyperNodesAre(ctx, cl, want)
		return ok && get(dev4R0).GetUID() != r0.GetUID(), err
	})
	top := get("dev4")
	if err := unstructured.SetNestedField(top.Object, int64(3), "spec", "tier"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Update(ctx, top); err != nil {
		t.Fatal(err)
	}
	poll(t, "dev4's tier, edited by hand, put back", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })
}

type hyperNodeShape struct {
	tier       int64
	memberType string
	members    []string
}

func hyperNodesAre(ctx context.Context, cl client.Client, want map[string]hyperNodeShape) (bool, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(HyperNodeGVK.GroupVersion().WithKind("HyperNodeList"))
	if err := cl.List(ctx, list); err != nil {
		return false, err
	}
	got := map[string]hyperNodeShape{}
	for _, u := range list.Items {
		tier, _, _ := unstructured.NestedInt64(u.Object, "spec", "tier")
		ms, _, _ := unstructured.NestedSlice(u.Object, "spec", "members")
		s := hyperNodeShape{tier: tier}
		for _, m := range ms {
			mm, _ := m.(map[string]any)
			typ, _, _ := unstructured.NestedString(mm, "type")
			name, _, _ := unstructured.NestedString(mm, "selector", "exactMatch", "name")
			s.memberType = typ
			s.members = append(s.members, name)
		}
		got[u.GetName()] = s
	}
	if len(got) != len(want) {
		return false, nil
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || g.tier != w.tier || g.memberType != w.memberType || !slices.Equal(g.members, w.members) {
			return false, nil
		}
	}
	return true, nil
}
