// Command ubctl is ubkit's command-line tool: benchmarks against baselines
// and the demo.
//
//	ubctl bench <suite|all> [-quick] [-json]
//	ubctl fs load [flags] FILE
//	ubctl topology show|validate|render
//	ubctl sim [-topology T] [fault flags]
//	ubctl demo
package main

import (
	"fmt"
	"os"

	"github.com/ubkit-io/ubkit/internal/bench"

	// The providers ubctl can open.
	_ "github.com/ubkit-io/ubkit/ub/provider/shmprov"
	_ "github.com/ubkit-io/ubkit/ub/provider/simprov"
	_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov"
)

const usage = `ubctl: ubkit's command-line tool

usage:
  ubctl bench <suite|all> [-quick] [-json] [-rounds N] [-duration D] [-case C]
        run a benchmark suite against its baselines, side by side (suites: cache, fs, k8s, mesh, mq, shm, transport, ub);
        -case runs one case, or the cases under it (transport -case connect-close-1000)
  ubctl fs load [-method auto|map|copy] [-cold] [-tensors] [-hold] ... FILE
        load a large file (a model) as fs.Open does, with a progress bar, and
        say how fast; the host's processes share one copy
  ubctl topology show|validate|render ...
        show a super node topology, check topology files, draw one (DOT, SVG)
  ubctl sim [-topology T] [-link-down A-B] [-slow A-B=F] [-crash N] [-clear] [-hold]
        set up a simulated super node (shared link state and faults) and
        say which links this host can honour
  ubctl demo
        two processes exchanging messages through shared memory, next to a
        unix socket and TCP loopback, unchanged gRPC over ubkit, then
        verbs, gRPC and the mesh across a simulated 4-node super node,
        then (if its binaries are cached) the k8s part
  ubctl demo k8s
        a real Kubernetes control plane with kwok and the SuperNode
        controller: a simulated cm384 as SuperNodes, a node lost and found
        (builds its binaries once if they are not cached: about 15 minutes)
  ubctl demo mq
        the Pulsar and RocketMQ drop-ins with payload offload against the
        plain clients, on real brokers started for it (their jars resolved
        from Maven Central once)
`

func main() {
	// A benchmark peer is this program re-executed: run its role and exit.
	bench.RunPeerIfChild()
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "bench":
		err = benchCmd(os.Args[2:], os.Stdout)
	case "demo":
		err = demoCmd(os.Args[2:], os.Stdout)
	case "fs":
		err = fsCmd(os.Args[2:], os.Stdout)
	case "sim":
		err = simCmd(os.Args[2:], os.Stdout)
	case "topology":
		err = topologyCmd(os.Args[2:], os.Stdout)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "ubctl: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ubctl %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func cacheDir() string {
	if d := os.Getenv("UBKIT_CACHE"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return d + "/ubkit"
	}
	return os.TempDir() + "/ubkit-cache"
}
