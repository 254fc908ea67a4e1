package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ubkit-io/ubkit/internal/bench/k8ssuite"
	"github.com/ubkit-io/ubkit/internal/osproc"
	v1alpha1 "github.com/ubkit-io/ubkit/k8s/api/v1alpha1"
	"github.com/ubkit-io/ubkit/k8s/config"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
	"github.com/ubkit-io/ubkit/k8s/supernode"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// demoK8sTimeout bounds the whole Kubernetes demo; a loaded machine
// takes most of a minute to start the control plane.
const demoK8sTimeout = 5 * time.Minute

// k8sBinaries returns the directory of the binaries the Kubernetes demo
// and bench run (k8stest.DefaultBinDir) and those missing from it.
func k8sBinaries() (dir string, missing []string, err error) {
	if dir, err = k8stest.DefaultBinDir(); err != nil {
		return "", nil, err
	}
	missing, err = k8stest.Missing(dir)
	return dir, missing, err
}

// errK8sNotCached is the error of a Kubernetes step that does not build
// the binaries: what is missing and the commands that build them.
func errK8sNotCached(dir string, missing []string) error {
	return fmt.Errorf("%w in %s (missing %s); build them once with `ubctl demo k8s` or `make prereqs` "+
		"(it compiles Kubernetes %s, etcd %s and kwok %s from their Go modules: about 15 minutes the first time)",
		errK8sBinaries, dir, strings.Join(missing, ", "), k8stest.KubernetesVersion, k8stest.EtcdVersion, k8stest.KwokVersion)
}

var errK8sBinaries = errors.New("the Kubernetes binaries are not cached")

// ensureK8sBinaries builds the binaries that are missing, once, saying
// on w what it builds and how long it took. An interrupt stops the build
// (what was complete stays).
func ensureK8sBinaries(w io.Writer) error {
	dir, missing, err := k8sBinaries()
	if err != nil || len(missing) == 0 {
		return err
	}
	fmt.Fprintf(w, "\nThe Kubernetes binaries are not cached in %s (missing %s).\n"+
		"Building them once from their Go modules (Kubernetes %s, etcd %s, kwok %s): about 15 minutes the first time; later runs reuse them.\n",
		dir, strings.Join(missing, ", "), k8stest.KubernetesVersion, k8stest.EtcdVersion, k8stest.KwokVersion)
	ctx, stop := osproc.StopContext(context.Background())
	defer stop()
	began := time.Now()
	if err := k8stest.Build(ctx, dir, &indent{w: w, prefix: "  "}); err != nil {
		return err
	}
	fmt.Fprintf(w, "  built in %s\n", time.Since(began).Round(time.Second))
	return nil
}

// indent writes each line with a prefix.
type indent struct {
	w      io.Writer
	prefix string
	mid    bool // within a line
}

