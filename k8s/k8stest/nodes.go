package k8stest

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// Labels of the Nodes that [Cluster.AddNodes] makes. Each of a topology
// node's own labels (rack, zone, ...) becomes LabelPrefix+key too.
const (
	LabelPrefix = "supernode.ubkit.io/"
	// LabelSuperNode is the topology's name: the super node the node
	// belongs to.
	LabelSuperNode = LabelPrefix + "id"
	// LabelNode is the node's name in the topology.
	LabelNode = LabelPrefix + "node"
	// AnnotationUBBandwidth is the node's UB link bandwidth, each way, as
	// ub/topology writes bandwidths ("392GB/s"): the widest of its links
	// in the topology. The SuperNode controller reads it (a label or an
	// annotation of that name) for a super node's interconnect bandwidth,
	// and discovery publishes it from the same figure.
	AnnotationUBBandwidth = LabelPrefix + "ub-bandwidth"
)

// Extended resources of the Nodes, one per device kind of the topology:
// the node's count of that kind of accelerator.
const (
	ResourceNPU corev1.ResourceName = "ubkit.io/npu"
	ResourceGPU corev1.ResourceName = "ubkit.io/gpu"
	ResourceKAE corev1.ResourceName = "ubkit.io/kae"
)

// What kwok keys on: the annotation of the nodes it manages, and the label
// of its node-not-ready stage.
const (
	kwokNodeAnnotation = "kwok.x-k8s.io/node"
	kwokNotReadyLabel  = "node-not-ready.stage.kwok.x-k8s.io"
	kwokNotReadyReason = "node-not-ready.stage.kwok.x-k8s.io/reason"
	kwokNotReadyMsg    = "node-not-ready.stage.kwok.x-k8s.io/message"
)

// NodeOptions shape the Nodes of [Cluster.AddNodes].
type NodeOptions struct {
	// CPUs is the CPU capacity of a node whose topology entry gives
	// none; 0 means 16.
	CPUs int
	// MemoryBytes is the memory of a node whose topology entry gives
	// none; 0 means 64 GiB.
	MemoryBytes int64
	// HugePages2Mi is the memory in 2 MiB huge pages of every node (a
	// topology has none of its own), counted out of its memory; 0 means
	// none.
	HugePages2Mi int64
	// Pods is how many pods a node takes; 0 means 110.
	Pods int
	// Labels are added to every node.
	Labels map[string]string
	// Timeout bounds the wait for the nodes to be Ready when ctx has no
	// deadline; 0 means 2 minutes.
	Timeout time.Duration
}

// NodeName is the name of the Node that stands for topology node node of
// super node topo: "<super node>-<node>", in lower case with '_' as '-'
// (a Node's name is a DNS subdomain).
func NodeName(topo *topology.Topology, node string) string {
	return strings.ReplaceAll(strings.ToLower(topo.Name+"-"+node), "_", "-")
}

// AddNodes makes a Node for every compute node of topo (switches have
// none), which kwok manages, and waits until they are Ready (and, with
// the controller-manager, no longer tainted not-ready), so that the
// scheduler places pods on them. It returns the Nodes in topology order.
//
// Each Node has the labels [LabelSuperNode], [LabelNode], LabelPrefix+key
// for each of the topology node's labels, kubernetes.io/hostname,
// topology.kubernetes.io/region (the super node) and
// topology.kubernetes.io/zone (the node's "zone" label, else its "rack"
// label, if it has either); the annotation [AnnotationUBBandwidth] if it
// has a link; and the capacity its topology entry gives: CPUs, memory,
// huge pages ([NodeOptions]), and its devices as [ResourceNPU],
// [ResourceGPU] and [ResourceKAE].
func (c *Cluster) AddNodes(ctx context.Context, topo *topology.Topology, opts NodeOptions) ([]*corev1.Node, error) {
	if !c.kwok {
		return nil, errors.New("k8stest: AddNodes needs kwok to run the nodes: start the cluster with Config.Kwok")
	}
	nodes, err := nodeObjects(topo, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := withDefaultTimeout(ctx, opts.Timeout)
	defer cancel()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
		if _, err := c.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("k8stest: create node %s: %w", n.Name, err)
		}
	}
	ready, err := c.waitNodes(ctx, names, "Ready", c.schedulable)
	if err != nil {
		return nil, err
	}
	return ready, c.untaint(ctx, ready)
}

