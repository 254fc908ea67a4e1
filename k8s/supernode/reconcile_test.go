package supernode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ubkit-io/ubkit/internal/testenv"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

// fakeReconciler is a Reconciler on controller-runtime's fake client,
// with funcs intercepting its calls, holding objs; it exports no
// HyperNodes.
func fakeReconciler(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) (*Reconciler, *events.FakeRecorder, client.Client) {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.SuperNode{}).
		WithIndex(&corev1.Node{}, nodeIndex, superNodeOf).WithIndex(&corev1.Node{}, poolIndex, poolOf).WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
	rec := events.NewFakeRecorder(100)
	log, _ := testenv.NewLogRecorder()
	return &Reconciler{client: c, reader: c, recorder: rec, log: log, noHyper: true, grace: DefaultMissingGrace, now: time.Now}, rec, c
}

// recorded drains the Events rec has recorded.
func recorded(rec *events.FakeRecorder) []string {
	var evs []string
	for {
		select {
		case e := <-rec.Events:
			evs = append(evs, e)
		default:
			return evs
		}
	}
}

var snKey = reconcile.Request{NamespacedName: client.ObjectKey{Name: "sn"}}

// A status update that fails, by a conflict or otherwise, records no
// Event: nothing changed. The update that succeeds records the
// transition once, and a reconcile after it none.
func TestNoEventUnlessStatusSaved(t *testing.T) {
	nodes := []corev1.Node{
		member("a", corev1.ConditionTrue, "1Gi", 0, ""),
		member("b", corev1.ConditionTrue, "1Gi", 0, ""),
	}
	sn := superNode(status(superNode(v1alpha1.SuperNodeStatus{}), nodes))
	sn.Generation = 0
	b := member("b", corev1.ConditionFalse, "1Gi", 0, "")
	failures := []error{
		apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "supernodes"}, "sn", errors.New("the object has been modified")),
		errors.New("the apiserver is unavailable"),
	}
	updates := 0
	r, rec, _ := fakeReconciler(t, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			updates++
			if len(failures) > 0 {
				err := failures[0]
				failures = failures[1:]
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}, sn, &nodes[0], &b)

	for i := range 2 {
		if _, err := r.Reconcile(t.Context(), snKey); err == nil {
			t.Fatalf("reconcile %d: no error from a failed status update", i+1)
		}
		if evs := recorded(rec); len(evs) > 0 {
			t.Errorf("reconcile %d: the status update failed, yet Events were recorded: %q", i+1, evs)
		}
	}
	if _, err := r.Reconcile(t.Context(), snKey); err != nil {
		t.Fatal(err)
	}
	if evs := recorded(rec); len(evs) != 1 || !strings.HasPrefix(evs[0], corev1.EventTypeWarning+" "+EventDegraded+" ") {
		t.Errorf("the status saved: Events %q, want one Degraded", evs)
	}
	if _, err := r.Reconcile(t.Context(), snKey); err != nil {
		t.Fatal(err)
	}
	if evs := recorded(rec); len(evs) > 0 {
		t.Errorf("nothing changed, yet Events %q", evs)
	}
	if updates != 3 {
		t.Errorf("%d status updates, want 3 (two failed, one saved, none when unchanged)", updates)
	}
}

