package k8stest_test

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ubkit-io/ubkit/k8s/k8stest"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// A test of your own controller or scheduler plugin starts a control
// plane, gives it the nodes of a super node and runs against it. (It
// needs the binaries, so it is not run here: see TestNodesDeploymentCrash
// for one that is.)
func Example() {
	var t *testing.T // the test's own *testing.T

	c := k8stest.Start(t, k8stest.Config{ControllerManager: true, Scheduler: true, Kwok: true})
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodes, err := c.AddNodes(ctx, topo, k8stest.NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		fmt.Println(n.Name, n.Labels[k8stest.LabelNode], n.Status.Capacity.Cpu())
	}

	// Your code gets the administrator's configuration (or another
	// user's, from UserConfig).
	cfg := c.RESTConfig()
	_ = cfg

	// A node fails, and comes back.
	if _, err := c.CrashNode(ctx, nodes[0].Name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RecoverNode(ctx, nodes[0].Name); err != nil {
		t.Fatal(err)
	}
	list, err := c.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: k8stest.LabelSuperNode + "=dev4"})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(len(list.Items), "nodes")
}
