package ubrocketmq_test

import (
	"context"
	"fmt"
	"os"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/mq/ubrocketmq"
)

// ExampleLocalConfig: a local topic needs no broker (the upstream
// clients still want a name server address; nothing connects to it).
func ExampleLocalConfig() {
	topic, group := fmt.Sprintf("example-local-%d", os.Getpid()), "results"
	defer ubrocketmq.RemoveLocal(topic, group)
	o := ubrocketmq.Options{Local: ubrocketmq.LocalConfig{Topics: []string{topic}, Queues: 1, Group: group, Log: mq.Config{SegmentSize: 1 << 20, Segments: 2}}}
	p, err := ubrocketmq.NewProducer(o, producer.WithNameServer([]string{"127.0.0.1:9876"}))
	if err != nil {
		panic(err)
	}
	defer p.Shutdown()
	if _, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte("label=cat p=0.93")).WithTag("vision")); err != nil {
		panic(err)
	}
	c, err := ubrocketmq.NewPushConsumer(o, consumer.WithNameServer([]string{"127.0.0.1:9876"}), consumer.WithGroupName(group))
	if err != nil {
		panic(err)
	}
	got := make(chan string, 1)
	c.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "vision"}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		got <- fmt.Sprintf("%s: %s", msgs[0].GetTags(), msgs[0].Body)
		return consumer.ConsumeSuccess, nil
	})
	c.Start()
	fmt.Println(<-got)
	c.Shutdown()
	// Output: vision: label=cat p=0.93
}