// A HyperNode export that fails does not keep the status, or its Event,
// from being saved: the reconcile says the export's error, after both.
func TestStatusDespiteExportError(t *testing.T) {
	nodes := []corev1.Node{
		member("a", corev1.ConditionTrue, "1Gi", 0, "r1"),
		member("b", corev1.ConditionFalse, "1Gi", 0, "r1"),
	}
	sn := &v1alpha1.SuperNode{ObjectMeta: metav1.ObjectMeta{Name: "sn"}, Spec: v1alpha1.SuperNodeSpec{ID: "sn"}}
	exportErr := errors.New("the HyperNode webhook is down")
	r, rec, c := fakeReconciler(t, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*unstructured.UnstructuredList); ok {
				return nil // no HyperNodes yet
			}
			return c.List(ctx, list, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*unstructured.Unstructured); ok {
				return exportErr
			}
			return c.Create(ctx, obj, opts...)
		},
	}, sn, &nodes[0], &nodes[1])
	r.noHyper = false
	now := time.Now()
	r.hyper = &hyperNodeProbe{now: func() time.Time { return now }, recheck: time.Hour, checked: now, served: true}

	_, err := r.Reconcile(t.Context(), snKey)
	if !errors.Is(err, exportErr) {
		t.Fatalf("reconcile: %v, want the export's error", err)
	}
	got := &v1alpha1.SuperNode{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: "sn"}, got); err != nil {
		t.Fatal(err)
	}
	if !degradedNaming("b")(got) || got.Status.MemberCount != 2 {
		t.Errorf("the status despite the export's failure: %+v", got.Status)
	}
	if evs := recorded(rec); len(evs) != 1 || !strings.Contains(evs[0], EventDegraded) {
		t.Errorf("Events %q, want one Degraded", evs)
	}
}

// validHyperNodeName says what is wrong with a HyperNode name: it must
// be a DNS-1123 subdomain (an object's name) and a qualified name, as
// Volcano checks HyperNode names and exactMatch member names, so at most
// 63 characters.
func validHyperNodeName(name string) []string {
	return append(validation.IsDNS1123Subdomain(name), validation.IsQualifiedName(name)...)
}

// Racks whose labels differ only in case or in characters a name cannot
// have get HyperNodes of their own, each name <sn>-<rack>-<8 hex>, a
// DNS-1123 subdomain and qualified name of at most 63 characters,
// however long the super node's name and the rack.
func TestRackHyperNodeNames(t *testing.T) {
	sn := &v1alpha1.SuperNode{ObjectMeta: metav1.ObjectMeta{Name: "sn"}}
	racks := []string{"R1", "r1", "rack_a", "rack-a", "Rack.A", "a..b", "a_.b", strings.Repeat("X", 63), strings.Repeat("x", 62) + "1", strings.Repeat("x", 62) + "2"}
	var nodes []corev1.Node
	for i, rack := range racks {
		nodes = append(nodes, member(fmt.Sprintf("n%d", i), corev1.ConditionTrue, "1Gi", 0, rack))
	}
	hns := desiredHyperNodes(sn, nodes)
	if len(hns) != len(racks)+1 {
		t.Fatalf("%d HyperNodes for %d racks, want one per rack and the super node's", len(hns), len(racks))
	}
	byMember := map[string]string{}
	names := map[string]bool{}
	for _, hn := range hns {
		name := hn.GetName()
		if errs := validHyperNodeName(name); len(errs) > 0 {
			t.Errorf("HyperNode %q: %v", name, errs)
		}
		if names[name] {
			t.Errorf("two HyperNodes named %q", name)
		}
		names[name] = true
		ms, _, _ := unstructured.NestedSlice(hn.Object, "spec", "members")
		for _, m := range ms {
			n, _, _ := unstructured.NestedString(m.(map[string]any), "selector", "exactMatch", "name")
			byMember[n] = name
		}
	}
	for i, rack := range racks {
		if got := byMember[fmt.Sprintf("n%d", i)]; got != rackHyperNodeName("sn", rack) {
			t.Errorf("rack %q's node in HyperNode %q, want %q", rack, got, rackHyperNodeName("sn", rack))
		}
	}
	hash := regexp.MustCompile(`^sn-r1-[0-9a-f]{8}$`)
	if r1, R1 := rackHyperNodeName("sn", "r1"), rackHyperNodeName("sn", "R1"); !hash.MatchString(r1) || !hash.MatchString(R1) || r1 == R1 {
		t.Errorf("racks r1 and R1: %q and %q, want sn-r1- and 8 hex digits, not the same", r1, R1)
	}
	top := hns[len(hns)-1]
	if ms, _, _ := unstructured.NestedSlice(top.Object, "spec", "members"); top.GetName() != "sn" || len(ms) != len(racks) {
		t.Errorf("the super node's HyperNode is %q with %d members, want sn over the %d racks", top.GetName(), len(ms), len(racks))
	}

	// The longest names: cut, valid, distinct.
	long := strings.Repeat("s", 30) + "." + strings.Repeat("t", 32) // 63, a '.' where the cut comes
	seen := map[string]string{}
	for _, sn := range []string{long, strings.Repeat("s", 63), strings.Repeat("s", 53) + "-" + strings.Repeat("s", 9)} {
		for _, rack := range []string{"a", strings.Repeat("R", 63), strings.Repeat("R", 62) + "S"} {
			name := rackHyperNodeName(sn, rack)
			if errs := validHyperNodeName(name); len(errs) > 0 {
				t.Errorf("super node %q rack %q: HyperNode %q: %v", sn, rack, name, errs)
			}
			if prev, ok := seen[name]; ok {
				t.Errorf("super node %q rack %q: HyperNode %q, as %s", sn, rack, name, prev)
			}
			seen[name] = sn + " rack " + rack
		}
	}
}

