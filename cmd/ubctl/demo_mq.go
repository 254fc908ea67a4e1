package main

import (
	"fmt"
	"io"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/mqsuite"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

// demoMQOptions are demo mq's run lengths; TestDemoMQ shortens them.
var demoMQOptions = bench.Options{Rounds: 3, Duration: time.Second, Warmup: 200 * time.Millisecond}

// demoMQBrokers is `ubctl demo mq`: the Pulsar and RocketMQ drop-ins with
// payload offload against the plain clients, on a real Pulsar standalone
// and a real RocketMQ name server and broker started for it (their jars
// resolved from Maven Central once, into the project cache).
func demoMQBrokers(w io.Writer) error {
	missing, err := testenv.BrokerJarsMissing()
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "resolving %v from Maven Central into the project cache (once; minutes with a cold Maven cache)\n", missing)
		began := time.Now()
		if err := testenv.ResolveBrokerJars(w); err != nil {
			return err
		}
		fmt.Fprintf(w, "  resolved in %s\n", time.Since(began).Round(time.Second))
	}
	b := mqsuite.NewBrokers()
	defer b.Close()
	fmt.Fprintf(w, "\nreal brokers on loopback: Pulsar %s standalone, RocketMQ %s name server and broker\n", testenv.PulsarVersion, testenv.RocketMQVersion)
	began := time.Now()
	if _, err := b.Pulsar(); err != nil {
		return err
	}
	if _, err := b.RocketMQ(); err != nil {
		return err
	}
	fmt.Fprintf(w, "  up in %s\n", time.Since(began).Round(100*time.Millisecond))

	rep, err := bench.Run("demo", mqsuite.OffloadCases(b), demoMQOptions)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n1 MiB messages (an inference result), producer here, consumer in another process, every byte summed:\n")
	fmt.Fprintf(w, "  %-10s %20s %20s %8s\n", "client", "ubkit drop-in", "plain client", "ratio")
	for _, r := range rep.Results {
		for name, base := range r.Baselines {
			fmt.Fprintf(w, "  %-10s %14.0f msg/s %14.0f msg/s %7.1fx\n", name, r.Value, base, r.Value/base)
		}
	}
	fmt.Fprintln(w, "  (the drop-in keeps each payload in the super node's shared memory and sends the broker a reference;")
	fmt.Fprintln(w, "   the plain client sends the broker the whole megabyte)")
	return nil
}
