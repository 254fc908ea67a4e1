package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// NodeFeatureGVR is NFD's NodeFeature resource.
var NodeFeatureGVR = schema.GroupVersionResource{Group: "nfd.k8s-sigs.io", Version: "v1alpha1", Resource: "nodefeatures"}

const (
	// NodeNameLabel marks the node a NodeFeature object is for; nfd-master
	// reads it.
	NodeNameLabel = "nfd.node.kubernetes.io/node-name"
	// DefaultNamespace is NFD's namespace, where nfd-master looks for
	// NodeFeature objects.
	DefaultNamespace = "node-feature-discovery"
	// LabelsAnnotation lists the labels discovery put on a Node directly
	// (comma-separated keys), so that a later run, even of a restarted
	// agent, removes those whose device went away and no other. NFD keeps
	// its own labels the same way (nfd.node.kubernetes.io/feature-labels).
	LabelsAnnotation = "supernode.ubkit.io/discovery-labels"
	// AnnotationsAnnotation lists the annotations discovery put on a Node
	// directly, the same way.
	AnnotationsAnnotation = "supernode.ubkit.io/discovery-annotations"
)

// ErrNoNodeFeatureCRD is returned when the cluster has no NodeFeature
// resource: NFD is not installed.
var ErrNoNodeFeatureCRD = errors.New("discovery: the cluster has no nodefeatures.nfd.k8s-sigs.io/v1alpha1 (NFD is not installed): install NFD, or label the Node directly (--direct-labels)")

// HasNodeFeatureCRD asks the apiserver's discovery whether NodeFeature
// objects exist.
func HasNodeFeatureCRD(dc discovery.DiscoveryInterface) (bool, error) {
	list, err := dc.ServerResourcesForGroupVersion(NodeFeatureGVR.GroupVersion().String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovery: looking for NodeFeature: %w", err)
	}
	for _, r := range list.APIResources {
		if r.Name == NodeFeatureGVR.Resource {
			return true, nil
		}
	}
	return false, nil
}

// NodeFeatureName is the name of discovery's NodeFeature object for a
// node: "<node>-ubkit" (nfd-worker's own is named after the node).
func NodeFeatureName(node string) string { return node + "-ubkit" }

// NodeFeatureObject returns the NodeFeature object for node: spec.labels
// holds r.Labels(); spec.features has the attribute feature
// "ubkit.discovery" (r.Features()) and the instance features
// "ubkit.gpu", "ubkit.npu", "ubkit.kae" and "ubkit.numa", one instance
// per device, for NodeFeatureRules to match. Like the features, the
// instances hold what a device is, not its free queues.
func NodeFeatureObject(namespace, node string, r *Report) *unstructured.Unstructured {
	attrs := map[string]any{}
	for k, v := range r.Features() {
		attrs[k] = v
	}
	var gpus, npus, kae, numa []any
	inst := func(kv ...string) any {
		a := map[string]any{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				a[kv[i]] = kv[i+1]
			}
		}
		return map[string]any{"attributes": a}
	}
	for _, g := range r.GPUs {
		gpus = append(gpus, inst("address", g.Address, "device", g.DeviceID, "model", g.Model, "uuid", g.UUID, "vbios", g.VBIOS))
	}
	for _, n := range r.NPUs {
		npus = append(npus, inst("index", strconv.Itoa(n.Index), "device", fmt.Sprintf("/dev/davinci%d", n.Index)))
	}
	for _, k := range r.KAE {
		kae = append(kae, inst("name", k.Name, "class", k.Class, "api", k.API,
			"algorithms", strings.Join(k.Algorithms, ","), "flags", strconv.FormatInt(k.Flags, 10)))
	}
	for _, n := range r.NUMA {
		numa = append(numa, inst("id", strconv.Itoa(n.ID), "cpus", strconv.Itoa(len(n.CPUs)), "memory", strconv.FormatInt(n.MemTotal, 10)))
	}
	instances := map[string]any{}
	for name, elems := range map[string][]any{"ubkit.gpu": gpus, "ubkit.npu": npus, "ubkit.kae": kae, "ubkit.numa": numa} {
		if elems == nil {
			elems = []any{}
		}
		instances[name] = map[string]any{"elements": elems}
	}
	labels := map[string]any{}
	for k, v := range r.Labels() {
		labels[k] = v
	}
	o := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"labels": labels,
			"features": map[string]any{
				"attributes": map[string]any{"ubkit.discovery": map[string]any{"elements": attrs}},
				"instances":  instances,
			},
		},
	}}
	o.SetAPIVersion(NodeFeatureGVR.GroupVersion().String())
	o.SetKind("NodeFeature")
	o.SetNamespace(namespace)
	o.SetName(NodeFeatureName(node))
	o.SetLabels(map[string]string{NodeNameLabel: node})
	return o
}