// A rack's HyperNode is no other super node's: not that of super node
// <sn>-<rack> (a's rack b and SuperNode a-b; a's rack b-c, a-b's rack c
// and SuperNode a-b-c), nor of another super node's rack that
// <sn>-<rack> would give too (a's rack b-c and a-b's rack c).
func TestHyperNodeNamesAcrossSuperNodes(t *testing.T) {
	names := map[string]string{}
	for _, c := range []struct {
		sn    string
		racks []string // none: unracked
	}{
		{"a", []string{"b", "b-c"}},
		{"a-b", []string{"c"}},
		{"a-b-c", nil},
	} {
		var nodes []corev1.Node
		for i, rack := range append(c.racks, "")[:max(len(c.racks), 1)] {
			nodes = append(nodes, member(fmt.Sprintf("%s-%d", c.sn, i), corev1.ConditionTrue, "1Gi", 0, rack))
		}
		sn := &v1alpha1.SuperNode{ObjectMeta: metav1.ObjectMeta{Name: c.sn}}
		for _, hn := range desiredHyperNodes(sn, nodes) {
			owner := fmt.Sprintf("%s %v", c.sn, c.racks)
			if prev, ok := names[hn.GetName()]; ok && prev != owner {
				t.Errorf("HyperNode %q of super node %s and of %s", hn.GetName(), owner, prev)
			}
			names[hn.GetName()] = owner
		}
	}
}