func (d *indent) Write(p []byte) (int, error) {
	var b []byte
	for _, c := range p {
		if !d.mid {
			b = append(b, d.prefix...)
		}
		b = append(b, c)
		d.mid = c != '\n'
	}
	if _, err := d.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// demoK8s shows a simulated cm384 super node as Kubernetes sees it: a
// real control plane with kwok, the SuperNode CRD and controller, 48
// simulated Nodes, then one lost and found again. It builds the binaries
// first if they are not cached.
func demoK8s(w io.Writer) error {
	if err := ensureK8sBinaries(w); err != nil {
		return err
	}
	// controller-runtime's clients log through its global logger, which
	// complains at length on stderr if nothing set it.
	ctrllog.SetLogger(logr.Discard())
	// An interrupt ends the demo through ctx, so that the deferred Close
	// stops the control plane and removes its files.
	sigCtx, stopSignals := osproc.StopContext(context.Background())
	defer stopSignals()
	ctx, cancel := context.WithTimeout(sigCtx, demoK8sTimeout)
	defer cancel()

	fmt.Fprintf(w, "\nKubernetes %s (etcd, kube-apiserver and kwok, real processes on loopback), the SuperNode controller, a simulated cm384:\n", k8stest.KubernetesVersion)
	began := time.Now()
	c, err := k8stest.StartControlPlane(ctx, k8stest.Config{Kwok: true})
	if err != nil {
		return err
	}
	defer c.Close()
	cfg := c.RESTConfig()
	if err := k8ssuite.InstallCRD(ctx, cfg, config.SuperNodeCRD); err != nil {
		return err
	}
	fmt.Fprintf(w, "  control plane up, SuperNode CRD installed in %s\n", time.Since(began).Round(100*time.Millisecond))

	stop, err := runController(ctx, cfg)
	if err != nil {
		return err
	}
	defer stop()

	topo, err := topology.Example("cm384")
	if err != nil {
		return err
	}
	began = time.Now()
	nodes, err := c.AddNodes(ctx, topo, k8stest.NodeOptions{})
	if err != nil {
		return err
	}
	cl, err := superNodeClient(cfg)
	if err != nil {
		return err
	}
	if _, err := waitSuperNode(ctx, cl, topo.Name, superNodeReady); err != nil {
		return err
	}
	fmt.Fprintf(w, "  %d kwok nodes Ready and SuperNode %s reconciled in %s\n\n$ kubectl get supernodes\n", len(nodes), topo.Name, time.Since(began).Round(10*time.Millisecond))
	if err := printSuperNodes(ctx, w, c.Client()); err != nil {
		return err
	}

	lost := nodes[len(nodes)/2].Name
	fmt.Fprintf(w, "\nnode %s fails (kwok reports it NotReady)\n", lost)
	began = time.Now()
	if _, err := c.CrashNode(ctx, lost); err != nil {
		return err
	}
	sn, err := waitSuperNode(ctx, cl, topo.Name, func(sn *v1alpha1.SuperNode) bool {
		d := condition(sn, v1alpha1.ConditionDegraded)
		return d.Status == metav1.ConditionTrue && strings.Contains(d.Message, lost)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "  SuperNode Degraded after %s\n\n$ kubectl get supernodes\n", time.Since(began).Round(10*time.Millisecond))
	if err := printSuperNodes(ctx, w, c.Client()); err != nil {
		return err
	}
	d := condition(sn, v1alpha1.ConditionDegraded)
	fmt.Fprintf(w, "  Degraded: %s (%s)\n", d.Message, d.Reason)
	for _, m := range sn.Status.Members {
		if m.Health != v1alpha1.MemberReady {
			fmt.Fprintf(w, "  member %s: %s %s\n", m.Name, m.Health, m.Reason)
		}
	}

	fmt.Fprintf(w, "\nnode %s recovers\n", lost)
	began = time.Now()
	if _, err := c.RecoverNode(ctx, lost); err != nil {
		return err
	}
	if _, err := waitSuperNode(ctx, cl, topo.Name, superNodeReady); err != nil {
		return err
	}
	fmt.Fprintf(w, "  SuperNode Ready again after %s\n\n$ kubectl get supernodes\n", time.Since(began).Round(10*time.Millisecond))
	return printSuperNodes(ctx, w, c.Client())
}

// runController runs the SuperNode controller in this process until
// stop, which waits until it has stopped.
func runController(ctx context.Context, cfg *rest.Config) (stop func(), err error) {
	mgr, err := supernode.NewManager(cfg, supernode.Config{Options: supernode.Options{Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		<-done
	}, nil
}

func superNodeClient(cfg *rest.Config) (client.Client, error) {
	s, err := supernode.Scheme()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: s})
}

// waitSuperNode waits until SuperNode name exists and ok says its status
// is as wanted, and returns it.
func waitSuperNode(ctx context.Context, cl client.Client, name string, ok func(*v1alpha1.SuperNode) bool) (*v1alpha1.SuperNode, error) {
	sn := &v1alpha1.SuperNode{}
	var last error
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if last = cl.Get(ctx, client.ObjectKey{Name: name}, sn); last != nil {
			return false, nil
		}
		return ok(sn), nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for SuperNode %s (phase %q, %d/%d ready): %w", name, sn.Status.Phase, sn.Status.ReadyCount, sn.Status.MemberCount, errors.Join(err, last))
	}
	return sn, nil
}

// superNodeReady: the controller has seen every member Ready.
func superNodeReady(sn *v1alpha1.SuperNode) bool {
	return sn.Status.ObservedGeneration == sn.Generation && sn.Status.Phase == v1alpha1.PhaseReady &&
		sn.Status.MemberCount > 0 && sn.Status.ReadyCount == sn.Status.MemberCount &&
		condition(sn, v1alpha1.ConditionReady).Status == metav1.ConditionTrue
}

func condition(sn *v1alpha1.SuperNode, typ string) metav1.Condition {
	for _, c := range sn.Status.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return metav1.Condition{}
}

// printSuperNodes prints the SuperNodes as kubectl get supernodes does:
// the apiserver's own table of them (the CRD's printer columns, those of
// priority 0), the creation time as an age.
func printSuperNodes(ctx context.Context, w io.Writer, kc kubernetes.Interface) error {
	raw, err := kc.Discovery().RESTClient().Get().
		AbsPath("/apis", v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version, "supernodes").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		Do(ctx).Raw()
	if err != nil {
		return fmt.Errorf("get supernodes: %w", err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		return fmt.Errorf("get supernodes: the apiserver's table: %w", err)
	}
	if table.Kind != "Table" {
		return fmt.Errorf("get supernodes: the apiserver answered a %q, not a Table", table.Kind)
	}
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	var shown []int
	var head []string
	for i, col := range table.ColumnDefinitions {
		if col.Priority == 0 {
			shown = append(shown, i)
			head = append(head, strings.ToUpper(col.Name))
		}
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, row := range table.Rows {
		var cells []string
		for _, i := range shown {
			if i >= len(row.Cells) {
				cells = append(cells, "")
				continue
			}
			cells = append(cells, tableCell(table.ColumnDefinitions[i], row.Cells[i]))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// tableCell is a cell as kubectl prints it: a date as the time since, an
// absent value as <none>.
func tableCell(col metav1.TableColumnDefinition, v any) string {
	if v == nil {
		return "<none>"
	}
	if s, ok := v.(string); ok && col.Type == "date" {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			return duration.HumanDuration(time.Since(t))
		}
	}
	return fmt.Sprint(v)
}
