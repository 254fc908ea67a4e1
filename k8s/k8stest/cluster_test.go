package k8stest

import (
	"context"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// etcd and the apiserver alone: namespaces, and RBAC for a user with no
// rights until a RoleBinding gives some.
func TestStartRBAC(t *testing.T) {
	c := Start(t, Config{})
	ctx := testContext(t)
	admin := c.Client()
	ns, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := admin.Discovery().ServerVersion(); err != nil || v.GitVersion != KubernetesVersion {
		t.Errorf("server version %v (%v), want %s", v, err, KubernetesVersion)
	}

	cfg, err := c.UserConfig("alice", "developers")
	if err != nil {
		t.Fatal(err)
	}
	alice := kubernetes.NewForConfigOrDie(cfg)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"k": "v"}}
	if _, err := alice.CoreV1().ConfigMaps(ns.Name).Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice, who has no rights, created a ConfigMap: err %v, want Forbidden", err)
	}
	review := func() *authorizationv1.SubjectAccessReview {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "alice", Groups: []string{"developers", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns.Name, Verb: "create", Resource: "configmaps"},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sar
	}
	if sar := review(); sar.Status.Allowed {
		t.Fatalf("SubjectAccessReview allows alice to create ConfigMaps before any binding: %+v", sar.Status)
	}

	// The group, not the user, gets a role in the namespace. (Not the
	// built-in edit: its rules are aggregated by the controller-manager,
	// which does not run here.)
	if _, err := admin.RbacV1().Roles(ns.Name).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get", "list"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns.Name).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "developers-configmaps"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmaps"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "developers"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The RBAC authorizer reads bindings from the API server's informer
	// cache: a new binding takes effect once the cache has it, a moment
	// after its Create returned (on a loaded machine, longer).
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; <-tick.C {
		sar := review()
		if sar.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("SubjectAccessReview still denies alice 30 s after the binding: %+v", sar.Status)
		}
	}
	if _, err := alice.CoreV1().ConfigMaps(ns.Name).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("alice cannot create a ConfigMap after the binding: %v", err)
	}
	if _, err := alice.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice created a ConfigMap outside her namespace: err %v, want Forbidden", err)
	}
}

// The whole control plane with kwok: dev4's and cm384's nodes Ready, a
// Deployment placed by the real scheduler on the nodes with NPUs, and a
// node that crashes and recovers.
func TestNodesDeploymentCrash(t *testing.T) {
	c := Start(t, Config{ControllerManager: true, Scheduler: true, Kwok: true})
	ctx := testContext(t)
	client := c.Client()

	dev4, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := c.AddNodes(ctx, dev4, NodeOptions{HugePages2Mi: 512 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if !nodeReady(n) || slices.ContainsFunc(n.Spec.Taints, notReadyTaint) {
			t.Errorf("node %s: not Ready or still tainted: %+v %+v", n.Name, n.Status.Conditions, n.Spec.Taints)
		}
	}
	got, err := client.CoreV1().Nodes().Get(ctx, NodeName(dev4, "n0"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if q := got.Status.Allocatable[ResourceNPU]; q.Value() != 2 {
		t.Errorf("dev4-n0 allocatable %s = %s after kwok took it over, want 2", ResourceNPU, q.String())
	}
	if got.Labels[LabelSuperNode] != "dev4" || got.Labels[LabelNode] != "n0" {
		t.Errorf("dev4-n0 labels %v", got.Labels)
	}

	cm384, err := topology.Example("cm384")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	big, err := c.AddNodes(ctx, cm384, NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d cm384 nodes Ready in %v", len(big), time.Since(start).Round(time.Millisecond))

	// Four pods of one NPU each on dev4: only n0 and n1 have NPUs, two
	// each, so the scheduler must put two on each.
	ns := "apps"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	replicas := int32(4)
	labels := map[string]string{"app": "infer"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "infer"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{LabelSuperNode: "dev4"},
					Containers: []corev1.Container{{
						Name: "infer", Image: "registry.invalid/infer:1",
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), ResourceNPU: resource.MustParse("1")},
							Limits:   corev1.ResourceList{ResourceNPU: resource.MustParse("1")},
						},
					}},
				},
			},
		},
	}
	if _, err := client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, cache.NewListWatchFromClient(client.AppsV1().RESTClient(), "deployments", ns, fields.OneTermEqualSelector("metadata.name", dep.Name)),
		&appsv1.Deployment{}, "Deployment infer available", func(obj runtime.Object) bool {
			d := obj.(*appsv1.Deployment)
			return d.Status.ReadyReplicas == replicas && d.Status.AvailableReplicas == replicas
		})
	pods, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s is %s, want Running", p.Name, p.Status.Phase)
		}
		perNode[p.Spec.NodeName]++
	}
	if want := map[string]int{"dev4-n0": 2, "dev4-n1": 2}; len(pods.Items) != 4 || perNode["dev4-n0"] != 2 || perNode["dev4-n1"] != 2 {
		t.Errorf("pods per node %v, want %v", perNode, want)
	}

	// n0 crashes: NotReady, then tainted by the controller-manager; back
	// again, it is Ready and untainted.
	crashed, err := c.CrashNode(ctx, "dev4-n0")
	if err != nil {
		t.Fatal(err)
	}
	if nodeReady(crashed) {
		t.Fatalf("dev4-n0 Ready after CrashNode")
	}
	waitFor(ctx, t, cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes", "", fields.OneTermEqualSelector("metadata.name", "dev4-n0")),
		&corev1.Node{}, "dev4-n0 tainted not-ready", func(obj runtime.Object) bool {
			return slices.ContainsFunc(obj.(*corev1.Node).Spec.Taints, notReadyTaint)
		})
	other, err := client.CoreV1().Nodes().Get(ctx, "dev4-n1", metav1.GetOptions{})
	if err != nil || !nodeReady(other) {
		t.Errorf("dev4-n1 not Ready while n0 is down (%v)", err)
	}
	recovered, err := c.RecoverNode(ctx, "dev4-n0")
	if err != nil {
		t.Fatal(err)
	}
	if !nodeReady(recovered) || slices.ContainsFunc(recovered.Spec.Taints, notReadyTaint) {
		t.Fatalf("dev4-n0 after RecoverNode: %+v %+v", recovered.Status.Conditions, recovered.Spec.Taints)
	}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor watches the objects lw lists until one satisfies ok.
func waitFor(ctx context.Context, t *testing.T, lw cache.ListerWatcher, obj runtime.Object, what string, ok func(runtime.Object) bool) {
	t.Helper()
	if _, err := watchtools.UntilWithSync(ctx, lw, obj, nil, func(ev watch.Event) (bool, error) {
		return ev.Type != watch.Deleted && ok(ev.Object), nil
	}); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