// ignoredEvents is ubkit_supernode_ignored_node_events_total as
// controller-runtime's registry, which the metrics endpoint serves, has it.
func ignoredEvents(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "ubkit_supernode_ignored_node_events_total" {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no ubkit_supernode_ignored_node_events_total in the registry")
	return 0
}

// nodeEvents feeds events to r's Node handler and returns what they
// queued.
type nodeEvents struct {
	t *testing.T
	h handler.EventHandler
	q workqueue.TypedRateLimitingInterface[reconcile.Request]
}

func newNodeEvents(t *testing.T, r *Reconciler) *nodeEvents {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	t.Cleanup(q.ShutDown)
	return &nodeEvents{t: t, h: r.nodeHandler(), q: q}
}

// queued drains the queue: the SuperNodes queued, sorted.
func (e *nodeEvents) queued() []string {
	var names []string
	for e.q.Len() > 0 {
		req, _ := e.q.Get()
		names = append(names, req.Name)
		e.q.Forget(req)
		e.q.Done(req)
	}
	slices.Sort(names)
	return names
}

func (e *nodeEvents) create(n *corev1.Node) []string {
	e.h.Create(e.t.Context(), event.CreateEvent{Object: n}, e.q)
	return e.queued()
}

func (e *nodeEvents) update(old, n *corev1.Node) []string {
	e.h.Update(e.t.Context(), event.UpdateEvent{ObjectOld: old, ObjectNew: n}, e.q)
	return e.queued()
}

func (e *nodeEvents) delete(n *corev1.Node) []string {
	e.h.Delete(e.t.Context(), event.DeleteEvent{Object: n}, e.q)
	return e.queued()
}

func labelledNode(name, id string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if id != "" {
		n.Labels = map[string]string{v1alpha1.LabelSuperNode: id}
	}
	return n
}

// A super node id that is a label value but cannot name a SuperNode
// queues nothing, is logged once however many Nodes and events carry it,
// and every event it costs is counted; the ids remembered are bounded.
func TestInvalidIDs(t *testing.T) {
	r, _, _ := fakeReconciler(t, interceptor.Funcs{})
	log, logged := testenv.NewLogRecorder()
	r.log = log
	ev := newNodeEvents(t, r)
	before := ignoredEvents(t)
	for _, n := range []*corev1.Node{labelledNode("a", "Rack_A"), labelledNode("a", "Rack_A"), labelledNode("b", "Rack_A"), labelledNode("c", "cm384.")} {
		if q := ev.create(n); len(q) != 0 {
			t.Errorf("%s (id %q) queued %v", n.Name, n.Labels[v1alpha1.LabelSuperNode], q)
		}
	}
	if q := ev.create(labelledNode("d", "cm384")); !slices.Equal(q, []string{"cm384"}) {
		t.Errorf("a valid id queued %v, want cm384", q)
	}
	if q := ev.create(&corev1.Node{}); len(q) != 0 {
		t.Errorf("a Node without the label queued %v", q)
	}
	if got := ignoredEvents(t) - before; got != 4 {
		t.Errorf("ubkit_supernode_ignored_node_events_total rose by %v, want 4", got)
	}
	lines := logged.Lines()
	if len(lines) != 2 || !strings.Contains(lines[0], "id=Rack_A") || !strings.Contains(lines[1], "id=cm384.") || !strings.Contains(lines[0], "level=WARN") {
		t.Errorf("logged %q, want a warning for each of Rack_A and cm384.", lines)
	}

	for i := range maxReportedIDs + 10 {
		ev.create(labelledNode("n", fmt.Sprintf("ID%d", i)))
	}
	if n := len(r.invalid.seen); n != maxReportedIDs {
		t.Errorf("%d invalid ids remembered, want at most %d", n, maxReportedIDs)
	}
	if lines := logged.Lines(); len(lines) != maxReportedIDs+1 || !strings.Contains(lines[len(lines)-1], "further ones are not") {
		t.Errorf("%d lines logged, the last %q; want %d, the last saying no more are logged", len(lines), lines[len(lines)-1], maxReportedIDs+1)
	}
}

// A Node event carrying an invalid id is counted once: an update, whose
// old and new Node both carry it (or each one of its own), as one; and
// the valid id of the other side of an update is still queued.
func TestInvalidIDsCountedOncePerEvent(t *testing.T) {
	r, _, _ := fakeReconciler(t, interceptor.Funcs{})
	ev := newNodeEvents(t, r)
	for _, tc := range []struct {
		what     string
		old, new string // ids; "" none
		queued   []string
		counted  float64
	}{
		{"update, both invalid", "Rack_A", "Rack_A", nil, 1},
		{"update, each invalid", "Rack_A", "Rack_B", nil, 1},
		{"update from a valid id", "sn", "Rack_A", []string{"sn"}, 1},
		{"update to a valid id", "Rack_A", "sn", []string{"sn"}, 1},
		{"update, both valid", "sn", "other", []string{"other", "sn"}, 0},
		{"update, no id", "", "", nil, 0},
	} {
		before := ignoredEvents(t)
		if q := ev.update(labelledNode("a", tc.old), labelledNode("a", tc.new)); !slices.Equal(q, tc.queued) {
			t.Errorf("%s: queued %v, want %v", tc.what, q, tc.queued)
		}
		if got := ignoredEvents(t) - before; got != tc.counted {
			t.Errorf("%s: ubkit_supernode_ignored_node_events_total rose by %v, want %v", tc.what, got, tc.counted)
		}
	}
	before := ignoredEvents(t)
	ev.delete(labelledNode("a", "Rack_A"))
	if got := ignoredEvents(t) - before; got != 1 {
		t.Errorf("a delete: rose by %v, want 1", got)
	}
}

// memberSeries is how many ubkit_supernode_members series the registry
// has for SuperNode name.
func memberSeries(t *testing.T, name string) int {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		if f.GetName() != "ubkit_supernode_members" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "supernode" && l.GetValue() == name {
					n++
				}
			}
		}
	}
	return n
}

