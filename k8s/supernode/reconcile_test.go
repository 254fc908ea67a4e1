package supernode

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/ubkit-io/ubkit/internal/testenv"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

// fakeReconciler is a Reconciler on controller-runtime's fake client,
// with funcs intercepting its calls, holding objs; it exports no
// HyperNodes.
func fakeReconciler(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) (*Reconciler, *events.FakeRecorder, client.Client) {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.SuperNode{}).
		WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
	rec := events.NewFakeRecorder(100)
	log, _ := testenv.NewLogRecorder()
	return &Reconciler{client: c, reader: c, recorder: rec, log: log, noHyper: true}, rec, c
}

// recorded drains the Events rec has recorded.
func recorded(rec *events.FakeRecorder) []string {
	var evs []string
	for {
		select {
		case e := <-rec.Events:
			evs = append(evs, e)
		default:
			return evs
		}
	}
}

var snKey = reconcile.Request{NamespacedName: client.ObjectKey{Name: "sn"}}

// A status update that fails, by a conflict or otherwise, records no
// Event: nothing changed. The update that succeeds records the
// transition once, and a reconcile after it none.
func TestNoEventUnlessStatusSaved(t *testing.T) {
	nodes := []corev1.Node{
		member("a", corev1.ConditionTrue, "1Gi", 0, ""),
		member("b", corev1.ConditionTrue, "1Gi", 0, ""),
	}
	sn := superNode(computeStatus(superNode(v1alpha1.SuperNodeStatus{}), nodes))
	sn.Generation = 0
	b := member("b", corev1.ConditionFalse, "1Gi", 0, "")
	failures := []error{
		apierrors.NewConflict(schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "supernodes"}, "sn", errors.New("the object has been modified")),
		errors.New("the apiserver is unavailable"),
	}
	updates := 0
	r, rec, _ := fakeReconciler(t, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			updates++
			if len(failures) > 0 {
				err := failures[0]
				failures = failures[1:]
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}, sn, &nodes[0], &b)

	for i := range 2 {
		if _, err := r.Reconcile(t.Context(), snKey); err == nil {
			t.Fatalf("reconcile %d: no error from a failed status update", i+1)
		}
		if evs := recorded(rec); len(evs) > 0 {
			t.Errorf("reconcile %d: the status update failed, yet Events were recorded: %q", i+1, evs)
		}
	}
	if _, err := r.Reconcile(t.Context(), snKey); err != nil {
		t.Fatal(err)
	}
	if evs := recorded(rec); len(evs) != 1 || !strings.HasPrefix(evs[0], corev1.EventTypeWarning+" "+EventDegraded+" ") {
		t.Errorf("the status saved: Events %q, want one Degraded", evs)
	}
	if _, err := r.Reconcile(t.Context(), snKey); err != nil {
		t.Fatal(err)
	}
	if evs := recorded(rec); len(evs) > 0 {
		t.Errorf("nothing changed, yet Events %q", evs)
	}
	if updates != 3 {
		t.Errorf("%d status updates, want 3 (two failed, one saved, none when unchanged)", updates)
	}
}