// CrashNode makes the node called name (a Node of AddNodes) fail: kwok
// reports it NotReady, as a kubelet does whose node is failing, until
// [Cluster.RecoverNode]. The controller-manager, if it runs, then taints
// it and in time evicts its pods. CrashNode returns once the node is not
// Ready.
func (c *Cluster) CrashNode(ctx context.Context, name string) (*corev1.Node, error) {
	patch := map[string]any{"metadata": map[string]any{
		"labels": map[string]any{kwokNotReadyLabel: "true"},
		"annotations": map[string]any{
			kwokNotReadyReason: "K8stestCrash",
			kwokNotReadyMsg:    "k8stest: the node crashed (CrashNode)",
		},
	}}
	ctx, cancel := withDefaultTimeout(ctx, 0)
	defer cancel()
	if err := c.patchNode(ctx, name, patch); err != nil {
		return nil, err
	}
	nodes, err := c.waitNodes(ctx, []string{name}, "NotReady", func(n *corev1.Node) bool { return !nodeReady(n) })
	if err != nil {
		return nil, err
	}
	return nodes[0], nil
}

// RecoverNode brings back a node that [Cluster.CrashNode] took down, and
// returns once it is Ready again (and, with the controller-manager, its
// not-ready taints are gone).
func (c *Cluster) RecoverNode(ctx context.Context, name string) (*corev1.Node, error) {
	patch := map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{kwokNotReadyLabel: nil},
		"annotations": map[string]any{kwokNotReadyReason: nil, kwokNotReadyMsg: nil},
	}}
	ctx, cancel := withDefaultTimeout(ctx, 0)
	defer cancel()
	if err := c.patchNode(ctx, name, patch); err != nil {
		return nil, err
	}
	nodes, err := c.waitNodes(ctx, []string{name}, "Ready", c.schedulable)
	if err != nil {
		return nil, err
	}
	return nodes[0], c.untaint(ctx, nodes)
}

func (c *Cluster) patchNode(ctx context.Context, name string, patch any) error {
	body, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("k8stest: patch node %s: %w", name, err)
	}
	return nil
}

// schedulable reports whether a node is Ready and, if the
// controller-manager runs, has no not-ready or unreachable taint (it
// takes those off a node that became Ready).
func (c *Cluster) schedulable(n *corev1.Node) bool {
	if !nodeReady(n) {
		return false
	}
	return !c.controllerManager || !slices.ContainsFunc(n.Spec.Taints, notReadyTaint)
}

func notReadyTaint(t corev1.Taint) bool {
	return t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable
}

// untaint takes the not-ready taint off Ready nodes, as the
// controller-manager does when it runs. The apiserver's admission puts it
// on every new Node; without a controller-manager nothing would take it
// off, and the scheduler would place no pod there.
func (c *Cluster) untaint(ctx context.Context, nodes []*corev1.Node) error {
	for i, n := range nodes {
		for !c.controllerManager && slices.ContainsFunc(n.Spec.Taints, notReadyTaint) {
			n = n.DeepCopy()
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, notReadyTaint)
			updated, err := c.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				if n, err = c.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
					return fmt.Errorf("k8stest: get node %s: %w", nodes[i].Name, err)
				}
				continue
			}
			if err != nil {
				return fmt.Errorf("k8stest: take the not-ready taint off node %s: %w", n.Name, err)
			}
			n = updated
		}
		nodes[i] = n
	}
	return nil
}

func nodeReady(n *corev1.Node) bool {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitNodes waits until every node of names satisfies ok, watching them
// (what, such as "Ready", names the state in an error), and returns them
// in the order of names.
func (c *Cluster) waitNodes(ctx context.Context, names []string, what string, ok func(*corev1.Node) bool) ([]*corev1.Node, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	latest := map[string]*corev1.Node{}
	pending := func() []string {
		var p []string
		for _, n := range names {
			if node := latest[n]; node == nil || !ok(node) {
				p = append(p, n)
			}
		}
		return p
	}
	for {
		list, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, c.waitError(ctx, what, pending(), err)
		}
		for i := range list.Items {
			if n := &list.Items[i]; want[n.Name] {
				latest[n.Name] = n
			}
		}
		if len(pending()) == 0 {
			break
		}
		w, err := c.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			return nil, c.waitError(ctx, what, pending(), err)
		}
		done := false
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				break // the list and watch start again
			}
			if n, isNode := ev.Object.(*corev1.Node); isNode && want[n.Name] {
				if ev.Type == watch.Deleted {
					delete(latest, n.Name)
				} else {
					latest[n.Name] = n
				}
				if len(pending()) == 0 {
					done = true
					break
				}
			}
		}
		w.Stop()
		if done {
			break
		}
		if ctx.Err() != nil {
			return nil, c.waitError(ctx, what, pending(), ctx.Err())
		}
	}
	out := make([]*corev1.Node, len(names))
	for i, n := range names {
		out[i] = latest[n]
	}
	return out, nil
}

