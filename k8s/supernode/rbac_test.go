package supernode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ubkit-io/ubkit/internal/testenv"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

const (
	roleFile    = "../config/rbac/role.yaml"
	bindingFile = "../config/rbac/binding.yaml"
	// The service account binding.yaml binds, as the apiserver names it.
	controllerUser = "system:serviceaccount:ubkit-system:ubkit-supernode-controller"
)

// manifests are the objects of a multi-document YAML file, decoded
// strictly into their types.
func manifests(t *testing.T, file string) []client.Object {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 || bytes.Equal(bytes.TrimSpace(doc), []byte("---")) {
			continue
		}
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &u.Object); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		var o client.Object
		switch u.GetKind() {
		case "ClusterRole":
			o = &rbacv1.ClusterRole{}
		case "Role":
			o = &rbacv1.Role{}
		case "ClusterRoleBinding":
			o = &rbacv1.ClusterRoleBinding{}
		case "RoleBinding":
			o = &rbacv1.RoleBinding{}
		case "ServiceAccount":
			o = &corev1.ServiceAccount{}
		default:
			t.Fatalf("%s: unexpected kind %q", file, u.GetKind())
		}
		if err := yaml.UnmarshalStrict(doc, o); err != nil {
			t.Fatalf("%s: %s: %v", file, u.GetKind(), err)
		}
		objs = append(objs, o)
	}
	return objs
}

// rule is one (scope, group, resource, names, verbs) of the generated
// roles, flattened.
type rule struct {
	scope, group, resource, names, verbs string
}

func (r rule) String() string {
	s := fmt.Sprintf("%s %s/%s: %s", r.scope, r.group, r.resource, r.verbs)
	if r.names != "" {
		s += " (only " + r.names + ")"
	}
	return s
}

func flatten(scope string, rules []rbacv1.PolicyRule) []rule {
	var out []rule
	for _, pr := range rules {
		verbs := slices.Sorted(slices.Values(pr.Verbs))
		names := slices.Sorted(slices.Values(pr.ResourceNames))
		for _, g := range pr.APIGroups {
			for _, res := range pr.Resources {
				out = append(out, rule{scope, g, res, strings.Join(names, ","), strings.Join(verbs, ",")})
			}
		}
	}
	return out
}