// publicationOf is everything a refresh publishes for r: the NodeFeature
// object's spec, whose labels are also the feature file's lines and the
// Node's direct labels, and the Node's direct annotations. Two reports with equal publications (by
// reflect.DeepEqual) publish the same, so the agent compares these, and
// nothing that is not published can make it publish again.
func publicationOf(r *Report) any {
	return []any{NodeFeatureObject("", "", r).Object["spec"], r.Annotations()}
}

// PublishNodeFeature creates or replaces node's NodeFeature object in
// namespace, so that what a scan no longer finds leaves it.
func PublishNodeFeature(ctx context.Context, dc dynamic.Interface, namespace, node string, r *Report) error {
	want := NodeFeatureObject(namespace, node, r)
	res := dc.Resource(NodeFeatureGVR).Namespace(namespace)
	cur, err := res.Get(ctx, want.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = res.Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
	case err == nil:
		want.SetResourceVersion(cur.GetResourceVersion())
		_, err = res.Update(ctx, want, metav1.UpdateOptions{FieldManager: fieldManager})
	}
	if err != nil {
		return fmt.Errorf("discovery: NodeFeature %s/%s: %w", namespace, want.GetName(), err)
	}
	return nil
}

const fieldManager = "ubkit-discovery"

// ApplyNode sets labels and annotations on the Node called node, and
// removes the labels and annotations that an earlier call set (listed in
// LabelsAnnotation and AnnotationsAnnotation) and these do not have. It
// changes nothing else: one JSON merge patch carries only ubkit's keys
// (removed ones as null), guarded by the Node's resourceVersion so that a
// concurrent change of the lists is not lost (on a conflict it reads the
// Node again), and none at all if the Node already has them. Every key
// must start with LabelPrefix. It returns the keys it removed.
func ApplyNode(ctx context.Context, c kubernetes.Interface, node string, labels, annotations map[string]string) (removedLabels, removedAnnotations []string, err error) {
	for _, m := range []map[string]string{labels, annotations} {
		for k := range m {
			if !strings.HasPrefix(k, LabelPrefix) || k == LabelsAnnotation || k == AnnotationsAnnotation {
				return nil, nil, fmt.Errorf("discovery: %q is not one of ubkit's labels or annotations (%s...)", k, LabelPrefix)
			}
		}
	}
	for range 5 {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return nil, nil, fmt.Errorf("discovery: labelling node %s: %w", node, err)
		}
		patchLabels, removedLabels, changedLabels := mergeOwned(n.Labels, n.Annotations[LabelsAnnotation], labels)
		patchAnnotations, removedAnnotations, changedAnnotations := mergeOwned(n.Annotations, n.Annotations[AnnotationsAnnotation], annotations)
		labelKeys, annotationKeys := strings.Join(sortedKeys(labels), ","), strings.Join(sortedKeys(annotations), ",")
		if !changedLabels && !changedAnnotations && n.Annotations[LabelsAnnotation] == labelKeys && n.Annotations[AnnotationsAnnotation] == annotationKeys {
			return nil, nil, nil
		}
		patchAnnotations[LabelsAnnotation] = labelKeys
		patchAnnotations[AnnotationsAnnotation] = annotationKeys
		if annotationKeys == "" {
			patchAnnotations[AnnotationsAnnotation] = nil // no list, rather than an empty one
		}
		patch := map[string]any{"metadata": map[string]any{
			"resourceVersion": n.ResourceVersion,
			"labels":          patchLabels,
			"annotations":     patchAnnotations,
		}}
		body, err := json.Marshal(patch)
		if err != nil {
			return nil, nil, err
		}
		_, err = c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("discovery: labelling node %s: %w", node, err)
		}
		return removedLabels, removedAnnotations, nil
	}
	return nil, nil, fmt.Errorf("discovery: labelling node %s: the Node kept changing (5 conflicts)", node)
}

// mergeOwned is the merge patch that takes a Node's labels or annotations
// (have) to want: want's keys whose values differ, and null for the keys
// of the earlier list (owned, comma-separated) that want no longer has
// and the Node still does. It returns the removed keys, sorted, and
// whether anything changes.
func mergeOwned(have map[string]string, owned string, want map[string]string) (patch map[string]any, removed []string, changed bool) {
	patch = map[string]any{}
	for _, k := range strings.Split(owned, ",") {
		if _, keep := want[k]; !keep && strings.HasPrefix(k, LabelPrefix) {
			if _, has := have[k]; has {
				patch[k] = nil
				removed = append(removed, k)
			}
		}
	}
	for k, v := range want {
		if cur, ok := have[k]; !ok || cur != v {
			patch[k] = v
		}
	}
	sort.Strings(removed)
	return patch, removed, len(patch) > 0
}
