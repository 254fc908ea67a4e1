package ubpulsar_test

import (
	"context"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq/ubpulsar"
)

// ExampleNewClient is compiled, not run (it needs a broker):
// examples/pulsar-offload is the program, and TestPulsar/Example runs it
// on a test broker.
func ExampleNewClient() {
	client, err := ubpulsar.NewClient(pulsar.ClientOptions{URL: "pulsar://localhost:6650"},
		ubpulsar.Options{Topics: []string{"inference-results"}, Threshold: 64 << 10})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "inference-results"})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	// A 1 MiB result goes to shared memory; the broker carries a reference.
	p.Send(context.Background(), &pulsar.ProducerMessage{Payload: make([]byte, 1<<20)})
}
