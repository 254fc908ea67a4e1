package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/fssuite"
	"github.com/ubkit-io/ubkit/internal/bench/mqsuite"
	"github.com/ubkit-io/ubkit/internal/bench/shmsuite"
	"github.com/ubkit-io/ubkit/internal/bench/transportsuite"
	"github.com/ubkit-io/ubkit/transport"
)

// demoOptions are the demo's run lengths; tests shorten them.
var demoOptions = bench.Options{Rounds: 3, Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond}

// demoWithK8s makes the whole demo end with the Kubernetes part when
// its binaries are cached; TestDemo turns it off (TestDemoK8s runs that
// part).
var demoWithK8s = true

func demoCmd(args []string, w io.Writer) error {
	switch {
	case len(args) == 1 && args[0] == "k8s":
		return demoK8s(w)
	case len(args) == 1 && args[0] == "mq":
		return demoMQBrokers(w)
	case len(args) > 0:
		return fmt.Errorf("demo: unknown part %q (the parts: k8s, mq; none runs the main demo)", strings.Join(args, " "))
	}
	fmt.Fprintln(w, "ubkit demo: two processes exchanging messages through shared memory")
	fmt.Fprintln(w, "(this process and a peer it starts; the same work over a unix socket and TCP loopback)")
	fmt.Fprintln(w)
	rep, err := bench.Run("demo", shmsuite.DemoCases(), demoOptions)
	if err != nil {
		return err
	}
	lat, thr := rep.Results[0], rep.Results[1]
	fmt.Fprintf(w, "%-12s %14s %16s %18s\n", "path", "latency p50", "latency p99", "64 B messages/s")
	for _, name := range []string{"ubkit", "uds", "tcp"} {
		l, t := lat.Detail[name], thr.Detail[name]
		label := map[string]string{"ubkit": "ubkit shm", "uds": "unix socket", "tcp": "TCP loopback"}[name]
		fmt.Fprintf(w, "%-12s %14s %16s %18s\n", label, dur(l.P50), dur(l.P99), rate(t.Median))
	}
	fmt.Fprintln(w)
	if uds, tcp := lat.Baselines["uds"], lat.Baselines["tcp"]; uds > 0 && tcp > 0 {
		fmt.Fprintf(w, "ubkit round trip: %.0fx faster than the unix socket, %.0fx faster than TCP\n", uds/lat.Value, tcp/lat.Value)
	}
	if uds, tcp := thr.Baselines["uds"], thr.Baselines["tcp"]; uds > 0 && tcp > 0 {
		fmt.Fprintf(w, "ubkit streaming:  %.1fx the unix socket's messages/s, %.1fx TCP's\n", thr.Value/uds, thr.Value/tcp)
	}
	grpcRep, err := bench.Run("demo", transportsuite.DemoCases(), demoOptions)
	if err != nil {
		return err
	}
	g := grpcRep.Results[0]
	fmt.Fprintf(w, "\ngRPC (unchanged grpc-go) health check, server in another process:\n")
	fmt.Fprintf(w, "  %-22s p50 %-10s p99 %s\n", "over ubkit (path "+string(transport.PathShm)+")", dur(g.Detail["ubkit"].P50), dur(g.Detail["ubkit"].P99))
	fmt.Fprintf(w, "  %-22s p50 %-10s p99 %s\n", "over TCP loopback", dur(g.Detail["tcp"].P50), dur(g.Detail["tcp"].P99))
	if err := demoMQ(w); err != nil {
		return err
	}
	if err := demoFS(w); err != nil {
		return err
	}
	if err := demoSim(w); err != nil {
		return err
	}
	if err := demoGRPCSuperNode(w); err != nil {
		return err
	}
	if err := demoMesh(w); err != nil {
		return err
	}
	if demoWithK8s {
		if err := demoK8sIfCached(w); err != nil {
			return err
		}
	}
	fmt.Fprintln(os.Stderr, "\nfull comparisons: go run ./cmd/ubctl bench shm (shmipc-go included), bench ub, bench transport")
	return nil
}

// demoMQ streams inference-result-sized records through mq.Log from
// this process to a consumer process.
func demoMQ(w io.Writer) error {
	rep, err := bench.Run("demo", mqsuite.DemoCases(), demoOptions)
	if err != nil {
		return err
	}
	r := rep.Results[0]
	fmt.Fprintf(w, "\nmq.Log (a shared-memory log), %d B records loaned and filled in place by this process, read in place and checksummed by another:\n", mqsuite.DemoSize)
	fmt.Fprintf(w, "  %s records/s, %.2f GB/s\n", rate(r.Value), r.Value*mqsuite.DemoSize/1e9)
	return nil
}

// demoFSSize and demoFSProcs are the fs part's model file and process
// count; tests shorten them.
var (
	demoFSSize  int64 = 256 << 20
	demoFSProcs       = 4
)

// demoFS loads a model-sized file in several processes at once, with
// fs.Open's one shared copy and then with a private copy each.
func demoFS(w io.Writer) error {
	shared, private, err := fssuite.Demo(demoFSSize, demoFSProcs)
	if err != nil {
		return err
	}
	mib := func(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }
	loads := func(d []time.Duration) string {
		var s []string
		for _, x := range d {
			s = append(s, x.Round(time.Millisecond).String())
		}
		return strings.Join(s, ", ")
	}
	fmt.Fprintf(w, "\nfs: %d processes load the same %s model file at once:\n", demoFSProcs, mib(demoFSSize))
	fmt.Fprintf(w, "  %-34s memory %9s   loads took %s\n", "fs.Open (one shared copy per host)", mib(shared.PSS), loads(shared.Loads))
	fmt.Fprintf(w, "  %-34s memory %9s   loads took %s\n", "os.ReadFile in each process", mib(private.PSS), loads(private.Loads))
	if saved := private.PSS - shared.PSS; saved > 0 {
		fmt.Fprintf(w, "  memory saved: %s (%.0f%%)\n", mib(saved), 100*float64(saved)/float64(private.PSS))
	}
	return nil
}

// demoK8sIfCached runs the Kubernetes part when its binaries are cached,
// and otherwise says in one line how to get it: building them takes
// minutes, too long for a first demo.
func demoK8sIfCached(w io.Writer) error {
	dir, missing, err := k8sBinaries()
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "\nKubernetes (a cm384 super node as a SuperNode): skipped, its binaries are not cached in %s; `ubctl demo k8s` builds them once (about 15 minutes) and runs it\n", dir)
		return nil
	}
	return demoK8s(w)
}

func dur(ns float64) string { return time.Duration(ns).Round(10 * time.Nanosecond).String() }

func rate(v float64) string {
	if v >= 1e6 {
		return fmt.Sprintf("%.1f M", v/1e6)
	}
	return fmt.Sprintf("%.0f k", v/1e3)
}
