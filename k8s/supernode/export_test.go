package supernode

import (
	"context"
	"os"
	"slices"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

// TestHyperNodeExport: with Volcano's HyperNode CRD installed, dev4 is
// exported as a rack tier under a super node tier, and a member's
// deletion shrinks its rack.
func TestHyperNodeExport(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	installCRD(t, c.RESTConfig(), hyperNodeCRD)
	addExample(t, c, "dev4", nil)
	cl := newClient(t, c.RESTConfig())
	startController(t, c.RESTConfig(), Config{})
	waitSuperNode(t, cl, "dev4", "Ready", isReady)

	want := map[string]hyperNodeShape{
		"dev4":    {2, "HyperNode", []string{"dev4-r0", "dev4-r1"}},
		"dev4-r0": {1, "Node", []string{"dev4-n0", "dev4-n1"}},
		"dev4-r1": {1, "Node", []string{"dev4-n2", "dev4-n3"}},
	}
	poll(t, "the HyperNodes of dev4", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })

	if err := c.Client().CoreV1().Nodes().Delete(t.Context(), "dev4-n3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want["dev4-r1"] = hyperNodeShape{1, "Node", []string{"dev4-n2"}}
	poll(t, "dev4-r1 without the deleted node", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, cl, want) })
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

// TestRBAC: the controller runs as a user bound only to the generated
// ClusterRole (leader election included), and that user can do what it
// needs and nothing else (SubjectAccessReviews both ways).
func TestRBAC(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	addExample(t, c, "dev4", nil)

	b, err := os.ReadFile("../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(b, role); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.Client().RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const user = "system:serviceaccount:ubkit:supernode-controller"
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := c.Client().RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		group, resource, sub, verb string
		allowed                    bool
	}{
		{"", "nodes", "", "list", true},
		{"", "nodes", "", "watch", true},
		{"", "nodes", "", "patch", true},
		{"supernode.ubkit.io", "supernodes", "", "create", true},
		{"supernode.ubkit.io", "supernodes", "status", "update", true},
		{"events.k8s.io", "events", "", "create", true},
		{"topology.volcano.sh", "hypernodes", "", "create", true},
		{"coordination.k8s.io", "leases", "", "update", true},
		{"", "nodes", "", "delete", false},
		{"", "nodes", "", "update", false},
		{"", "secrets", "", "get", false},
		{"", "secrets", "", "list", false},
		{"", "pods", "", "create", false},
		{"supernode.ubkit.io", "supernodes", "", "delete", false},
		{"supernode.ubkit.io", "supernodes", "", "update", false},
		{"rbac.authorization.k8s.io", "clusterroles", "", "create", false},
	} {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:               user,
			ResourceAttributes: &authzv1.ResourceAttributes{Group: tc.group, Resource: tc.resource, Subresource: tc.sub, Verb: tc.verb},
		}}
		got, err := c.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tc.allowed {
			t.Errorf("%s %s %s/%s: allowed %v, want %v (%s)", user, tc.verb, tc.group, tc.resource+"/"+tc.sub, got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}

	cfg, err := c.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	startController(t, cfg, Config{LeaderElection: true})
	sn := waitSuperNode(t, newClient(t, c.RESTConfig()), "dev4", "Ready (reconciled as the bound user)", isReady)
	wantFigures(t, sn, 4, 4, "64Gi", 4, 1, 1)
	if _, err := c.Client().CoordinationV1().Leases("kube-system").Get(ctx, managerName, metav1.GetOptions{}); err != nil {
		t.Errorf("the leader election lease: %v", err)
	}
}
