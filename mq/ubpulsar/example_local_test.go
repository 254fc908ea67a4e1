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

// ExampleLocalConfig_reader: a reader of a local topic reads from a
// position (here the earliest message) without a subscription, and
// seeks back to a message it read.
func ExampleLocalConfig_reader() {
	topic := fmt.Sprintf("example-local-reader-%d", os.Getpid())
	defer ubpulsar.RemoveLocal(topic)
	client, err := ubpulsar.NewClient(pulsar.ClientOptions{URL: "pulsar://localhost:6650"},
		ubpulsar.Options{Local: ubpulsar.LocalConfig{Topics: []string{topic}, Log: mq.Config{SegmentSize: 1 << 20, Segments: 2}}})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	ctx := context.Background()
	for _, s := range []string{"step 1", "step 2", "step 3"} {
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(s)}); err != nil {
			panic(err)
		}
	}
	r, err := client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID(), StartMessageIDInclusive: true})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	var second pulsar.MessageID
	for r.HasNext() {
		m, err := r.Next(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Println(string(m.Payload()))
		if string(m.Payload()) == "step 2" {
			second = m.ID()
		}
	}
	if err := r.Seek(second); err != nil { // inclusive: step 2 again
		panic(err)
	}
	m, err := r.Next(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("again:", string(m.Payload()))
	// Output:
	// step 1
	// step 2
	// step 3
	// again: step 2
}
