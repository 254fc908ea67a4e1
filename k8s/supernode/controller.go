package supernode

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

// managerName names the controller: in Events, as the field manager and
// in the managed-by label of the HyperNodes it makes.
const managerName = "ubkit-supernode-controller"

// DefaultLeaderElectionNamespace holds the leader election Lease unless
// Config says otherwise: a namespace of ubkit's own, so that the Role
// the controller's Lease needs lets it write no other component's Leases
// (kube-system holds the scheduler's and the controller manager's).
const DefaultLeaderElectionNamespace = "ubkit-system"

// Event reasons, on the SuperNode.
const (
	EventDegraded  = "Degraded"
	EventRecovered = "Recovered"
)

// Options configure a Reconciler. The zero value is usable.
type Options struct {
	// Logger receives the controller's logs; nil means slog.Default().
	Logger *slog.Logger
	// NoHyperNodes turns the export of Volcano HyperNodes off even where
	// their CRD is installed.
	NoHyperNodes bool
	// MissingGrace is how long a deleted member stays in its
	// SuperNode's status, Missing, before it is dropped; 0 means
	// DefaultMissingGrace. (A member relabelled to another super node
	// is dropped at once.)
	MissingGrace time.Duration
	// Resync is how often, while HyperNodes are exported (NoHyperNodes
	// false), each SuperNode is reconciled again though nothing queued
	// it: so that a HyperNode deleted or edited by hand, or a Volcano
	// installed after the controller started, is put right; 0 means
	// DefaultResync.
	Resync time.Duration
	// Workers is how many SuperNodes are reconciled at once (one
	// SuperNode never by two at a time); 0 means DefaultWorkers. Each
	// reconcile waits on a few apiserver round trips, so a cluster of
	// many super nodes settles that many times sooner.
	Workers int
}

// DefaultWorkers is how many SuperNodes are reconciled at once unless
// Options say otherwise.
const DefaultWorkers = 8

// nodeIndex is the cache's index of Nodes by their super node label, so
// that a reconcile lists its members without looking at every Node.
const nodeIndex = "supernode.ubkit.io/id"

// superNodeOf is nodeIndex's function.
func superNodeOf(o client.Object) []string {
	if id := o.GetLabels()[v1alpha1.LabelSuperNode]; id != "" {
		return []string{id}
	}
	return nil
}

// poolIndex is the cache's index of Nodes by the super nodes their
// annotations (AnnotationMemory, AnnotationGPUPool) name, so that a
// reconcile finds the Nodes that have left its SuperNode but still carry
// its annotations.
const poolIndex = "supernode.ubkit.io/pool"

// poolOf is poolIndex's function.
func poolOf(o client.Object) []string {
	a := o.GetAnnotations()
	var ids []string
	for _, k := range []string{v1alpha1.AnnotationMemory, v1alpha1.AnnotationGPUPool} {
		if v := a[k]; v != "" && !slices.Contains(ids, v) {
			ids = append(ids, v)
		}
	}
	return ids
}

// DefaultResync is how often SuperNodes are reconciled again, while
// HyperNodes are exported, unless Options say otherwise.
const DefaultResync = 5 * time.Minute

// cacheLagRequeue is how soon a SuperNode is reconciled again when the
// apiserver has it but the cache does not yet.
const cacheLagRequeue = 100 * time.Millisecond

// DefaultMissingGrace is how long a deleted member stays Missing unless
// Options say otherwise.
const DefaultMissingGrace = 10 * time.Minute

// Reconciler keeps one SuperNode per super node of the cluster's Nodes.
// Its Reconcile is level-triggered and idempotent: from the Nodes as they
// are, it writes the SuperNode's status, the members' annotations and
// the HyperNodes only where they differ from what they should be.
type Reconciler struct {
	client   client.Client
	reader   client.Reader // uncached, for HyperNodes: their CRD may be absent, or installed after the cache started
	recorder events.EventRecorder
	log      *slog.Logger
	hyper    *hyperNodeProbe
	noHyper  bool
	grace    time.Duration
	resync   time.Duration
	workers  int
	now      func() time.Time

	// invalid are the invalid super node ids logged already.
	invalid struct {
		sync.Mutex
		seen map[string]bool
		full bool
	}
}