func (c *Cluster) waitError(ctx context.Context, what string, pending []string, err error) error {
	if len(pending) > 5 {
		pending = append(pending[:5:5], fmt.Sprintf("and %d more", len(pending)-5))
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return fmt.Errorf("k8stest: nodes not %s (%s): %w (kwok's log: %s)", what, strings.Join(pending, ", "), err, c.dir+"/kwok.log")
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	if d <= 0 {
		d = 2 * time.Minute
	}
	return context.WithTimeout(ctx, d)
}

// nodeObjects builds the Nodes for topo's compute nodes.
func nodeObjects(topo *topology.Topology, opts NodeOptions) ([]*corev1.Node, error) {
	if topo == nil {
		return nil, errors.New("k8stest: AddNodes: no topology")
	}
	cpus, memory, pods := opts.CPUs, opts.MemoryBytes, opts.Pods
	if cpus <= 0 {
		cpus = 16
	}
	if memory <= 0 {
		memory = 64 << 30
	}
	if pods <= 0 {
		pods = 110
	}
	var problems []string
	seen := map[string]string{}
	var nodes []*corev1.Node
	for _, tn := range topo.Nodes {
		if tn.IsSwitch() {
			continue
		}
		name := NodeName(topo, tn.Name)
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			problems = append(problems, fmt.Sprintf("node %s: %s is no Node name: %s", tn.Name, name, strings.Join(errs, "; ")))
			continue
		}
		if other, dup := seen[name]; dup {
			problems = append(problems, fmt.Sprintf("nodes %s and %s both make the Node name %s", other, tn.Name, name))
			continue
		}
		seen[name] = tn.Name
		labels := map[string]string{
			LabelSuperNode:             topo.Name,
			LabelNode:                  tn.Name,
			corev1.LabelHostname:       name,
			corev1.LabelOSStable:       "linux",
			corev1.LabelArchStable:     "amd64",
			corev1.LabelTopologyRegion: topo.Name,
			"type":                     "kwok",
			"node.kubernetes.io/exclude-from-external-load-balancers": "true",
		}
		for k, v := range tn.Labels {
			labels[LabelPrefix+k] = v
		}
		if zone := cmp.Or(tn.Labels["zone"], tn.Labels["rack"]); zone != "" {
			labels[corev1.LabelTopologyZone] = zone
		}
		maps.Copy(labels, opts.Labels)
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			for _, e := range validation.IsQualifiedName(k) {
				problems = append(problems, fmt.Sprintf("node %s: label %s: %s", tn.Name, k, e))
			}
			for _, e := range validation.IsValidLabelValue(labels[k]) {
				problems = append(problems, fmt.Sprintf("node %s: label %s=%q: %s", tn.Name, k, labels[k], e))
			}
		}
		nodeCPUs, nodeMemory := cpus, memory
		if tn.CPUs > 0 {
			nodeCPUs = tn.CPUs
		}
		if tn.MemoryBytes > 0 {
			nodeMemory = tn.MemoryBytes
		}
		if opts.HugePages2Mi > nodeMemory {
			problems = append(problems, fmt.Sprintf("node %s: %d bytes of huge pages are more than its memory (%d bytes)", tn.Name, opts.HugePages2Mi, nodeMemory))
			continue
		}
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:              *resource.NewQuantity(int64(nodeCPUs), resource.DecimalSI),
			corev1.ResourceMemory:           *resource.NewQuantity(nodeMemory, resource.BinarySI),
			corev1.ResourcePods:             *resource.NewQuantity(int64(pods), resource.DecimalSI),
			corev1.ResourceEphemeralStorage: *resource.NewQuantity(100<<30, resource.BinarySI),
			"hugepages-2Mi":                 *resource.NewQuantity(opts.HugePages2Mi, resource.BinarySI),
			"hugepages-1Gi":                 *resource.NewQuantity(0, resource.BinarySI),
		}
		for kind, res := range map[topology.DeviceKind]corev1.ResourceName{topology.NPU: ResourceNPU, topology.GPU: ResourceGPU, topology.KAE: ResourceKAE} {
			if n := tn.DeviceCount(kind); n > 0 {
				capacity[res] = *resource.NewQuantity(int64(n), resource.DecimalSI)
			}
		}
		allocatable := capacity.DeepCopy()
		// As a kubelet counts it: memory in huge pages is not for pods'
		// ordinary memory.
		allocatable[corev1.ResourceMemory] = *resource.NewQuantity(nodeMemory-opts.HugePages2Mi, resource.BinarySI)
		annotations := map[string]string{kwokNodeAnnotation: "fake"}
		if bw := topo.LinkBandwidth(tn.Name); bw > 0 {
			annotations[AnnotationUBBandwidth] = topology.FormatBandwidth(bw)
		}
		nodes = append(nodes, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Labels:      labels,
				Annotations: annotations,
			},
			Status: corev1.NodeStatus{Capacity: capacity, Allocatable: allocatable, Phase: corev1.NodePending},
		})
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("k8stest: topology %s cannot make Nodes:\n\t%s", topo.Name, strings.Join(problems, "\n\t"))
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("k8stest: topology %s has no compute nodes", topo.Name)
	}
	return nodes, nil
}
