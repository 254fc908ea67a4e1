package supernode_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/ubkit-io/ubkit/k8s/supernode"
)

// A program runs the controller on its own, leader-elected, with metrics
// and health probes, until it is interrupted (k8s/cmd/supernode-controller
// is this, with flags). The SuperNode CRD must be installed
// (k8s/config/crd) and the program's account bound to the controller's
// roles (k8s/config/rbac; the Role is in DefaultLeaderElectionNamespace).
func ExampleRun() {
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err = supernode.Run(ctx, cfg, supernode.Config{
		Options:                 supernode.Options{Logger: slog.Default()},
		LeaderElection:          true,
		LeaderElectionNamespace: supernode.DefaultLeaderElectionNamespace,
		MetricsAddr:             ":8080",
		HealthAddr:              ":8081",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

// A program with a manager of its own (other controllers beside it) adds
// the SuperNode reconciler to it; the manager's scheme must know the
// SuperNode types and the core ones (supernode.Scheme has both).
func ExampleNew() {
	var mgr manager.Manager // made with manager.New(cfg, manager.Options{Scheme: scheme}), scheme from supernode.Scheme()
	r, err := supernode.New(mgr, supernode.Options{NoHyperNodes: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	if err := r.SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}