// New returns a Reconciler that works through mgr's client, cache and
// event recorder. Register it with SetupWithManager.
func New(mgr manager.Manager, opts Options) (*Reconciler, error) {
	disco, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("supernode: discovery client: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	resync := cmp.Or(max(opts.Resync, 0), DefaultResync)
	return &Reconciler{
		client:   mgr.GetClient(),
		reader:   mgr.GetAPIReader(),
		recorder: mgr.GetEventRecorder(managerName),
		log:      log,
		hyper:    &hyperNodeProbe{disco: disco, now: time.Now, recheck: min(hyperNodeRecheck, resync)},
		noHyper:  opts.NoHyperNodes,
		grace:    cmp.Or(max(opts.MissingGrace, 0), DefaultMissingGrace),
		resync:   resync,
		workers:  cmp.Or(max(opts.Workers, 0), DefaultWorkers),
		now:      time.Now,
	}, nil
}

// SetupWithManager registers the controller: it watches SuperNodes and
// Nodes, a Node's change queuing the super node it belongs (or belonged)
// to, and, when HyperNodes are exported and their CRD is installed now,
// the HyperNodes a SuperNode owns, so that one deleted or edited by hand
// is put right at once. (Without that watch, for a CRD installed later,
// the resync puts them right.)
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Node{}, nodeIndex, superNodeOf); err != nil {
		return fmt.Errorf("supernode: index Nodes by super node: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Node{}, poolIndex, poolOf); err != nil {
		return fmt.Errorf("supernode: index Nodes by the super nodes their annotations name: %w", err)
	}
	skip := true // more than one manager per process (tests, the bench) runs this controller
	b := ctrl.NewControllerManagedBy(mgr).
		Named("supernode").
		For(&v1alpha1.SuperNode{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Node{}, r.nodeHandler(), builder.WithPredicates(nodeChanged)).
		WithOptions(controller.Options{SkipNameValidation: &skip, MaxConcurrentReconciles: r.workers})
	if !r.noHyper {
		switch served, err := r.hyper.Served(); {
		case err != nil:
			r.log.Warn("supernode: not watching HyperNodes; the resync keeps them", "resync", r.resync, "err", err)
		case served:
			// Whole objects: controller-runtime's metadata-only watch
			// (a watch.Filter) can leave a goroutine behind when stopped.
			hn := &unstructured.Unstructured{}
			hn.SetGroupVersionKind(HyperNodeGVK)
			b = b.Owns(hn)
		}
	}
	return b.Complete(r)
}

// nodeHandler queues, for a Node event, the SuperNodes its Node (before
// and after, for an update) is labelled for (nodeToSuperNode), and
// reports the invalid super node ids the event carries: counted once
// per event, though an update has two Nodes.
func (r *Reconciler) nodeHandler() handler.EventHandler {
	queue := handler.EnqueueRequestsFromMapFunc(r.nodeToSuperNode)
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.reportInvalid(e.Object)
			queue.Create(ctx, e, q)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.reportInvalid(e.ObjectOld, e.ObjectNew)
			queue.Update(ctx, e, q)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.reportInvalid(e.Object)
			queue.Delete(ctx, e, q)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.reportInvalid(e.Object)
			queue.Generic(ctx, e, q)
		},
	}
}

// nodeToSuperNode maps a Node to the SuperNode its label names. An id
// that cannot name a SuperNode (validID) maps to none (nodeHandler
// reports it).
func (r *Reconciler) nodeToSuperNode(_ context.Context, o client.Object) []reconcile.Request {
	id := o.GetLabels()[v1alpha1.LabelSuperNode]
	if id == "" || !validID(id) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: id}}}
}

// validID says whether super node id can be a SuperNode's name: a
// DNS-1123 subdomain (lowercase letters, digits, '-' and '.', beginning
// and ending with a letter or digit) of at most 63 characters. A label
// value may be more (capitals, '_'); Nodes with such an id are ignored.
func validID(id string) bool {
	return id != "" && len(validation.IsDNS1123Subdomain(id)) == 0 && len(id) <= 63
}

// maxReportedIDs bounds the invalid ids the controller remembers having
// logged.
const maxReportedIDs = 1000

