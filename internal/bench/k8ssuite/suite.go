// Package k8ssuite is the `ubctl bench k8s` suite: the SuperNode
// controller (k8s/supernode, run as its command
// k8s/cmd/supernode-controller in a process of its own) against a real
// control plane (etcd, kube-apiserver and kwok from k8stest) whose Nodes
// kwok simulates.
//
// Each run deletes every SuperNode, starts a new controller process, and
// times until every SuperNode's status is correct (all members counted
// and Ready, for the current generation), read from a watch on the
// apiserver; then it stops the controller. The Nodes exist and are Ready
// before the clock starts: they are made once per scale and shared by
// the runs.
//
// Cases (there is no baseline: the figures are held to targets):
//
//   - supernode-reconcile-cm384 (ms): cm384's 48 nodes, one SuperNode;
//     target under 1,000 ms.
//   - supernode-reconcile-5000 (ms): 5,000 nodes in 100 super nodes of
//     50; target under 5,000 ms.
//   - supernode-rss-5000 (MiB): the controller's resident memory once it
//     has reconciled those 5,000 nodes; target under 200 MiB.
package k8ssuite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/osproc"
	"github.com/ubkit-io/ubkit/internal/procstat"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/k8s/config"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
	"github.com/ubkit-io/ubkit/k8s/supernode"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// The large scale of the cases named -5000, and the targets.
const (
	SuperNodes        = 100
	NodesPerSuperNode = 50

	targetCM384Ms = 1000
	target5000Ms  = 5000
	targetRSSMiB  = 200
)

// runTimeout bounds one run: starting the controller and its reconcile.
const runTimeout = 5 * time.Minute

// Env holds the control plane of the current scale, started on first use
// and shared by the runs of that scale.
type Env struct {
	// SuperNodes and NodesPerSuperNode are the large scale; 0 means
	// SuperNodes and NodesPerSuperNode (5,000 nodes). Tests make it small;
	// the cases keep their names.
	SuperNodes, NodesPerSuperNode int

	mu      sync.Mutex
	scale   string
	cluster *k8stest.Cluster
	client  client.WithWatch
	want    map[string]int32 // members of each SuperNode at this scale
}

// controllerPeer is the peer role that runs the controller: what
// k8s/cmd/supernode-controller runs with its default flags (supernode.Run
// with the default rate limit and workers), leader election, metrics and
// probes off, in a process of its own so that its RSS is its own.
const controllerPeer = "supernode-controller"

type controllerArgs struct {
	Kubeconfig string `json:"kubeconfig"`
	Log        string `json:"log"`
}

func init() {
	bench.RegisterPeer(controllerPeer, func(raw json.RawMessage) error {
		var a controllerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		logFile, err := os.OpenFile(a.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer logFile.Close()
		log := slog.New(slog.NewTextHandler(logFile, nil))
		ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
		cfg, err := clientcmd.BuildConfigFromFlags("", a.Kubeconfig)
		if err != nil {
			return err
		}
		ctx, stop := osproc.StopContext(context.Background())
		defer stop()
		return supernode.Run(ctx, cfg, supernode.Config{Options: supernode.Options{Logger: log}, MetricsAddr: "0", HealthAddr: "0"})
	})
}

// Close stops the control plane.
func (e *Env) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closeLocked()
}

func (e *Env) closeLocked() {
	if e.cluster != nil {
		e.cluster.Close()
	}
	e.cluster, e.client, e.scale, e.want = nil, nil, "", nil
}