// A SuperNode's ubkit_supernode_members series go when it is deleted:
// while it is being deleted (a finalizer holding it), and once it is gone
// with its Nodes.
func TestMemberSeriesDeleted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		finalizer bool
	}{{"series-gone", false}, {"series-ending", true}} {
		n := member(tc.name+"-0", corev1.ConditionTrue, "1Gi", 0, "")
		n.Labels[v1alpha1.LabelSuperNode] = tc.name
		r, _, c := fakeReconciler(t, interceptor.Funcs{}, &n)
		ctx := t.Context()
		req := reconcile.Request{NamespacedName: client.ObjectKey{Name: tc.name}}
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		if got := memberSeries(t, tc.name); got != 4 {
			t.Fatalf("%s: %d series, want one per health", tc.name, got)
		}
		sn := &v1alpha1.SuperNode{}
		if err := c.Get(ctx, req.NamespacedName, sn); err != nil {
			t.Fatal(err)
		}
		if tc.finalizer {
			sn.Finalizers = []string{"example.com/hold"}
			if err := c.Update(ctx, sn); err != nil {
				t.Fatal(err)
			}
		} else if err := c.Delete(ctx, &n); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
		if got := memberSeries(t, tc.name); got != 0 {
			t.Errorf("%s deleted (finalizer %v): %d series left", tc.name, tc.finalizer, got)
		}
	}
}

// A SuperNode that the apiserver has but the cache does not yet (just
// made, a Node's event queuing it again) is no error: the reconcile
// asks to run again shortly, counted as a requeue, logging no error.
func TestCreateAlreadyExists(t *testing.T) {
	n := member("a", corev1.ConditionTrue, "1Gi", 0, "")
	creates := 0
	r, _, _ := fakeReconciler(t, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*v1alpha1.SuperNode); ok {
				creates++
				return apierrors.NewAlreadyExists(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "supernodes"}, obj.GetName())
			}
			return c.Create(ctx, obj, opts...)
		},
	}, &n)
	log, logged := testenv.NewLogRecorder()
	r.log = log
	errors0 := testutil.ToFloat64(reconcilesTotal.WithLabelValues("error"))
	requeues0 := testutil.ToFloat64(reconcilesTotal.WithLabelValues("requeue"))
	res, err := r.Reconcile(t.Context(), snKey)
	if err != nil || res.RequeueAfter <= 0 || res.RequeueAfter > time.Second || creates != 1 {
		t.Errorf("reconcile of a SuperNode not yet in the cache: %+v, %v (%d creates); want a requeue within a second, no error", res, err, creates)
	}
	if got := testutil.ToFloat64(reconcilesTotal.WithLabelValues("error")) - errors0; got != 0 {
		t.Errorf("%v reconciles counted as errors", got)
	}
	if got := testutil.ToFloat64(reconcilesTotal.WithLabelValues("requeue")) - requeues0; got != 1 {
		t.Errorf("%v reconciles counted as requeues, want 1", got)
	}
	for _, l := range logged.Lines() {
		if strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
			t.Errorf("logged %q", l)
		}
	}
}