// reportInvalid counts a Node event whose Nodes (one, or an update's
// two) carry a super node id that cannot name a SuperNode, once, and
// logs each such id the first time it is seen (up to maxReportedIDs
// ids, then once that it logs no more).
func (r *Reconciler) reportInvalid(objs ...client.Object) {
	counted := false
	for _, o := range objs {
		if o == nil {
			continue
		}
		id := o.GetLabels()[v1alpha1.LabelSuperNode]
		if id == "" || validID(id) {
			continue
		}
		if !counted {
			ignoredNodeEvents.Inc()
			counted = true
		}
		r.logInvalid(id, o.GetName())
	}
}

func (r *Reconciler) logInvalid(id, node string) {
	r.invalid.Lock()
	defer r.invalid.Unlock()
	if r.invalid.seen[id] {
		return
	}
	if len(r.invalid.seen) >= maxReportedIDs {
		if !r.invalid.full {
			r.invalid.full = true
			r.log.Warn(fmt.Sprintf("supernode: %d invalid super node ids logged; further ones are not (ubkit_supernode_ignored_node_events_total counts them)", maxReportedIDs))
		}
		return
	}
	if r.invalid.seen == nil {
		r.invalid.seen = map[string]bool{}
	}
	r.invalid.seen[id] = true
	r.log.Warn("supernode: ignoring the Nodes of a super node id that cannot name a SuperNode (a DNS-1123 subdomain of at most 63 characters: lowercase letters, digits, '-' and '.')",
		"id", id, "label", v1alpha1.LabelSuperNode, "node", node)
}

// nodeChanged lets through the Node updates that can change a SuperNode:
// labels, readiness, capacity and the bandwidth annotation. Not
// heartbeats, nor other metadata (resourceVersion, managedFields, other
// annotations), nor a change of the controller's own annotations alone
// that leaves them as a reconcile of the Node's super node would
// (annotatedAsLabelled): so the controller's own patches, of a member's
// annotations or of a departed Node's, queue no reconcile. A change of
// them alone that leaves them otherwise (naming another super node, or
// none on a member: edited by hand, or removed by the SuperNode the Node
// left after its new one annotated it) is let through, to be put right.
var nodeChanged = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	a, okA := e.ObjectOld.(*corev1.Node)
	b, okB := e.ObjectNew.(*corev1.Node)
	if !okA || !okB {
		return true
	}
	ha, ra := nodeHealth(a)
	hb, rb := nodeHealth(b)
	return ha != hb || ra != rb ||
		!equality.Semantic.DeepEqual(a.Labels, b.Labels) ||
		!equality.Semantic.DeepEqual(a.Status.Capacity, b.Status.Capacity) ||
		a.Annotations[v1alpha1.LabelUBBandwidth] != b.Annotations[v1alpha1.LabelUBBandwidth] ||
		annotationsDiffer(a, ourAnnotations(b)) && !annotatedAsLabelled(b)
}}

func ourAnnotations(n *corev1.Node) map[string]string {
	m := map[string]string{}
	for _, k := range ourAnnotationKeys {
		if v, ok := n.Annotations[k]; ok {
			m[k] = v
		}
	}
	return m
}

// annotatedAsLabelled says whether Node n's annotations name its super
// node (its label) and no other, as its SuperNode's annotate leaves them
// (AnnotationMemory that super node, AnnotationGPUPool that or none), or,
// for a Node without the label, name none, as a release leaves them.
func annotatedAsLabelled(n *corev1.Node) bool {
	id := n.Labels[v1alpha1.LabelSuperNode]
	gpu, ok := n.Annotations[v1alpha1.AnnotationGPUPool]
	return n.Annotations[v1alpha1.AnnotationMemory] == id && (!ok || gpu == id)
}

