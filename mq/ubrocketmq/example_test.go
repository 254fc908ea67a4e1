package ubrocketmq_test

import (
	"context"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/ubkit-io/ubkit/mq/ubrocketmq"
)

// ExampleNewProducer is compiled, not run (it needs a broker):
// examples/rocketmq-offload is the program, and TestRocketMQ/Example
// runs it on a test broker.
func ExampleNewProducer() {
	p, err := ubrocketmq.NewProducer(ubrocketmq.Options{Topics: []string{"inference-results"}},
		producer.WithNameServer([]string{"127.0.0.1:9876"}))
	if err != nil {
		panic(err)
	}
	if err := p.Start(); err != nil {
		panic(err)
	}
	defer p.Shutdown()
	// A 1 MiB result goes to shared memory; the broker carries a reference.
	p.SendSync(context.Background(), primitive.NewMessage("inference-results", make([]byte, 1<<20)))
}
