package supernode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

// HyperNodeGVK is Volcano's HyperNode (cluster-scoped; spec.tier and
// spec.members), which the controller exports when its CRD is installed.
var HyperNodeGVK = schema.GroupVersionKind{Group: "topology.volcano.sh", Version: "v1alpha1", Kind: "HyperNode"}

// hyperNodeRecheck is how long an answer of discovery about the HyperNode
// CRD is trusted (or the resync interval, if shorter): a CRD installed
// later is found by the first reconcile after this time, at the latest
// the next resync.
const hyperNodeRecheck = 30 * time.Second

// hyperNodeFailRecheck is how long a failure of discovery is remembered
// (or recheck, if shorter): so that while the apiserver's discovery
// fails, the workers do not each ask it again every reconcile.
const hyperNodeFailRecheck = 10 * time.Second

// hyperNodeProbe says, through discovery, whether the HyperNode kind is
// served, and remembers the answer for recheck, a failure for
// min(recheck, hyperNodeFailRecheck). One request is in flight at a time,
// and no lock is held while it is: a caller that finds one in flight
// takes the last answer, or, if there is none yet, waits for that
// request's.
type hyperNodeProbe struct {
	disco   discovery.DiscoveryInterface
	now     func() time.Time
	recheck time.Duration

	mu       sync.Mutex
	checked  time.Time // when the last answer came; zero: none yet
	served   bool
	err      error
	inflight chan struct{} // closed when the request in flight is answered
}

func (p *hyperNodeProbe) Served() (served bool, err error) {
	p.mu.Lock()
	for {
		if !p.checked.IsZero() && (p.inflight != nil || p.now().Sub(p.checked) < p.trust()) {
			defer p.mu.Unlock()
			return p.served, p.err
		}
		if p.inflight == nil {
			break
		}
		wait := p.inflight
		p.mu.Unlock()
		<-wait
		p.mu.Lock()
	}
	done := make(chan struct{})
	p.inflight = done
	p.mu.Unlock()
	// The answer, for those waiting, even if the request panics.
	err = errors.New("supernode: discovery of " + HyperNodeGVK.GroupVersion().String() + " did not answer")
	defer func() {
		p.mu.Lock()
		p.served, p.err, p.checked, p.inflight = served, err, p.now(), nil
		p.mu.Unlock()
		close(done)
	}()
	return p.ask()
}

// trust is how long the last answer holds; p.mu is held.
func (p *hyperNodeProbe) trust() time.Duration {
	if p.err != nil {
		return min(p.recheck, hyperNodeFailRecheck)
	}
	return p.recheck
}

// ask asks discovery whether the HyperNode kind is served.
func (p *hyperNodeProbe) ask() (bool, error) {
	list, err := p.disco.ServerResourcesForGroupVersion(HyperNodeGVK.GroupVersion().String())
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("supernode: discovery of %s: %w", HyperNodeGVK.GroupVersion(), err)
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Kind == HyperNodeGVK.Kind }), nil
}

// desiredHyperNodes are the HyperNodes that stand for super node sn with
// member Nodes nodes: with every member in a rack, one tier-1 HyperNode
// per rack (rackHyperNodeName, its Nodes) under a tier-2 one (<sn>, the
// racks); otherwise one tier-1 HyperNode <sn> of all the Nodes.
func desiredHyperNodes(sn *v1alpha1.SuperNode, nodes []corev1.Node) []*unstructured.Unstructured {
	if len(nodes) == 0 {
		return nil
	}
	byRack := map[string][]string{}
	racked := true
	var all []string
	for _, n := range nodes {
		all = append(all, n.Name)
		r := n.Labels[v1alpha1.LabelRack]
		if r == "" {
			racked = false
		}
		byRack[r] = append(byRack[r], n.Name)
	}
	if !racked {
		return []*unstructured.Unstructured{hyperNode(sn, sn.Name, 1, "Node", all)}
	}
	var rackNames []string
	var hns []*unstructured.Unstructured
	for _, r := range slices.Sorted(maps.Keys(byRack)) {
		name := rackHyperNodeName(sn.Name, r)
		rackNames = append(rackNames, name)
		hns = append(hns, hyperNode(sn, name, 1, "Node", byRack[r]))
	}
	return append(hns, hyperNode(sn, sn.Name, 2, "HyperNode", rackNames))
}

