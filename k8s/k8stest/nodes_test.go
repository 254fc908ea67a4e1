package k8stest

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// The Nodes of a topology, without a cluster: names, labels, capacity.
func TestNodeObjects(t *testing.T) {
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := nodeObjects(topo, NodeOptions{HugePages2Mi: 1 << 30, Labels: map[string]string{"team": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 4 {
		t.Fatalf("%d nodes, want 4", len(nodes))
	}
	n0 := nodes[0]
	if n0.Name != "dev4-n0" {
		t.Errorf("name %q, want dev4-n0", n0.Name)
	}
	for k, v := range map[string]string{
		LabelSuperNode: "dev4", LabelNode: "n0", LabelPrefix + "rack": "r0",
		corev1.LabelTopologyRegion: "dev4", corev1.LabelTopologyZone: "r0",
		corev1.LabelHostname: "dev4-n0", "team": "a",
	} {
		if got := n0.Labels[k]; got != v {
			t.Errorf("label %s = %q, want %q", k, got, v)
		}
	}
	if n0.Annotations[kwokNodeAnnotation] != "fake" {
		t.Errorf("no kwok annotation: %v", n0.Annotations)
	}
	// dev4's links are 5 GB/s each way.
	if got := n0.Annotations[AnnotationUBBandwidth]; got != "5GB/s" {
		t.Errorf("%s = %q, want 5GB/s", AnnotationUBBandwidth, got)
	}
	for res, want := range map[corev1.ResourceName]string{
		corev1.ResourceCPU: "4", corev1.ResourceMemory: "8Gi", "hugepages-2Mi": "1Gi", ResourceNPU: "2",
	} {
		if got := n0.Status.Capacity[res]; got.Cmp(resource.MustParse(want)) != 0 {
			t.Errorf("capacity %s = %s, want %s", res, got.String(), want)
		}
	}
	if got := n0.Status.Allocatable[corev1.ResourceMemory]; got.Cmp(resource.MustParse("7Gi")) != 0 {
		t.Errorf("allocatable memory %s, want 7Gi (8Gi less the huge pages)", got.String())
	}
	if _, ok := n0.Status.Capacity[ResourceGPU]; ok {
		t.Errorf("n0 has no GPU, but its capacity lists %s", ResourceGPU)
	}
	if got := nodes[2].Status.Capacity[ResourceGPU]; got.Value() != 1 {
		t.Errorf("n2's %s = %s, want 1", ResourceGPU, got.String())
	}

	cm, err := topology.Example("cm384")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err = nodeObjects(cm, NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	compute := 0
	for _, n := range cm.Nodes {
		if !n.IsSwitch() {
			compute++
		}
	}
	if len(nodes) != compute || compute == 0 {
		t.Errorf("%d nodes for cm384's %d compute nodes", len(nodes), compute)
	}
	// A cm384 node has a 392 GB/s link to each UB plane.
	for _, n := range nodes {
		if got := n.Annotations[AnnotationUBBandwidth]; got != "392GB/s" {
			t.Errorf("%s: %s = %q, want 392GB/s", n.Name, AnnotationUBBandwidth, got)
		}
	}
	if _, err := nodeObjects(topo, NodeOptions{Labels: map[string]string{"bad key!": "x"}}); err == nil || !strings.Contains(err.Error(), "bad key!") {
		t.Errorf("an invalid label: err %v, want one naming it", err)
	}
}

// A missing binary fails Start (and StartControlPlane), naming it and what builds it.
func TestMissingBinary(t *testing.T) {
	_, err := StartControlPlane(t.Context(), Config{BinDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "etcd "+EtcdVersion) || !strings.Contains(err.Error(), "make prereqs") {
		t.Fatalf("err %v, want one naming etcd and make prereqs", err)
	}
}

// A process that exits at once fails StartControlPlane (and Start) with the end of its log.
func TestStartFailureShowsLog(t *testing.T) {
	_, err := StartControlPlane(t.Context(), Config{APIServerArgs: []string{"--no-such-flag"}})
	if err == nil || !strings.Contains(err.Error(), "kube-apiserver did not start") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("err %v, want kube-apiserver's failure and its log naming the flag", err)
	}
}
