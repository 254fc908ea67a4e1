package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ubkit-io/ubkit/internal/bench/k8ssuite"
	"github.com/ubkit-io/ubkit/internal/testenv"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/k8s/config"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
	"github.com/ubkit-io/ubkit/k8s/supernode"
	"github.com/ubkit-io/ubkit/ub/topology"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for the controller's logging and the
// test's reading at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// The command as a Deployment runs it: from a kubeconfig, leader-elected,
// with its probes and metrics; it reconciles dev4, its metrics count the
// members by health, and when told to stop it exits 0 and hands the
// Lease back.
func TestCommand(t *testing.T) {
	c := k8stest.Start(t, k8stest.Config{Kwok: true})
	ctx := t.Context()
	if err := k8ssuite.InstallCRD(ctx, c.RESTConfig(), config.SuperNodeCRD); err != nil {
		t.Fatal(err)
	}
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddNodes(ctx, topo, k8stest.NodeOptions{}); err != nil {
		t.Fatal(err)
	}
	metrics, health := freeAddr(t), freeAddr(t)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var logs syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(runCtx, []string{"-kubeconfig", c.Kubeconfig(), "-leader-elect", "-leader-elect-namespace", "default",
			"-metrics-bind-address", metrics, "-health-probe-bind-address", health}, &logs)
	}()

	s, err := supernode.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.RESTConfig(), client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case code := <-exited:
			return false, fmt.Errorf("the controller exited with %d", code)
		default:
		}
		var sn v1alpha1.SuperNode
		if err := cl.Get(ctx, client.ObjectKey{Name: "dev4"}, &sn); err != nil {
			last = err.Error()
			return false, nil
		}
		if sn.Status.Phase != v1alpha1.PhaseReady {
			last = "phase " + sn.Status.Phase
			return false, nil
		}
		code, body, err := get(ctx, "http://"+metrics+"/metrics")
		if err != nil || code != http.StatusOK {
			last = fmt.Sprintf("metrics: %d %v", code, err)
			return false, nil
		}
		last = "metrics lack dev4's 4 Ready members"
		return strings.Contains(body, `ubkit_supernode_members{health="Ready",supernode="dev4"} 4`) &&
			strings.Contains(body, `ubkit_supernode_reconciles_total{result="success"}`), nil
	})
	if err != nil {
		t.Fatalf("dev4 Ready and counted in the metrics: %v (last: %s)\n%s", err, last, logs.String())
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, body, err := get(ctx, "http://"+health+p); err != nil || code != http.StatusOK {
			t.Errorf("%s: %d %q %v", p, code, body, err)
		}
	}
	lease, err := c.Client().CoordinationV1().Leases("default").Get(ctx, "ubkit-supernode-controller", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("the Lease while running: %+v, %v", lease, err)
	}

	stop()
	select {
	case code := <-exited:
		if code != 0 {
			t.Errorf("stopped, it exited with %d:\n%s", code, logs.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the controller did not stop within a minute of its context's end:\n%s", logs.String())
	}
	lease, err = c.Client().CoordinationV1().Leases("default").Get(ctx, "ubkit-supernode-controller", metav1.GetOptions{})
	if err != nil || (lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "") {
		t.Errorf("the Lease after stopping still held: %+v, %v", lease.Spec, err)
	}
}

// Bad flags and a bad kubeconfig exit 2 saying why, without starting.
func TestCommandBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-no-such-flag"}, "no-such-flag"},
		{[]string{"-kube-api-qps", "many"}, "kube-api-qps"},
		{[]string{"-missing-member-grace", "a while"}, "missing-member-grace"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-kubeconfig", "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig"},
	} {
		var out bytes.Buffer
		if code := run(t.Context(), tc.args, &out); code != 2 || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%q: exit %d, %q; want 2 naming %q", tc.args, code, out.String(), tc.want)
		}
	}
}