// Reconcile brings the SuperNode named req.Name in line with its member
// Nodes, creating it if Nodes name it and it does not exist.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (_ reconcile.Result, err error) {
	start := time.Now()
	requeued := false
	defer func() {
		result := "success"
		switch {
		case err != nil:
			result = "error"
		case requeued:
			result = "requeue"
		}
		reconcilesTotal.WithLabelValues(result).Inc()
		reconcileSeconds.Observe(time.Since(start).Seconds())
	}()

	var nodes corev1.NodeList
	if err := r.client.List(ctx, &nodes, client.MatchingFields{nodeIndex: req.Name}); err != nil {
		return reconcile.Result{}, fmt.Errorf("supernode: list nodes of %s: %w", req.Name, err)
	}
	sn := &v1alpha1.SuperNode{}
	switch err := r.client.Get(ctx, req.NamespacedName, sn); {
	case apierrors.IsNotFound(err):
		if len(nodes.Items) == 0 {
			membersByHealth.DeletePartialMatch(map[string]string{"supernode": req.Name})
			_, err := r.release(ctx, req.Name) // Nodes that left it before it was deleted
			return reconcile.Result{}, err
		}
		sn = &v1alpha1.SuperNode{ObjectMeta: metav1.ObjectMeta{Name: req.Name}, Spec: v1alpha1.SuperNodeSpec{ID: req.Name}}
		switch err := r.client.Create(ctx, sn, client.FieldOwner(managerName)); {
		case apierrors.IsAlreadyExists(err):
			// Made a moment ago (by this controller, a Node's event
			// queuing it again), and not yet in the cache: again
			// once it is, which is no error.
			requeued = true
			r.log.DebugContext(ctx, "supernode: SuperNode exists but is not in the cache yet; again shortly", "supernode", req.Name)
			return reconcile.Result{RequeueAfter: cacheLagRequeue}, nil
		case err != nil:
			return reconcile.Result{}, fmt.Errorf("supernode: create SuperNode %s: %w", req.Name, err)
		}
		r.log.InfoContext(ctx, "supernode: created SuperNode", "supernode", req.Name, "members", len(nodes.Items))
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("supernode: get SuperNode %s: %w", req.Name, err)
	}
	if !sn.DeletionTimestamp.IsZero() {
		membersByHealth.DeletePartialMatch(map[string]string{"supernode": req.Name})
		return reconcile.Result{}, nil
	}

	moved, err := r.moved(ctx, sn, nodes.Items)
	if err != nil {
		return reconcile.Result{}, err
	}
	st, next := computeStatus(sn, nodes.Items, moved, r.now(), r.grace)

	// The status first, with its Event: what the annotations and the
	// HyperNodes need of the apiserver failing must not keep a super
	// node's health from being said. Then the rest, each error joined.
	var errs []error
	statusWrites := 0
	setMemberGauge(sn.Name, &st)
	if !equality.Semantic.DeepEqual(sn.Status, st) {
		statusWrites++
		updated := sn.DeepCopy()
		updated.Status = st
		if err := r.client.Status().Update(ctx, updated, client.FieldOwner(managerName)); err != nil {
			// Nothing was saved, so nothing has changed: no Event, or
			// each retry of a conflict would record the transition again.
			errs = append(errs, fmt.Errorf("supernode: update status of %s: %w", sn.Name, err))
		} else {
			r.recordTransition(&sn.Status, updated)
			sn = updated
		}
	}
	annotated, err := r.annotate(ctx, sn, &st, nodes.Items)
	errs = append(errs, err)
	released, err := r.release(ctx, sn.Name)
	errs = append(errs, err)
	exported, err := r.exportHyperNodes(ctx, sn, nodes.Items)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	r.log.DebugContext(ctx, "supernode: reconciled", "supernode", sn.Name, "wrote", statusWrites+annotated+released+exported,
		"status", statusWrites, "annotated", annotated, "released", released, "hypernodes", exported)
	// Again when the first Missing member's grace ends, to drop it, and
	// at the latest after the resync while HyperNodes are exported.
	if !r.noHyper && (next == 0 || r.resync < next) {
		next = r.resync
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// moved returns the members of sn's status that are not among nodes but
// are Nodes still: relabelled to another super node, or unlabelled. (The
// others have been deleted.)
func (r *Reconciler) moved(ctx context.Context, sn *v1alpha1.SuperNode, nodes []corev1.Node) (map[string]bool, error) {
	present := map[string]bool{}
	for i := range nodes {
		present[nodes[i].Name] = true
	}
	moved := map[string]bool{}
	for _, m := range sn.Status.Members {
		if present[m.Name] {
			continue
		}
		switch err := r.client.Get(ctx, client.ObjectKey{Name: m.Name}, &corev1.Node{}); {
		case err == nil:
			moved[m.Name] = true
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("supernode: get node %s, once of %s: %w", m.Name, sn.Name, err)
		}
	}
	return moved, nil
}

// annotate writes on each member Node the annotations it lacks or has
// wrong, and returns how many Nodes it wrote. Each patch says all three,
// a value or none (null), not only what differs from the Node in the
// cache, which may be behind: so that a member is left with what its
// SuperNode says whatever another SuperNode's release (release) removed
// meanwhile.
func (r *Reconciler) annotate(ctx context.Context, sn *v1alpha1.SuperNode, st *v1alpha1.SuperNodeStatus, nodes []corev1.Node) (int, error) {
	writes := 0
	for i := range nodes {
		n := &nodes[i]
		want := memberAnnotations(sn.Name, st, n)
		if !annotationsDiffer(n, want) {
			continue
		}
		set := map[string]any{}
		for _, k := range ourAnnotationKeys {
			if v, ok := want[k]; ok {
				set[k] = v
			} else {
				set[k] = nil
			}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": set}})
		if err != nil {
			return writes, err
		}
		writes++
		if err := r.client.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(managerName)); err != nil && !apierrors.IsNotFound(err) {
			return writes, fmt.Errorf("supernode: annotate node %s: %w", n.Name, err)
		}
	}
	return writes, nil
}

// ourAnnotationKeys are the annotations the controller writes on Nodes.
var ourAnnotationKeys = []string{v1alpha1.AnnotationMemory, v1alpha1.AnnotationGPUPool, v1alpha1.AnnotationInterconnectBandwidth}

// release removes the annotations of super node sn from the Nodes that
// carry them but are no longer its members (relabelled to another super
// node, to an id that cannot name one, or unlabelled), so that no Node
// says it is part of a pool it has left; it returns how many Nodes it
// wrote. Those Nodes are found through the cache's poolIndex, not the
// SuperNode's status, so that one whose patch failed is released by a
// later reconcile, once the status no longer has it.
func (r *Reconciler) release(ctx context.Context, sn string) (int, error) {
	var nodes corev1.NodeList
	if err := r.client.List(ctx, &nodes, client.MatchingFields{poolIndex: sn}); err != nil {
		return 0, fmt.Errorf("supernode: list nodes annotated for %s: %w", sn, err)
	}
	writes := 0
	var errs []error
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if n.Labels[v1alpha1.LabelSuperNode] == sn {
			continue
		}
		patch := releasePatch(sn, n)
		if patch == nil {
			continue
		}
		writes++
		switch err := r.client.Patch(ctx, n, client.RawPatch(types.JSONPatchType, patch), client.FieldOwner(managerName)); {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsInvalid(err):
			// A test of the patch failed: the Node's annotations are
			// not those in the cache any more, another SuperNode's
			// now; they are not sn's to remove.
			r.log.DebugContext(ctx, "supernode: a departed member's annotations changed meanwhile; left as they are", "supernode", sn, "node", n.Name, "err", err)
		default:
			errs = append(errs, fmt.Errorf("supernode: remove the annotations of %s from node %s, no longer its member: %w", sn, n.Name, err))
		}
	}
	return writes, errors.Join(errs...)
}