// maxHyperNodeName is the longest HyperNode name the controller makes:
// Volcano checks a HyperNode's name, and each exactMatch name of its
// members (the racks' HyperNodes, under the super node's), with
// Kubernetes' IsQualifiedName, whose names are at most 63 characters.
const maxHyperNodeName = 63

// rackHyperNodeName is the name of the HyperNode of rack (a label
// value: letters of either case, digits, '-', '_' and '.', at most 63)
// of super node sn (a DNS-1123 subdomain of at most 63):
// <sn>-<rack>-<hash>, the rack lowercased and its '_' and '.' made '-',
// the hash 8 hex digits of a hash of sn and the rack as they are, and
// <sn>-<rack> cut to leave the whole at most maxHyperNodeName. So racks
// that differ only where the name cannot follow them (R1 and r1, rack_a
// and rack-a), or only after the cut, get HyperNodes of their own, a
// rack's HyperNode is not another super node's rack's (a-b's rack c and
// a's rack b-c), nor another SuperNode's own (SuperNode a-b's, against a's
// rack b), short of a collision of the 32-bit hash. It is a DNS-1123
// subdomain and a qualified name.
func rackHyperNodeName(sn, rack string) string {
	clean := strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			return c
		case c >= 'A' && c <= 'Z':
			return c - 'A' + 'a'
		default:
			return '-' // '_' and '.' (a '.' could make an empty DNS label: "a..b", "a.-b")
		}
	}, rack)
	sum := sha256.Sum256([]byte(sn + "/" + rack)) // '/' is in neither
	suffix := "-" + hex.EncodeToString(sum[:4])
	name := sn + "-" + clean
	if len(name) > maxHyperNodeName-len(suffix) {
		// sn begins with a letter or digit; the cut may end in '-' or
		// (in sn) '.', neither of which may come before the suffix's '-'.
		name = strings.TrimRight(name[:maxHyperNodeName-len(suffix)], "-.")
	}
	return name + suffix
}

