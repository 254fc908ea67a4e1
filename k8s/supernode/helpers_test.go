package supernode

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ubkit-io/ubkit/internal/testenv"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
)

const (
	superNodeCRD = "../config/crd/supernode.ubkit.io_supernodes.yaml"
	hyperNodeCRD = "testdata/hypernode-crd.yaml"
	waitBound    = 90 * time.Second
)

// installCRD creates the CRD of file and waits until it is Established.
func installCRD(t *testing.T, cfg *rest.Config, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("install %s: %v", file, err)
	}
	poll(t, "CRD "+crd.Name+" Established", func(ctx context.Context) (bool, error) {
		got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// poll waits, with a bound, until cond is true.
func poll(t *testing.T, what string, cond wait.ConditionWithContextFunc) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, waitBound, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		if err != nil {
			last = err
			return false, nil
		}
		return ok, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last error: %v)", what, err, last)
	}
}

// startController runs the controller against cfg until the test ends,
// and returns a function that stops it and waits until it has.
func startController(t *testing.T, cfg *rest.Config, c Config) (stop func()) {
	t.Helper()
	if c.Logger == nil {
		c.Logger, _ = testenv.NewLogRecorder()
	}
	mgr, err := NewManager(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("controller: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitSuperNode waits until SuperNode name exists and ok says its status
// is as wanted, and returns it.
func waitSuperNode(t *testing.T, c client.Client, name, what string, ok func(*v1alpha1.SuperNode) bool) *v1alpha1.SuperNode {
	t.Helper()
	sn := &v1alpha1.SuperNode{}
	poll(t, "SuperNode "+name+" "+what, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, sn); err != nil {
			return false, err
		}
		return ok(sn), nil
	})
	return sn
}

func condition(sn *v1alpha1.SuperNode, typ string) metav1.Condition {
	for _, c := range sn.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

func isReady(sn *v1alpha1.SuperNode) bool {
	return sn.Status.ObservedGeneration == sn.Generation && condition(sn, v1alpha1.ConditionReady).Status == metav1.ConditionTrue &&
		condition(sn, v1alpha1.ConditionDegraded).Status == metav1.ConditionFalse
}

func degradedNaming(member string) func(*v1alpha1.SuperNode) bool {
	return func(sn *v1alpha1.SuperNode) bool {
		d := condition(sn, v1alpha1.ConditionDegraded)
		return d.Status == metav1.ConditionTrue && strings.Contains(d.Message, member) &&
			condition(sn, v1alpha1.ConditionReady).Status == metav1.ConditionFalse
	}
}
