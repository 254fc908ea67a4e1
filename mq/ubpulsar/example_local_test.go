package ubpulsar_test

import (
	"context"
	"fmt"
	"os"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/mq/ubpulsar"
)

// ExampleLocalConfig: a local topic needs no broker; its producers and
// consumers are in the super node (here, one process).
func ExampleLocalConfig() {
	topic := fmt.Sprintf("example-local-%d", os.Getpid())
	defer ubpulsar.RemoveLocal(topic, "results")
	client, err := ubpulsar.NewClient(pulsar.ClientOptions{URL: "pulsar://localhost:6650"},
		ubpulsar.Options{Local: ubpulsar.LocalConfig{Topics: []string{topic}, Log: mq.Config{SegmentSize: 1 << 20, Segments: 2}}})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "results", Type: pulsar.Failover})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()
	if _, err := p.Send(ctx, &pulsar.ProducerMessage{Key: "request-1", Payload: []byte("label=cat p=0.93")}); err != nil {
		panic(err)
	}
	m, err := c.Receive(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s: %s\n", m.Key(), m.Payload())
	c.Ack(m)
	// Output: request-1: label=cat p=0.93
}
