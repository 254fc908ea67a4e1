package supernode

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ubkit-io/ubkit/internal/testenv"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
	"github.com/ubkit-io/ubkit/ub/topology"
)

func addExample(t *testing.T, c *k8stest.Cluster, name string, labels map[string]string) *topology.Topology {
	t.Helper()
	topo, err := topology.Example(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddNodes(t.Context(), topo, k8stest.NodeOptions{Labels: labels}); err != nil {
		t.Fatal(err)
	}
	return topo
}

func wantFigures(t *testing.T, sn *v1alpha1.SuperNode, members, ready int32, memory string, npus, gpus, kaes int64) {
	t.Helper()
	st := sn.Status
	if st.MemberCount != members || st.ReadyCount != ready || st.NPUs != npus || st.GPUs != gpus || st.KAEs != kaes {
		t.Errorf("%s: members %d ready %d npus %d gpus %d kaes %d, want %d %d %d %d %d",
			sn.Name, st.MemberCount, st.ReadyCount, st.NPUs, st.GPUs, st.KAEs, members, ready, npus, gpus, kaes)
	}
	if want := resource.MustParse(memory); st.Memory.Cmp(want) != 0 {
		t.Errorf("%s: memory %s, want %s", sn.Name, st.Memory.String(), memory)
	}
}

// hasEvent reports whether an Event with reason was recorded about
// SuperNode name.
func hasEvent(ctx context.Context, c *k8stest.Cluster, name, reason string) (bool, error) {
	evs, err := c.Client().EventsV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
		return e.Regarding.Kind == "SuperNode" && e.Regarding.Name == name && e.Reason == reason
	}), nil
}