// TestRBAC: the generated roles grant exactly the rules the controller's
// calls need (a list here, so an excess fails too); the service account
// bound by binding.yaml can do those and not more, by
// SubjectAccessReviews both ways (no Lease outside the election
// namespace, nor another component's in it); and the controller running
// as that account does its whole job: reconciles, exports, updates and
// deletes HyperNodes owned by a SuperNode (with
// OwnerReferencesPermissionEnforcement on), records a Degraded Event and
// is elected by its Lease, its election Event recorded, with no request
// refused.
func TestRBAC(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true,
		APIServerArgs: []string{"--enable-admission-plugins=OwnerReferencesPermissionEnforcement"}})
	installCRD(t, c.RESTConfig(), superNodeCRD)
	installCRD(t, c.RESTConfig(), hyperNodeCRD)
	addExample(t, c, "dev4", nil)
	ctx := t.Context()
	admin := newClient(t, c.RESTConfig())

	roles := manifests(t, roleFile)
	var got []rule
	for _, o := range roles {
		switch r := o.(type) {
		case *rbacv1.ClusterRole:
			got = append(got, flatten("cluster", r.Rules)...)
		case *rbacv1.Role:
			got = append(got, flatten("namespace "+r.Namespace, r.Rules)...)
		default:
			t.Fatalf("%s has a %T", roleFile, o)
		}
	}
	const ns = "namespace " + DefaultLeaderElectionNamespace
	want := []rule{
		{"cluster", "", "nodes", "", "list,patch,watch"},
		{"cluster", "supernode.ubkit.io", "supernodes", "", "create,list,watch"},
		{"cluster", "supernode.ubkit.io", "supernodes/status", "", "update"},
		{"cluster", "supernode.ubkit.io", "supernodes/finalizers", "", "update"},
		{"cluster", "events.k8s.io", "events", "", "create,patch"},
		{"cluster", "topology.volcano.sh", "hypernodes", "", "create,delete,list,update,watch"},
		{ns, "coordination.k8s.io", "leases", "", "create"},
		{ns, "coordination.k8s.io", "leases", managerName, "get,update"},
		{ns, "", "events", "", "create,patch"},
	}
	key := func(a, b rule) int { return strings.Compare(a.String(), b.String()) }
	slices.SortFunc(got, key)
	slices.SortFunc(want, key)
	if !slices.Equal(got, want) {
		t.Errorf("the generated rules are\n\t%s\nwant exactly\n\t%s", join(got), join(want))
	}

	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DefaultLeaderElectionNamespace}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range append(roles, manifests(t, bindingFile)...) {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatalf("apply %T %s: %v", o, o.GetName(), err)
		}
	}

	type access struct {
		ns, group, resource, sub, name, verb string
		allowed                              bool
	}
	review := func(ctx context.Context, tc access) (*authzv1.SubjectAccessReview, error) {
		return c.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User: controllerUser,
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: tc.ns, Group: tc.group, Resource: tc.resource,
				Subresource: tc.sub, Name: tc.name, Verb: tc.verb},
		}}, metav1.CreateOptions{})
	}
	cases := []access{
		{"", "", "nodes", "", "", "list", true},
		{"", "", "nodes", "", "", "watch", true},
		{"", "", "nodes", "", "dev4-n0", "patch", true},
		{"", "supernode.ubkit.io", "supernodes", "", "", "create", true},
		{"", "supernode.ubkit.io", "supernodes", "", "", "list", true},
		{"", "supernode.ubkit.io", "supernodes", "status", "dev4", "update", true},
		{"", "supernode.ubkit.io", "supernodes", "finalizers", "dev4", "update", true},
		{"default", "events.k8s.io", "events", "", "", "create", true},
		{"default", "events.k8s.io", "events", "", "", "patch", true},
		{"", "topology.volcano.sh", "hypernodes", "", "", "list", true},
		{"", "topology.volcano.sh", "hypernodes", "", "", "watch", true},
		{"", "topology.volcano.sh", "hypernodes", "", "", "create", true},
		{"", "topology.volcano.sh", "hypernodes", "", "dev4", "update", true},
		{"", "topology.volcano.sh", "hypernodes", "", "dev4", "delete", true},
		{"ubkit-system", "coordination.k8s.io", "leases", "", "", "create", true},
		{"ubkit-system", "coordination.k8s.io", "leases", "", managerName, "get", true},
		{"ubkit-system", "coordination.k8s.io", "leases", "", managerName, "update", true},
		{"ubkit-system", "", "events", "", "", "create", true},
		{"ubkit-system", "", "events", "", "", "patch", true},

		{"", "", "nodes", "", "dev4-n0", "get", false},
		{"", "", "nodes", "", "dev4-n0", "update", false},
		{"", "", "nodes", "", "dev4-n0", "delete", false},
		{"", "", "nodes", "status", "dev4-n0", "patch", false},
		{"", "supernode.ubkit.io", "supernodes", "", "dev4", "get", false},
		{"", "supernode.ubkit.io", "supernodes", "", "dev4", "update", false},
		{"", "supernode.ubkit.io", "supernodes", "", "dev4", "patch", false},
		{"", "supernode.ubkit.io", "supernodes", "", "dev4", "delete", false},
		{"", "supernode.ubkit.io", "supernodes", "status", "dev4", "patch", false},
		{"", "supernode.ubkit.io", "supernodes", "status", "dev4", "get", false},
		{"", "topology.volcano.sh", "hypernodes", "", "dev4", "get", false},
		{"", "topology.volcano.sh", "hypernodes", "", "dev4", "patch", false},
		{"", "topology.volcano.sh", "hypernodes", "", "", "deletecollection", false},
		{"kube-node-lease", "coordination.k8s.io", "leases", "", "dev4-n0", "get", false},
		{"kube-node-lease", "coordination.k8s.io", "leases", "", "dev4-n0", "update", false},
		{"kube-node-lease", "coordination.k8s.io", "leases", "", "dev4-n0", "delete", false},
		{"kube-node-lease", "coordination.k8s.io", "leases", "", "", "create", false},
		{"kube-system", "coordination.k8s.io", "leases", "", "kube-scheduler", "get", false},
		{"kube-system", "coordination.k8s.io", "leases", "", "kube-scheduler", "update", false},
		{"kube-system", "coordination.k8s.io", "leases", "", managerName, "update", false},
		{"kube-system", "coordination.k8s.io", "leases", "", "", "create", false},
		{"ubkit-system", "coordination.k8s.io", "leases", "", "ubkit-other", "get", false},
		{"ubkit-system", "coordination.k8s.io", "leases", "", "ubkit-other", "update", false},
		{"ubkit-system", "coordination.k8s.io", "leases", "", managerName, "delete", false},
		{"ubkit-system", "coordination.k8s.io", "leases", "", managerName, "patch", false},
		{"ubkit-system", "coordination.k8s.io", "leases", "", "", "list", false},
		{"kube-system", "", "events", "", "", "create", false},
		{"ubkit-system", "", "configmaps", "", "", "create", false},
		{"", "", "secrets", "", "", "get", false},
		{"", "", "secrets", "", "", "list", false},
		{"", "", "pods", "", "", "create", false},
		{"", "rbac.authorization.k8s.io", "clusterroles", "", "", "create", false},
	}
	// The RBAC authorizer reads bindings from the API server's informer
	// cache: they take effect a moment after their Create returned (on a
	// loaded machine, longer). Wait for the first rule each binding
	// grants, then judge every case once.
	poll(t, "the bindings in effect", func(ctx context.Context) (bool, error) {
		for _, tc := range []access{cases[0], {"ubkit-system", "coordination.k8s.io", "leases", "", "", "create", true}} {
			got, err := review(ctx, tc)
			if err != nil || !got.Status.Allowed {
				return false, err
			}
		}
		return true, nil
	})
	for _, tc := range cases {
		got, err := review(ctx, tc)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Allowed != tc.allowed {
			t.Errorf("%s %s %s/%s %q in %q: allowed %v, want %v (%s)", controllerUser, tc.verb, tc.group,
				strings.TrimSuffix(tc.resource+"/"+tc.sub, "/"), tc.name, tc.ns, got.Status.Allowed, tc.allowed, got.Status.Reason)
		}
	}

	// The controller as that account, leader-elected in the Role's
	// namespace (the default).
	cfg, err := c.UserConfig(controllerUser)
	if err != nil {
		t.Fatal(err)
	}
	log, rec := testenv.NewLogRecorder()
	startController(t, cfg, Config{Options: Options{Logger: log}, LeaderElection: true})
	sn := waitSuperNode(t, admin, "dev4", "Ready (reconciled as the bound account)", isReady)
	wantFigures(t, sn, 4, 4, "64Gi", 4, 1, 1)
	hn := dev4HyperNodes()
	poll(t, "the HyperNodes of dev4, made as the bound account", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, admin, hn) })
	// One whose labels are removed, adopted as the bound account.
	stripLabels(t, admin, hn)

	if _, err := c.CrashNode(ctx, "dev4-n1"); err != nil {
		t.Fatal(err)
	}
	poll(t, "a Degraded Event recorded as the bound account", func(ctx context.Context) (bool, error) { return hasEvent(ctx, c, "dev4", EventDegraded) })
	// Rack r1 gone: its HyperNode deleted, dev4 updated.
	for _, n := range []string{"dev4-n2", "dev4-n3"} {
		if err := c.Client().CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	delete(hn, dev4R1)
	hn["dev4"] = hyperNodeShape{2, "HyperNode", []string{dev4R0}}
	poll(t, "rack r1's HyperNode deleted and dev4 updated as the bound account", func(ctx context.Context) (bool, error) { return hyperNodesAre(ctx, admin, hn) })

	lease, err := c.Client().CoordinationV1().Leases(DefaultLeaderElectionNamespace).Get(ctx, managerName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Errorf("the leader election Lease: %+v, %v", lease, err)
	}
	poll(t, "leader election's Event about the Lease", func(ctx context.Context) (bool, error) {
		evs, err := c.Client().CoreV1().Events(DefaultLeaderElectionNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
			return e.InvolvedObject.Kind == "Lease" && e.InvolvedObject.Name == managerName && e.Reason == "LeaderElection"
		}), nil
	})
	for _, l := range rec.Lines() {
		if strings.Contains(strings.ToLower(l), "forbidden") {
			t.Errorf("a request of the controller was refused: %s", l)
		}
	}
	var list v1alpha1.SuperNodeList
	if err := admin.List(ctx, &list); err != nil || len(list.Items) != 1 {
		t.Errorf("SuperNodes: %d, %v; want dev4 alone", len(list.Items), err)
	}
}

func join(rs []rule) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.String()
	}
	return strings.Join(s, "\n\t")
}
