package discovery

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

// Publishing to a real apiserver: without NFD (reported, then labelling
// the Node directly), then with the NodeFeature CRD installed.
func TestPublishCluster(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{})
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	const nodeName = "dev4-n1"
	// Labels of others: the topology labels k8stest's nodes carry, one
	// of them in ubkit's namespace, and a user's.
	others := map[string]string{"team": "a", LabelPrefix + "rack": "r0", corev1.LabelHostname: nodeName}
	if _, err := c.Client().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: others}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	root := fixture(t, "ascend-910b-kunpeng")
	featureDir := t.TempDir()
	log, rec := testenv.NewLogRecorder()
	cfg := Config{
		Scan:       ScanOptions{Root: root, Topology: dev4(t), TopologyNode: "n1"},
		FeatureDir: featureDir, NodeName: nodeName, Client: c.Client(), Dynamic: dyn, Logger: log,
	}
	node := func() *corev1.Node {
		t.Helper()
		n, err := c.Client().CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	keepsOthers := func(n *corev1.Node) {
		t.Helper()
		for k, v := range others {
			if n.Labels[k] != v {
				t.Errorf("label %s = %q, want %q (not ubkit's to change)", k, n.Labels[k], v)
			}
		}
	}

	t.Run("no NFD", func(t *testing.T) {
		_, err := New(cfg).Refresh(ctx)
		if !errors.Is(err, ErrNoNodeFeatureCRD) {
			t.Fatalf("refresh: %v, want ErrNoNodeFeatureCRD", err)
		}
		if !strings.Contains(err.Error(), "--direct-labels") {
			t.Errorf("error %q does not say what to do", err)
		}
		// The feature file is written all the same, and the Node is not
		// touched.
		if b, err := os.ReadFile(filepath.Join(featureDir, DefaultFeatureFile)); err != nil || !strings.Contains(string(b), "supernode.ubkit.io/npu.count=8\n") {
			t.Errorf("feature file %q, %v", b, err)
		}
		if n := node(); n.Labels[LabelSuperNode] != "" || n.Annotations[LabelsAnnotation] != "" {
			t.Errorf("node labelled without --direct-labels: %v %v", n.Labels, n.Annotations)
		}
	})

	t.Run("direct labels", func(t *testing.T) {
		dcfg := cfg
		dcfg.DirectLabels = true
		a := New(dcfg)
		r, err := a.Refresh(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := node()
		keepsOthers(n)
		for k, v := range r.Labels() {
			if n.Labels[k] != v {
				t.Errorf("label %s = %q, want %q", k, n.Labels[k], v)
			}
		}
		if n.Labels[LabelPrefix+"kae.zip"] != "true" || n.Labels[LabelSuperNode] != "dev4" {
			t.Errorf("labels %v", n.Labels)
		}
		// Someone else adds a label in ubkit's namespace (the SuperNode
		// controller's), and the ZIP engines go away.
		n.Labels[LabelPrefix+"memory"] = "1Ti"
		if _, err := c.Client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		others[LabelPrefix+"memory"] = "1Ti"
		for _, p := range []string{"sys/class/uacce/hisi_zip-4", "sys/class/uacce/hisi_zip-5"} {
			if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
				t.Fatal(err)
			}
		}
		// A new agent (a restart): what the last one set is in the
		// annotation.
		if _, err := New(dcfg).Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		rec.WaitFor(t, "label removed", "supernode.ubkit.io/kae.zip")
		n = node()
		keepsOthers(n)
		if _, ok := n.Labels[LabelPrefix+"kae.zip"]; ok {
			t.Errorf("kae.zip still there: %v", n.Labels)
		}
		if n.Labels[LabelPrefix+"kae.count"] != "4" || n.Labels[LabelPrefix+"kae.sec"] != "true" {
			t.Errorf("labels %v", n.Labels)
		}
		if !strings.Contains(n.Annotations[LabelsAnnotation], LabelPrefix+"kae.hpre") || strings.Contains(n.Annotations[LabelsAnnotation], "kae.zip") {
			t.Errorf("annotation %q", n.Annotations[LabelsAnnotation])
		}
		// Someone removes one of the agent's labels: the next refresh,
		// with no new devices, puts it back.
		a = New(dcfg)
		if _, err := a.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		n = node()
		delete(n.Labels, LabelPrefix+"npu.count")
		if _, err := c.Client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if n = node(); n.Labels[LabelPrefix+"npu.count"] != "8" {
			t.Errorf("npu.count not restored: %v", n.Labels)
		}
		keepsOthers(n)
		// The UB bandwidth, for the SuperNode controller: a label in
		// bytes per second and, set directly, an annotation as
		// ub/topology writes it.
		if n.Labels[LabelUBBandwidth] != "5000000000" || n.Annotations[LabelUBBandwidth] != "5GB/s" || n.Annotations[AnnotationsAnnotation] != LabelUBBandwidth {
			t.Errorf("bandwidth: labels %v, annotations %v", n.Labels, n.Annotations)
		}
		// An annotation no longer wanted is removed, and only it.
		n.Annotations["team"] = "a"
		if _, err := c.Client().CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		removedLabels, removedAnnotations, err := ApplyNode(ctx, c.Client(), nodeName, r.Labels(), nil)
		if err != nil || len(removedLabels) != 0 || !slices.Equal(removedAnnotations, []string{LabelUBBandwidth}) {
			t.Errorf("ApplyNode without annotations: removed %v %v, %v", removedLabels, removedAnnotations, err)
		}
		if n = node(); n.Annotations[LabelUBBandwidth] != "" || n.Annotations[AnnotationsAnnotation] != "" || n.Annotations["team"] != "a" || n.Labels[LabelUBBandwidth] != "5000000000" {
			t.Errorf("after: labels %v, annotations %v", n.Labels, n.Annotations)
		}
		if _, err := a.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		if n = node(); n.Annotations[LabelUBBandwidth] != "5GB/s" {
			t.Errorf("annotation not restored: %v", n.Annotations)
		}
		// Labels and annotations that are not ubkit's are refused.
		if _, _, err := ApplyNode(ctx, c.Client(), nodeName, map[string]string{"team": "b"}, nil); err == nil {
			t.Error("ApplyNode took a label outside supernode.ubkit.io/")
		}
		if _, _, err := ApplyNode(ctx, c.Client(), nodeName, nil, map[string]string{LabelsAnnotation: "x"}); err == nil {
			t.Error("ApplyNode took its own list as an annotation")
		}
	})

	t.Run("NodeFeature", func(t *testing.T) {
		installCRD(t, ctx, c, dyn, "testdata/nodefeature-crd.yaml")
		if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultNamespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		before := node().Labels
		a := New(cfg)
		r, err := a.Refresh(ctx)
		if err != nil {
			t.Fatal(err)
		}
		nf, err := dyn.Resource(NodeFeatureGVR).Namespace(DefaultNamespace).Get(ctx, NodeFeatureName(nodeName), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if nf.GetLabels()[NodeNameLabel] != nodeName {
			t.Errorf("NodeFeature labels %v", nf.GetLabels())
		}
		labels, _, _ := unstructured.NestedStringMap(nf.Object, "spec", "labels")
		if labels[LabelPrefix+"npu.count"] != "8" || labels[LabelSuperNode] != "dev4" || len(labels) != len(r.Labels()) {
			t.Errorf("spec.labels %v", labels)
		}
		attrs, _, _ := unstructured.NestedStringMap(nf.Object, "spec", "features", "attributes", "ubkit.discovery", "elements")
		if attrs["kae.hpre.algorithms"] != "dh,ecdh,ecdsa,rsa,sm2,x25519,x448" || attrs["hugepages-2Mi.total"] != "4096" {
			t.Errorf("attributes %v", attrs)
		}
		npus, _, _ := unstructured.NestedSlice(nf.Object, "spec", "features", "instances", "ubkit.npu", "elements")
		if len(npus) != 8 {
			t.Errorf("%d NPU instances", len(npus))
		}
		// An NPU goes: the object is replaced, not merged.
		if err := os.Remove(filepath.Join(root, "dev/davinci3")); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Refresh(ctx); err != nil {
			t.Fatal(err)
		}
		rec.WaitFor(t, "device disappeared", "NPU davinci3")
		nf, err = dyn.Resource(NodeFeatureGVR).Namespace(DefaultNamespace).Get(ctx, NodeFeatureName(nodeName), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		npus, _, _ = unstructured.NestedSlice(nf.Object, "spec", "features", "instances", "ubkit.npu", "elements")
		labels, _, _ = unstructured.NestedStringMap(nf.Object, "spec", "labels")
		if len(npus) != 7 || labels[LabelPrefix+"npu.count"] != "7" {
			t.Errorf("after the loss: %d NPU instances, labels %v", len(npus), labels)
		}
		// Without --direct-labels, the Node is NFD's to label.
		if after := node().Labels; len(after) != len(before) {
			t.Errorf("node labels changed: %v -> %v", before, after)
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		// The shipped role is enough for both ways of publishing.
		if _, err := c.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ubkit-system"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		applyYAML(t, ctx, dyn, "../config/discovery/rbac.yaml")
		rc, err := c.UserConfig("system:serviceaccount:ubkit-system:ubkit-discovery", "system:serviceaccounts", "system:serviceaccounts:ubkit-system")
		if err != nil {
			t.Fatal(err)
		}
		client, err := kubernetes.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		sdyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		scfg := cfg
		scfg.Client, scfg.Dynamic, scfg.DirectLabels = client, sdyn, true
		if err := os.Remove(filepath.Join(root, "dev/davinci2")); err != nil {
			t.Fatal(err)
		}
		if _, err := New(scfg).Refresh(ctx); err != nil {
			t.Fatalf("as the service account: %v", err)
		}
		if n := node(); n.Labels[LabelPrefix+"npu.count"] != "6" {
			t.Errorf("labels %v", n.Labels)
		}
		// And no more: not another namespace's NodeFeatures, not pods.
		other := NodeFeatureObject("default", nodeName, &Report{})
		if _, err := sdyn.Resource(NodeFeatureGVR).Namespace("default").Create(ctx, other, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("NodeFeature in default: %v, want forbidden", err)
		}
		if _, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("listing pods: %v, want forbidden", err)
		}
		if err := client.CoreV1().Nodes().Delete(ctx, nodeName, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("deleting the node: %v, want forbidden", err)
		}
	})
}

// applyYAML creates every object of a multi-document YAML file.
func applyYAML(t *testing.T, ctx context.Context, dyn dynamic.Interface, file string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	resources := map[string]string{
		"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
		"Role": "roles", "RoleBinding": "rolebindings",
	}
	dec := yaml.NewDecoder(f)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		gv, err := schema.ParseGroupVersion(u.GetAPIVersion())
		if err != nil {
			t.Fatal(err)
		}
		res, ok := resources[u.GetKind()]
		if !ok {
			t.Fatalf("%s: kind %s", file, u.GetKind())
		}
		var ri dynamic.ResourceInterface = dyn.Resource(gv.WithResource(res))
		if ns := u.GetNamespace(); ns != "" {
			ri = dyn.Resource(gv.WithResource(res)).Namespace(ns)
		}
		if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// installCRD creates the CustomResourceDefinition in file and waits until
// the apiserver serves it.
func installCRD(t *testing.T, ctx context.Context, c *k8stest.Cluster, dyn dynamic.Interface, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &crd.Object); err != nil {
		t.Fatal(err)
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := dyn.Resource(crdGVR).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + crd.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	guard := time.NewTimer(time.Minute)
	defer guard.Stop()
	for established := false; !established; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("CRD watch ended")
			}
			u, _ := ev.Object.(*unstructured.Unstructured)
			if u == nil {
				continue
			}
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					established = true
				}
			}
		case <-guard.C:
			t.Fatalf("CRD %s not Established within a minute", crd.GetName())
		}
	}
	// API discovery, which the agent asks, follows the CRD a little later
	// and cannot be watched: poll it, with a bound.
	dc := c.Client().Discovery()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return HasNodeFeatureCRD(dc)
	}); err != nil {
		t.Fatalf("NodeFeature not in API discovery: %v", err)
	}
}