// TestSuperNodeLifecycle: from the generated CRD, dev4 and cm384 (48 nodes)
// reconcile to correct statuses; a crashed member degrades its super node,
// named, and recovery clears it, with Events; a deleted member degrades it
// too; a second controller after the first changes nothing.
func TestSuperNodeLifecycle(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	addExample(t, c, "dev4", nil)
	addExample(t, c, "cm384", map[string]string{v1alpha1.LabelUBBandwidth: "392000000000"})
	cl := newClient(t, c.RESTConfig())

	log, rec := testenv.NewLogRecorder()
	stop := startController(t, c.RESTConfig(), Config{Options: Options{Logger: log}})

	dev4 := waitSuperNode(t, cl, "dev4", "Ready", isReady)
	wantFigures(t, dev4, 4, 4, "64Gi", 4, 1, 1)
	if want := []v1alpha1.Tier{{Tier: 1, Key: v1alpha1.LabelRack, Groups: 2}, {Tier: 2, Key: "supernode", Groups: 1}}; !slices.Equal(dev4.Status.Tiers, want) {
		t.Errorf("dev4 tiers %v, want %v", dev4.Status.Tiers, want)
	}
	if dev4.Status.Phase != v1alpha1.PhaseReady || dev4.Status.InterconnectBandwidth != topology.FormatBandwidth(5e9) {
		t.Errorf("dev4: phase %q bandwidth %q", dev4.Status.Phase, dev4.Status.InterconnectBandwidth)
	}
	cm := waitSuperNode(t, cl, "cm384", "Ready", isReady)
	wantFigures(t, cm, 48, 48, "72Ti", 384, 0, 0)
	if want := topology.FormatBandwidth(392e9); cm.Status.InterconnectBandwidth != want {
		t.Errorf("cm384 bandwidth %q, want %q", cm.Status.InterconnectBandwidth, want)
	}
	if len(cm.Status.Tiers) != 2 || cm.Status.Tiers[0].Groups != 12 {
		t.Errorf("cm384 tiers %v, want 12 racks under the super node", cm.Status.Tiers)
	}
	// The Volcano CRD is absent: nothing exported, said at Debug.
	rec.WaitFor(t, "level=DEBUG", "HyperNode CRD is not installed")

	// Member annotations: which pools, not the pools again.
	poll(t, "member annotations", func(ctx context.Context) (bool, error) {
		n := &corev1.Node{}
		if err := cl.Get(ctx, client.ObjectKey{Name: "cm384-node07"}, n); err != nil {
			return false, err
		}
		a := n.Annotations
		return a[v1alpha1.AnnotationMemory] == "cm384" && a[v1alpha1.AnnotationGPUPool] == "cm384" &&
			a[v1alpha1.AnnotationInterconnectBandwidth] == cm.Status.InterconnectBandwidth, nil
	})

	// Crash and recovery.
	if _, err := c.CrashNode(t.Context(), "dev4-n1"); err != nil {
		t.Fatal(err)
	}
	dev4 = waitSuperNode(t, cl, "dev4", "Degraded naming dev4-n1", degradedNaming("dev4-n1"))
	wantFigures(t, dev4, 4, 3, "56Gi", 2, 1, 1)
	if d := condition(dev4, v1alpha1.ConditionDegraded); d.Reason != v1alpha1.ReasonMembersNotReady {
		t.Errorf("Degraded reason %q, want %q", d.Reason, v1alpha1.ReasonMembersNotReady)
	}
	poll(t, "a Degraded Event", func(ctx context.Context) (bool, error) { return hasEvent(ctx, c, "dev4", EventDegraded) })
	if _, err := c.RecoverNode(t.Context(), "dev4-n1"); err != nil {
		t.Fatal(err)
	}
	dev4 = waitSuperNode(t, cl, "dev4", "Ready again", isReady)
	wantFigures(t, dev4, 4, 4, "64Gi", 4, 1, 1)
	poll(t, "a Recovered Event", func(ctx context.Context) (bool, error) { return hasEvent(ctx, c, "dev4", EventRecovered) })

	// Deletion.
	if err := c.Client().CoreV1().Nodes().Delete(t.Context(), "dev4-n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	dev4 = waitSuperNode(t, cl, "dev4", "Degraded naming the deleted dev4-n3", degradedNaming("dev4-n3"))
	wantFigures(t, dev4, 4, 3, "32Gi", 4, 1, 0)
	if d := condition(dev4, v1alpha1.ConditionDegraded); d.Reason != v1alpha1.ReasonMembersMissing {
		t.Errorf("Degraded reason %q, want %q", d.Reason, v1alpha1.ReasonMembersMissing)
	}
	if got := testutil.ToFloat64(membersByHealth.WithLabelValues("dev4", string(v1alpha1.MemberMissing))); got != 1 {
		t.Errorf("ubkit_supernode_members{supernode=dev4,health=Missing} = %v, want 1", got)
	}

	// Restart: a new controller reconciles both and writes nothing.
	restartWritesNothing(t, c.RESTConfig(), stop, Config{}, false)
}

// restartWritesNothing stops the running controller with stop, notes the
// resourceVersions of the SuperNodes, of their member Nodes and, if
// hyperNodes, of the HyperNodes, and starts another controller on cfg
// with c. It waits until that one has reconciled every SuperNode (its
// log says so, SuperNode by SuperNode) and fails if one of them says it
// wrote something or one of the objects has changed.
func restartWritesNothing(t *testing.T, cfg *rest.Config, stop func(), c Config, hyperNodes bool) {
	t.Helper()
	cl := newClient(t, cfg)
	stop()
	before := resourceVersions(t, cl, hyperNodes)
	var sns v1alpha1.SuperNodeList
	if err := cl.List(t.Context(), &sns); err != nil {
		t.Fatal(err)
	}
	if len(sns.Items) == 0 {
		t.Fatal("no SuperNodes to restart on")
	}
	log, rec := testenv.NewLogRecorder()
	c.Logger = log
	startController(t, cfg, c)
	reconciled := func(name string) []string {
		var ls []string
		for _, l := range rec.Lines() {
			if strings.Contains(l, `msg="supernode: reconciled"`) && strings.Contains(l, " supernode="+name+" ") {
				ls = append(ls, l)
			}
		}
		return ls
	}
	for _, sn := range sns.Items {
		poll(t, "the second controller's reconcile of "+sn.Name, func(context.Context) (bool, error) { return len(reconciled(sn.Name)) > 0, nil })
		for _, l := range reconciled(sn.Name) {
			if !strings.Contains(l, " wrote=0 ") {
				t.Errorf("after a restart: %s", l)
			}
		}
	}
	after := resourceVersions(t, cl, hyperNodes)
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if before[k] != after[k] {
			t.Errorf("%s changed by a restart: resourceVersion %s, then %s", k, before[k], after[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if _, ok := before[k]; !ok {
			t.Errorf("%s made by a restart", k)
		}
	}
}

// resourceVersions are those of the SuperNodes, of their member Nodes
// and, if hyperNodes, of the HyperNodes, by kind and name.
func resourceVersions(t *testing.T, cl client.Client, hyperNodes bool) map[string]string {
	t.Helper()
	ctx := t.Context()
	m := map[string]string{}
	var sns v1alpha1.SuperNodeList
	if err := cl.List(ctx, &sns); err != nil {
		t.Fatal(err)
	}
	for _, sn := range sns.Items {
		m["SuperNode "+sn.Name] = sn.ResourceVersion
	}
	var nodes corev1.NodeList
	if err := cl.List(ctx, &nodes, client.HasLabels{v1alpha1.LabelSuperNode}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		m["Node "+n.Name] = n.ResourceVersion
	}
	if hyperNodes {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(HyperNodeGVK.GroupVersion().WithKind("HyperNodeList"))
		if err := cl.List(ctx, list); err != nil {
			t.Fatal(err)
		}
		for _, u := range list.Items {
			m["HyperNode "+u.GetName()] = u.GetResourceVersion()
		}
		if len(list.Items) == 0 {
			t.Fatal("no HyperNodes to compare")
		}
	}
	return m
}

// TestDepartedMembers: a member relabelled to another super node leaves
// its old SuperNode at once, degrading nothing, and joins the new one,
// its annotations the new one's; a deleted member makes its SuperNode
// Degraded, Missing, and is dropped when the grace (short here) has
// passed, the SuperNode Ready again without it, with no other change to
// queue the reconcile that drops it; members unlabelled or relabelled to
// an id that cannot name a SuperNode lose their old SuperNode's
// annotations.
func TestDepartedMembers(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	addExample(t, c, "dev4", nil)
	cl := newClient(t, c.RESTConfig())
	// The default grace first (10 minutes, longer than the wait): a
	// relabelled member treated as Missing would stay so.
	stop := startController(t, c.RESTConfig(), Config{})
	waitSuperNode(t, cl, "dev4", "Ready", isReady)

	ctx := t.Context()
	patch := []byte(`{"metadata":{"labels":{"` + v1alpha1.LabelSuperNode + `":"other"}}}`)
	if _, err := c.Client().CoreV1().Nodes().Patch(ctx, "dev4-n0", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	members := func(names ...string) func(*v1alpha1.SuperNode) bool {
		return func(sn *v1alpha1.SuperNode) bool {
			var have []string
			for _, m := range sn.Status.Members {
				have = append(have, m.Name)
			}
			return slices.Equal(have, names)
		}
	}
	dev4 := waitSuperNode(t, cl, "dev4", "without the relabelled dev4-n0", members("dev4-n1", "dev4-n2", "dev4-n3"))
	if !isReady(dev4) || dev4.Status.MemberCount != 3 {
		t.Errorf("dev4 after a member was relabelled: %+v, want Ready with 3 members", dev4.Status)
	}
	other := waitSuperNode(t, cl, "other", "with dev4-n0", members("dev4-n0"))
	// Its annotations say other, not dev4.
	annotatedFor(t, cl, "dev4-n0", other)

	// A short grace now.
	stop()
	const grace = 3 * time.Second
	startController(t, c.RESTConfig(), Config{Options: Options{MissingGrace: grace}})

	if err := c.Client().CoreV1().Nodes().Delete(ctx, "dev4-n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	dev4 = waitSuperNode(t, cl, "dev4", "Degraded, dev4-n3 Missing", degradedNaming("dev4-n3"))
	m := dev4.Status.Members[2]
	if m.Name != "dev4-n3" || m.Health != v1alpha1.MemberMissing || m.MissingSince == nil {
		t.Fatalf("the deleted member: %+v, want dev4-n3 Missing since a time", m)
	}
	dev4 = waitSuperNode(t, cl, "dev4", "Ready without dev4-n3 once its grace is over", func(sn *v1alpha1.SuperNode) bool {
		return isReady(sn) && members("dev4-n1", "dev4-n2")(sn)
	})
	if ready := condition(dev4, v1alpha1.ConditionReady).LastTransitionTime; ready.Time.Before(m.MissingSince.Add(grace)) {
		t.Errorf("dev4-n3, Missing since %v, dropped at %v: before its grace of %v", m.MissingSince, ready, grace)
	}

	// Unlabelled, and relabelled to an id no SuperNode can have: no
	// SuperNode's annotations are left.
	annotatedFor(t, cl, "dev4-n1", dev4)
	annotatedFor(t, cl, "dev4-n2", dev4)
	for name, patch := range map[string]string{
		"dev4-n1": `{"metadata":{"labels":{"` + v1alpha1.LabelSuperNode + `":null}}}`,
		"dev4-n2": `{"metadata":{"labels":{"` + v1alpha1.LabelSuperNode + `":"Bad_ID"}}}`,
	} {
		if _, err := c.Client().CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitSuperNode(t, cl, "dev4", "without members", members())
	annotatedFor(t, cl, "dev4-n1", nil)
	annotatedFor(t, cl, "dev4-n2", nil)
	annotatedFor(t, cl, "dev4-n0", other)

	// The apiserver refuses the release of annotations that changed
	// since they were read (as Invalid, which release takes to mean
	// they are another SuperNode's now), changing nothing.
	n0 := &corev1.Node{}
	if err := cl.Get(ctx, client.ObjectKey{Name: "dev4-n0"}, n0); err != nil {
		t.Fatal(err)
	}
	stale := n0.DeepCopy()
	stale.Annotations[v1alpha1.AnnotationMemory] = "dev4"
	err := cl.Patch(ctx, n0.DeepCopy(), client.RawPatch(types.JSONPatchType, releasePatch("dev4", stale)))
	if !apierrors.IsInvalid(err) {
		t.Errorf("releasing annotations that changed since: %v, want Invalid", err)
	}
	annotatedFor(t, cl, "dev4-n0", other)
}

// annotatedFor waits until Node name has the annotations of SuperNode sn
// as its status is, and none of another; with sn nil, none at all.
func annotatedFor(t *testing.T, cl client.Client, name string, sn *v1alpha1.SuperNode) {
	t.Helper()
	what := "no SuperNode's annotations"
	if sn != nil {
		what = sn.Name + "'s annotations"
	}
	n := &corev1.Node{}
	poll(t, "node "+name+" with "+what, func(ctx context.Context) (bool, error) {
		if err := cl.Get(ctx, client.ObjectKey{Name: name}, n); err != nil {
			return false, err
		}
		if sn == nil {
			return !annotationsDiffer(n, nil), nil
		}
		return !annotationsDiffer(n, memberAnnotations(sn.Name, &sn.Status, n)), nil
	})
}