// A reconcile removes its SuperNode's annotations, and only those, from
// the Nodes that carry them but are no longer its members (unlabelled,
// relabelled to an invalid id, or to another super node), whatever its
// status says; a Node whose annotations became another SuperNode's
// between the cache and the patch is left as it is, without an error.
func TestReleaseDeparted(t *testing.T) {
	node := func(name, id string, annotations ...string) *corev1.Node {
		n := labelledNode(name, id)
		n.Annotations = map[string]string{"example.com/keep": "x"}
		for i := 0; i < len(annotations); i += 2 {
			n.Annotations[annotations[i]] = annotations[i+1]
		}
		return n
	}
	const mem, gpu, bw = v1alpha1.AnnotationMemory, v1alpha1.AnnotationGPUPool, v1alpha1.AnnotationInterconnectBandwidth
	nodes := []*corev1.Node{
		node("member", "sn", mem, "sn"),
		node("unlabelled", "", mem, "sn", gpu, "sn", bw, "5GB/s"),
		node("invalid", "Bad_ID", mem, "sn", bw, "5GB/s"),
		node("moved", "other", mem, "other", gpu, "other", bw, "1GB/s"),
		node("mixed", "other", mem, "other", gpu, "sn", bw, "1GB/s"),
		node("raced", "", mem, "sn", bw, "5GB/s"),
	}
	sn := superNode(v1alpha1.SuperNodeStatus{})
	objs := []client.Object{sn}
	for _, n := range nodes {
		objs = append(objs, n)
	}
	raced := 0
	r, _, c := fakeReconciler(t, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if obj.GetName() == "raced" && patch.Type() == types.JSONPatchType {
				// Another SuperNode's annotate lands first.
				raced++
				n := &corev1.Node{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(obj), n); err != nil {
					return err
				}
				n.Annotations[mem], n.Annotations[bw] = "third", "2GB/s"
				if err := c.Update(ctx, n); err != nil {
					return err
				}
			}
			err := c.Patch(ctx, obj, patch, opts...)
			if err != nil && patch.Type() == types.JSONPatchType && apierrors.ReasonForError(err) == metav1.StatusReasonUnknown {
				// What the apiserver answers to a failed test.
				return apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "patch", schema.GroupResource{Resource: "nodes"}, obj.GetName(), err.Error(), 0, false)
			}
			return err
		},
	}, objs...)
	if _, err := r.Reconcile(t.Context(), snKey); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"member":     {mem: "sn"},
		"unlabelled": {},
		"invalid":    {},
		"moved":      {mem: "other", gpu: "other", bw: "1GB/s"},
		"mixed":      {mem: "other", bw: "1GB/s"},
		"raced":      {mem: "third", bw: "2GB/s"},
	}
	for name, w := range want {
		n := &corev1.Node{}
		if err := c.Get(t.Context(), client.ObjectKey{Name: name}, n); err != nil {
			t.Fatal(err)
		}
		w["example.com/keep"] = "x"
		if !maps.Equal(n.Annotations, w) {
			t.Errorf("%s: annotations %v, want %v", name, n.Annotations, w)
		}
	}
	if raced != 1 {
		t.Errorf("raced: %d patches, want 1", raced)
	}
}

// A member's annotate patch says each of the three annotations, a value
// or null, not only those the cache's copy of the Node has wrong: that
// copy may be behind a release by the SuperNode the Node left.
func TestAnnotatePatchSaysAll(t *testing.T) {
	n := member("a", corev1.ConditionTrue, "1Gi", 0, "")
	n.Annotations = map[string]string{v1alpha1.AnnotationMemory: "old", v1alpha1.AnnotationInterconnectBandwidth: "1GB/s"}
	var patches []map[string]map[string]map[string]*string
	r, _, _ := fakeReconciler(t, interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*corev1.Node); ok {
				b, err := patch.Data(obj)
				if err != nil {
					return err
				}
				var p map[string]map[string]map[string]*string
				if err := json.Unmarshal(b, &p); err != nil {
					t.Errorf("patch %s: %v", b, err)
				}
				patches = append(patches, p)
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
	}, superNode(v1alpha1.SuperNodeStatus{}), &n)
	if _, err := r.Reconcile(t.Context(), snKey); err != nil {
		t.Fatal(err)
	}
	if len(patches) != 1 {
		t.Fatalf("%d patches of the member, want 1", len(patches))
	}
	a := patches[0]["metadata"]["annotations"]
	if len(a) != 3 || a[v1alpha1.AnnotationMemory] == nil || *a[v1alpha1.AnnotationMemory] != "sn" {
		t.Errorf("annotate patch %v, want memory sn and the other two", a)
	}
	for _, k := range []string{v1alpha1.AnnotationGPUPool, v1alpha1.AnnotationInterconnectBandwidth} {
		if v, ok := a[k]; !ok || v != nil {
			t.Errorf("annotate patch: %s %v, want null", k, v)
		}
	}
}

