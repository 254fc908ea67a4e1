// Command k8sbin builds the Kubernetes test binaries that are missing
// (k8stest.Build into k8stest.DefaultBinDir); `make prereqs` runs it.
// Arguments name the sets to build (etcd, kwok, kubernetes), all by
// default.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/ubkit-io/ubkit/internal/osproc"
	"github.com/ubkit-io/ubkit/k8s/k8stest"
)

func main() {
	ctx, stop := osproc.StopContext(context.Background()) // an interrupt or SIGTERM stops the build, cleanly
	defer stop()
	if err := k8stest.Build(ctx, "", os.Stdout, os.Args[1:]...); err != nil {
		fmt.Fprintln(os.Stderr, "prereqs:", err)
		os.Exit(1)
	}
}