// Cases returns the suite's cases.
func (e *Env) Cases() []bench.Case {
	verdict := func(target float64, unit string) func(bench.Result) string {
		return func(r bench.Result) string {
			if r.Value < target {
				return fmt.Sprintf("under the target of %.0f %s", target, unit)
			}
			return fmt.Sprintf("MISSED the target of %.0f %s by %.0f %s", target, unit, r.Value-target, unit)
		}
	}
	return []bench.Case{
		{
			Name: "supernode-reconcile-cm384", Unit: "ms", Better: "lower", Verdict: verdict(targetCM384Ms, "ms"),
			Contenders: []bench.Contender{{Name: "ubkit", Run: func(time.Duration) (bench.Measurement, error) {
				ms, _, err := e.run("cm384")
				return bench.Measurement{Value: ms}, err
			}}},
		},
		{
			Name: "supernode-reconcile-5000", Unit: "ms", Better: "lower", Verdict: verdict(target5000Ms, "ms"),
			Contenders: []bench.Contender{{Name: "ubkit", Run: func(time.Duration) (bench.Measurement, error) {
				ms, _, err := e.run("5000")
				return bench.Measurement{Value: ms}, err
			}}},
		},
		{
			Name: "supernode-rss-5000", Unit: "MiB", Better: "lower", Verdict: verdict(targetRSSMiB, "MiB"),
			Contenders: []bench.Contender{{Name: "ubkit", Run: func(time.Duration) (bench.Measurement, error) {
				_, rss, err := e.run("5000")
				return bench.Measurement{Value: float64(rss) / (1 << 20)}, err
			}}},
		},
	}
}

// topologies are the super nodes of a scale.
func (e *Env) topologies(scale string) ([]*topology.Topology, error) {
	if scale == "cm384" {
		t, err := topology.Example("cm384")
		return []*topology.Topology{t}, err
	}
	sns, per := e.SuperNodes, e.NodesPerSuperNode
	if sns <= 0 {
		sns = SuperNodes
	}
	if per <= 0 {
		per = NodesPerSuperNode
	}
	var topos []*topology.Topology
	for i := range sns {
		nodes := []topology.Node{{Name: "sw", Kind: topology.Switch}}
		var links []topology.Link
		for j := range per {
			n := fmt.Sprintf("n%02d", j)
			nodes = append(nodes, topology.Node{
				Name: n, CPUs: 64, MemoryBytes: 256 << 30,
				Devices: []topology.Device{{Kind: topology.NPU, Count: 8, MemoryBytes: 64 << 30}},
				Labels:  map[string]string{"rack": fmt.Sprintf("r%d", j/8)},
			})
			links = append(links, topology.Link{A: n, B: "sw", Bandwidth: 50e9, Latency: time.Microsecond})
		}
		t, err := topology.New(fmt.Sprintf("sn%03d", i), nodes, links)
		if err != nil {
			return nil, err
		}
		topos = append(topos, t)
	}
	return topos, nil
}

// setup makes the control plane of scale, with its Nodes Ready, unless
// it is the current one; it replaces that of another scale. A set-up
// that fails is undone, so that the next run starts again.
func (e *Env) setup(ctx context.Context, scale string) (err error) {
	if e.scale == scale {
		return nil
	}
	e.closeLocked()
	defer func() {
		if err != nil {
			e.closeLocked()
		}
	}()
	topos, err := e.topologies(scale)
	if err != nil {
		return err
	}
	c, err := k8stest.StartControlPlane(ctx, k8stest.Config{Kwok: true})
	if err != nil {
		return err
	}
	e.cluster = c
	if err := InstallCRD(ctx, c.RESTConfig(), config.SuperNodeCRD); err != nil {
		return err
	}
	s, err := supernode.Scheme()
	if err != nil {
		return err
	}
	// The client logs through controller-runtime's global logger, which
	// complains at length if nothing set it.
	ctrllog.SetLogger(logr.Discard())
	if e.client, err = client.NewWithWatch(c.RESTConfig(), client.Options{Scheme: s}); err != nil {
		return err
	}
	e.want = map[string]int32{}
	// A few super nodes at a time: creating Nodes is what takes long.
	errs := make(chan error, len(topos))
	sem := make(chan struct{}, 8)
	for _, t := range topos {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			_, err := c.AddNodes(ctx, t, k8stest.NodeOptions{Timeout: 10 * time.Minute})
			errs <- err
		}()
		members := int32(0)
		for i := range t.Nodes {
			if !t.Nodes[i].IsSwitch() {
				members++
			}
		}
		e.want[t.Name] = members
	}
	var all []error
	for range topos {
		all = append(all, <-errs)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	e.scale = scale
	return nil
}

