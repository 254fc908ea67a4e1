// Command supernode-controller runs ubkit's SuperNode controller
// (k8s/supernode): one SuperNode per value of the Nodes'
// supernode.ubkit.io/id label, its status the super node in one view.
// Install k8s/config/crd and k8s/config/rbac (its roles and their
// bindings to the service account ubkit-system/ubkit-supernode-controller)
// first (docs/k8s.md).
//
//	supernode-controller [-kubeconfig FILE] [-leader-elect] [-metrics-bind-address :8080]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ubkit-io/ubkit/k8s/supernode"
)

func main() {
	ctx := ctrl.SetupSignalHandler() // SIGINT or SIGTERM: stop, releasing the lease
	os.Exit(run(ctx, os.Args[1:], os.Stderr))
}

// run runs the controller with the command's arguments until ctx ends,
// logging to stderr, and returns the exit status: 0 when stopped, 1 when
// the controller failed, 2 for a bad flag or kubeconfig.
func run(ctx context.Context, args []string, stderr io.Writer) int {
	// A flag set of its own: controller-runtime's client/config package
	// registers -kubeconfig on flag.CommandLine when it is imported.
	fs := flag.NewFlagSet("supernode-controller", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig `file`; empty means in-cluster")
	leaderElect := fs.Bool("leader-elect", false, "elect a leader, so that only one of several replicas reconciles")
	leaderNS := fs.String("leader-elect-namespace", supernode.DefaultLeaderElectionNamespace, "`namespace` of the leader election Lease (k8s/config/rbac's Role is there)")
	metricsAddr := fs.String("metrics-bind-address", ":8080", "`address` of the Prometheus metrics endpoint; 0 turns it off")
	healthAddr := fs.String("health-probe-bind-address", ":8081", "`address` of /healthz and /readyz; 0 turns them off")
	noHyper := fs.Bool("no-hypernodes", false, "do not export Volcano HyperNodes even where their CRD is installed")
	resync := fs.Duration("resync", supernode.DefaultResync, "how often each SuperNode is reconciled again while HyperNodes are exported (HyperNodes changed by hand, a Volcano installed later)")
	workers := fs.Int("workers", supernode.DefaultWorkers, "how many SuperNodes are reconciled at once")
	grace := fs.Duration("missing-member-grace", supernode.DefaultMissingGrace, "how long a deleted member stays in its SuperNode's status, Missing")
	debug := fs.Bool("debug", false, "log at Debug level")
	qps := fs.Float64("kube-api-qps", supernode.DefaultQPS, "`requests` per second to the apiserver, on average")
	burst := fs.Int("kube-api-burst", supernode.DefaultBurst, "`requests` to the apiserver in a burst")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package said why
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "supernode-controller: unexpected arguments %q\n", fs.Args())
		return 2
	}

	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	// What controller-runtime logs through its global logger goes to the
	// same place (unset, it complains on stderr).
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(stderr, "supernode-controller:", err)
		return 2
	}
	err = supernode.Run(ctx, cfg, supernode.Config{
		Options:                 supernode.Options{Logger: log, NoHyperNodes: *noHyper, MissingGrace: *grace, Resync: *resync, Workers: *workers},
		LeaderElection:          *leaderElect,
		LeaderElectionNamespace: *leaderNS,
		MetricsAddr:             *metricsAddr,
		HealthAddr:              *healthAddr,
		QPS:                     float32(*qps),
		Burst:                   *burst,
	})
	stopped := ctx.Err() != nil && errors.Is(err, context.Canceled)
	if err != nil && !stopped {
		log.Error("supernode-controller: " + err.Error())
		return 1
	}
	log.Info("supernode-controller: stopped")
	return 0
}