func hyperNode(sn *v1alpha1.SuperNode, name string, tier int64, memberType string, members []string) *unstructured.Unstructured {
	slices.Sort(members)
	ms := make([]any, 0, len(members))
	for _, m := range members {
		ms = append(ms, map[string]any{
			"type":     memberType,
			"selector": map[string]any{"exactMatch": map[string]any{"name": m}},
		})
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(HyperNodeGVK)
	u.SetName(name)
	u.SetLabels(map[string]string{v1alpha1.LabelSuperNode: sn.Name, labelManagedBy: managerName})
	u.SetOwnerReferences([]metav1.OwnerReference{*metav1.NewControllerRef(sn, v1alpha1.GroupVersion.WithKind("SuperNode"))})
	u.Object["spec"] = map[string]any{"tier": tier, "members": ms}
	return u
}

const labelManagedBy = "app.kubernetes.io/managed-by"

// syncHyperNodes makes the HyperNodes of sn what desiredHyperNodes says,
// touching only those that differ, and removes ours that are not wanted.
// It returns how many it wrote.
func (r *Reconciler) syncHyperNodes(ctx context.Context, sn *v1alpha1.SuperNode, nodes []corev1.Node) (int, error) {
	have := &unstructured.UnstructuredList{}
	have.SetGroupVersionKind(HyperNodeGVK.GroupVersion().WithKind("HyperNodeList"))
	if err := r.reader.List(ctx, have, client.MatchingLabels{v1alpha1.LabelSuperNode: sn.Name, labelManagedBy: managerName}); err != nil {
		return 0, fmt.Errorf("supernode: list HyperNodes of %s: %w", sn.Name, err)
	}
	existing := map[string]*unstructured.Unstructured{}
	for i := range have.Items {
		existing[have.Items[i].GetName()] = &have.Items[i]
	}
	writes := 0
	for _, want := range desiredHyperNodes(sn, nodes) {
		cur, ok := existing[want.GetName()]
		delete(existing, want.GetName())
		if !ok {
			err := r.client.Create(ctx, want)
			switch {
			case apierrors.IsAlreadyExists(err):
				// Not among ours (the list is not a cache's): ours with
				// its labels removed by hand, to adopt; or someone
				// else's, not to touch.
				adopted, err := r.adoptHyperNode(ctx, sn, want)
				if err != nil {
					return writes, err
				}
				if adopted {
					writes++
				}
			case err != nil:
				return writes, fmt.Errorf("supernode: create HyperNode %s: %w", want.GetName(), err)
			default:
				writes++
			}
			continue
		}
		if equality.Semantic.DeepEqual(cur.Object["spec"], want.Object["spec"]) &&
			equality.Semantic.DeepEqual(cur.GetLabels(), want.GetLabels()) {
			continue
		}
		cur.Object["spec"] = want.Object["spec"]
		cur.SetLabels(want.GetLabels())
		if err := r.client.Update(ctx, cur); err != nil {
			return writes, fmt.Errorf("supernode: update HyperNode %s: %w", cur.GetName(), err)
		}
		writes++
	}
	for _, stale := range existing {
		if err := r.client.Delete(ctx, stale); err != nil && !apierrors.IsNotFound(err) {
			return writes, fmt.Errorf("supernode: delete HyperNode %s: %w", stale.GetName(), err)
		}
		writes++
	}
	return writes, nil
}

// adoptHyperNode makes HyperNode want, which exists but is not labelled
// as sn's, sn's again, its labels and spec restored, if sn is its
// controller (an owner reference of sn's UID): its labels were removed or
// changed by hand. It returns whether it wrote it, and an error if the
// HyperNode is another's (no such owner reference), which is left as it
// is. It reads the HyperNode by a list of its name, which the controller
// may do (it may not get HyperNodes).
func (r *Reconciler) adoptHyperNode(ctx context.Context, sn *v1alpha1.SuperNode, want *unstructured.Unstructured) (bool, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(HyperNodeGVK.GroupVersion().WithKind("HyperNodeList"))
	if err := r.reader.List(ctx, list, client.MatchingFields{"metadata.name": want.GetName()}); err != nil {
		return false, fmt.Errorf("supernode: read HyperNode %s: %w", want.GetName(), err)
	}
	if len(list.Items) != 1 {
		return false, fmt.Errorf("supernode: HyperNode %s exists but cannot be read (a list of its name has %d): again later", want.GetName(), len(list.Items))
	}
	cur := &list.Items[0]
	if ref := metav1.GetControllerOf(cur); ref == nil || ref.UID != sn.UID {
		return false, fmt.Errorf("supernode: HyperNode %s exists and is not SuperNode %s's (not labelled %s=%s, %s=%s, nor controlled by it): not touched",
			want.GetName(), sn.Name, v1alpha1.LabelSuperNode, sn.Name, labelManagedBy, managerName)
	}
	cur.SetGroupVersionKind(HyperNodeGVK)
	cur.Object["spec"] = want.Object["spec"]
	cur.SetLabels(want.GetLabels())
	if err := r.client.Update(ctx, cur); err != nil {
		return false, fmt.Errorf("supernode: adopt HyperNode %s: %w", cur.GetName(), err)
	}
	r.log.InfoContext(ctx, "supernode: HyperNode of the SuperNode found without its labels; labelled again", "supernode", sn.Name, "hypernode", cur.GetName())
	return true, nil
}