// run makes the scale's Nodes if they are not there, deletes the
// SuperNodes, then starts a controller process and returns the time
// until every SuperNode is correct, in ms, and the controller's RSS then.
func (e *Env) run(scale string) (ms float64, rss int64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout+10*time.Minute)
	defer cancel()
	if err := e.setup(ctx, scale); err != nil {
		return 0, 0, err
	}
	ctx, cancel = context.WithTimeout(ctx, runTimeout)
	defer cancel()
	if err := e.client.DeleteAllOf(ctx, &v1alpha1.SuperNode{}); err != nil {
		return 0, 0, err
	}
	// Wait until they are gone, then watch from there.
	w, err := e.watchFromEmpty(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer w.Stop()

	log := filepath.Join(e.cluster.Dir(), "supernode-controller.log")
	began := time.Now()
	peer, err := bench.StartPeer(controllerPeer, controllerArgs{Kubeconfig: e.cluster.Kubeconfig(), Log: log})
	if err != nil {
		return 0, 0, err
	}
	defer peer.Kill()
	exited := peer.Done()

	correct := map[string]bool{}
	for len(correct) < len(e.want) {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return 0, 0, fmt.Errorf("the SuperNode watch ended with %d of %d correct", len(correct), len(e.want))
			}
			sn, isSN := ev.Object.(*v1alpha1.SuperNode)
			if !isSN {
				continue
			}
			if ev.Type != watch.Deleted && isCorrect(sn, e.want[sn.Name]) {
				correct[sn.Name] = true
			} else {
				delete(correct, sn.Name)
			}
		case <-exited:
			return 0, 0, fmt.Errorf("supernode-controller exited: %v; its log:\n%s", peer.Err(), tail(log))
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("%d of %d SuperNodes correct: %w; the controller's log:\n%s", len(correct), len(e.want), ctx.Err(), tail(log))
		}
	}
	ms = float64(time.Since(began)) / float64(time.Millisecond)
	u, err := procstat.Of(peer.PID())
	if err != nil {
		return 0, 0, err
	}
	return ms, u.RSS, nil
}

// tail is the end of a log file, for an error message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// watchFromEmpty waits until no SuperNode is left and returns a watch
// that starts there.
func (e *Env) watchFromEmpty(ctx context.Context) (watch.Interface, error) {
	for {
		var list v1alpha1.SuperNodeList
		if err := e.client.List(ctx, &list); err != nil {
			return nil, err
		}
		w, err := e.client.Watch(ctx, &v1alpha1.SuperNodeList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		if err != nil {
			return nil, err
		}
		if len(list.Items) == 0 {
			return w, nil
		}
		// Wait for the deletions the list still showed.
		left := len(list.Items)
		for left > 0 {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					left = -1
					break
				}
				if ev.Type == watch.Deleted {
					left--
				}
			case <-ctx.Done():
				w.Stop()
				return nil, ctx.Err()
			}
		}
		if left == 0 {
			return w, nil
		}
		w.Stop()
	}
}

// isCorrect: the controller has counted all members Ready, for the
// current generation.
func isCorrect(sn *v1alpha1.SuperNode, members int32) bool {
	st := sn.Status
	return st.ObservedGeneration == sn.Generation && st.Phase == v1alpha1.PhaseReady &&
		st.MemberCount == members && st.ReadyCount == members
}

// InstallCRD creates the CRD in crdYAML and waits until it is
// Established. ubctl's demo uses it too.
func InstallCRD(ctx context.Context, cfg *rest.Config, crdYAML []byte) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(crdYAML, crd); err != nil {
		return err
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("install CRD %s: %w", crd.Name, err)
	}
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not Established: %w", crd.Name, err)
	}
	return nil
}