// Node updates that change only the controller's own annotations, as a
// reconcile writes them, or only other metadata and heartbeats, queue no
// reconcile; ones that change what a SuperNode is made of, or leave the
// annotations naming another super node or, on a member, none, do.
func TestNodeChangedPredicate(t *testing.T) {
	const mem, gpu, bw = v1alpha1.AnnotationMemory, v1alpha1.AnnotationGPUPool, v1alpha1.AnnotationInterconnectBandwidth
	base := func() *corev1.Node {
		n := member("a", corev1.ConditionTrue, "1Gi", 1, "r1")
		n.ResourceVersion = "10"
		n.Annotations = map[string]string{mem: "sn", gpu: "sn", bw: "5GB/s", "example.com/other": "x"}
		n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(t0)
		return &n
	}
	for _, tc := range []struct {
		what   string
		change func(old, n *corev1.Node)
		want   bool
	}{
		{"the controller's first annotations of a member", func(old, n *corev1.Node) {
			old.Annotations = nil
			n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: managerName, Operation: metav1.ManagedFieldsOperationUpdate}}
		}, false},
		{"the controller's new bandwidth figure", func(old, _ *corev1.Node) { old.Annotations[bw] = "1GB/s" }, false},
		{"the controller's pools, the Node's accelerators gone", func(old, n *corev1.Node) {
			delete(n.Annotations, gpu)
			delete(n.Status.Capacity, resourceNPU)
			delete(old.Status.Capacity, resourceNPU)
		}, false},
		{"a release of a Node no longer labelled", func(old, n *corev1.Node) {
			delete(old.Labels, v1alpha1.LabelSuperNode)
			delete(n.Labels, v1alpha1.LabelSuperNode)
			n.Annotations = map[string]string{"example.com/other": "x"}
		}, false},
		{"a heartbeat", func(_, n *corev1.Node) {
			n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(t0.Add(time.Minute))
		}, false},
		{"another annotation", func(_, n *corev1.Node) { n.Annotations["example.com/other"] = "y" }, false},

		{"memory removed by hand from a member", func(_, n *corev1.Node) { delete(n.Annotations, mem) }, true},
		{"memory naming another super node", func(_, n *corev1.Node) { n.Annotations[mem] = "other" }, true},
		{"gpu-pool naming another super node", func(_, n *corev1.Node) { n.Annotations[gpu] = "other" }, true},
		{"a member's annotations released by the SuperNode it left", func(old, n *corev1.Node) {
			old.Labels[v1alpha1.LabelSuperNode] = "next"
			n.Labels[v1alpha1.LabelSuperNode] = "next"
			n.Annotations = map[string]string{"example.com/other": "x"}
		}, true},
		{"a relabel", func(_, n *corev1.Node) { n.Labels[v1alpha1.LabelSuperNode] = "other" }, true},
		{"a rack", func(_, n *corev1.Node) { n.Labels[v1alpha1.LabelRack] = "r2" }, true},
		{"readiness", func(_, n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse }, true},
		{"capacity", func(_, n *corev1.Node) { n.Status.Capacity[corev1.ResourceMemory] = resource.MustParse("2Gi") }, true},
		{"the bandwidth reported", func(_, n *corev1.Node) { n.Annotations[v1alpha1.LabelUBBandwidth] = "10GB/s" }, true},
	} {
		old, n := base(), base()
		n.ResourceVersion = "11"
		tc.change(old, n)
		if got := nodeChanged.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: n}); got != tc.want {
			t.Errorf("%s: let through %v, want %v", tc.what, got, tc.want)
		}
	}
}