// releasePatch is the JSON patch that removes from Node n the
// annotations that are sn's: those of AnnotationMemory and
// AnnotationGPUPool that name sn, and, if AnnotationMemory does,
// AnnotationInterconnectBandwidth (sn's figure), each only if the Node
// still has it as n has it (a test before each removal); nil if none is
// sn's.
func releasePatch(sn string, n *corev1.Node) []byte {
	type op struct {
		Op    string  `json:"op"`
		Path  string  `json:"path"`
		Value *string `json:"value,omitempty"`
	}
	var ops []op
	remove := func(k string) {
		path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
		v := n.Annotations[k]
		ops = append(ops, op{Op: "test", Path: path, Value: &v}, op{Op: "remove", Path: path})
	}
	mem, ok := n.Annotations[v1alpha1.AnnotationMemory]
	if ok && mem == sn {
		remove(v1alpha1.AnnotationMemory)
		if _, ok := n.Annotations[v1alpha1.AnnotationInterconnectBandwidth]; ok {
			remove(v1alpha1.AnnotationInterconnectBandwidth)
		}
	}
	if n.Annotations[v1alpha1.AnnotationGPUPool] == sn {
		remove(v1alpha1.AnnotationGPUPool)
	}
	if len(ops) == 0 {
		return nil
	}
	b, _ := json.Marshal(ops) // strings only: cannot fail
	return b
}

// exportHyperNodes makes sn's HyperNodes what they should be, if their
// CRD is served and the export is on, and returns how many it wrote.
func (r *Reconciler) exportHyperNodes(ctx context.Context, sn *v1alpha1.SuperNode, nodes []corev1.Node) (int, error) {
	if r.noHyper {
		return 0, nil
	}
	served, err := r.hyper.Served()
	if err != nil {
		return 0, err
	}
	if !served {
		r.log.DebugContext(ctx, "supernode: Volcano's HyperNode CRD is not installed; not exporting HyperNodes", "supernode", sn.Name)
		return 0, nil
	}
	return r.syncHyperNodes(ctx, sn, nodes)
}

// recordTransition records an Event when the status saved on sn, after
// prev, says the super node degraded or recovered. It is called only
// once the status is saved.
func (r *Reconciler) recordTransition(prev *v1alpha1.SuperNodeStatus, sn *v1alpha1.SuperNode) {
	was := meta.IsStatusConditionTrue(prev.Conditions, v1alpha1.ConditionDegraded)
	now := meta.FindStatusCondition(sn.Status.Conditions, v1alpha1.ConditionDegraded)
	if now == nil {
		return
	}
	switch {
	case !was && now.Status == metav1.ConditionTrue:
		r.recorder.Eventf(sn, nil, corev1.EventTypeWarning, EventDegraded, "Reconcile", "%s", now.Message)
		r.log.Warn("supernode: degraded", "supernode", sn.Name, "message", now.Message)
	case was && now.Status == metav1.ConditionFalse:
		r.recorder.Eventf(sn, nil, corev1.EventTypeNormal, EventRecovered, "Reconcile", "%s", now.Message)
		r.log.Info("supernode: recovered", "supernode", sn.Name, "message", now.Message)
	}
}

// Scheme is the scheme the controller's clients use: Kubernetes' own
// types and v1alpha1.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// Config configures Run.
type Config struct {
	Options
	// LeaderElection makes only one of several running controllers
	// reconcile, by a Lease in LeaderElectionNamespace.
	LeaderElection bool
	// LeaderElectionNamespace holds the Lease; "" means
	// DefaultLeaderElectionNamespace, where the generated Role grants
	// the controller its Lease (k8s/config/rbac).
	LeaderElectionNamespace string
	// MetricsAddr is where Prometheus metrics are served (controller-
	// runtime's registry, ours included); "" or "0" serves none.
	MetricsAddr string
	// HealthAddr serves /healthz and /readyz; "" or "0" serves none.
	HealthAddr string
	// QPS and Burst bound the controller's requests to the apiserver
	// (client-go's rate limit); 0 means DefaultQPS and DefaultBurst.
	// client-go's own default, 5/s, takes 10 s to annotate one super
	// node of 50 members and most of an hour for 5,000 nodes.
	QPS   float32
	Burst int
}

// The controller's apiserver rate limit unless Config says otherwise.
const (
	DefaultQPS   = 200
	DefaultBurst = 400
)

// NewManager returns a manager with the controller registered, for cfg's
// cluster; start it with its Start.
func NewManager(cfg *rest.Config, c Config) (manager.Manager, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = cmp.Or(max(c.QPS, 0), DefaultQPS)
	cfg.Burst = cmp.Or(max(c.Burst, 0), DefaultBurst)
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	metrics := c.MetricsAddr
	if metrics == "" {
		metrics = "0"
	}
	health := c.HealthAddr
	if health == "" {
		health = "0"
	}
	ns := c.LeaderElectionNamespace
	if ns == "" {
		ns = DefaultLeaderElectionNamespace
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Logger:                  logr.FromSlogHandler(log.Handler()),
		Metrics:                 metricsserver.Options{BindAddress: metrics},
		HealthProbeBindAddress:  health,
		LeaderElection:          c.LeaderElection,
		LeaderElectionID:        managerName,
		LeaderElectionNamespace: ns,
		// A controller that stops (a new version rolling out) hands over at once.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return nil, fmt.Errorf("supernode: manager: %w", err)
	}
	if health != "0" {
		if err := errors.Join(mgr.AddHealthzCheck("ping", pingCheck), mgr.AddReadyzCheck("ping", pingCheck)); err != nil {
			return nil, err
		}
	}
	r, err := New(mgr, c.Options)
	if err != nil {
		return nil, err
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("supernode: set up controller: %w", err)
	}
	return mgr, nil
}

// Run runs the controller against cfg's cluster until ctx is done.
func Run(ctx context.Context, cfg *rest.Config, c Config) error {
	mgr, err := NewManager(cfg, c)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
