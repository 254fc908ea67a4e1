// Command rocketmq-offload is an inference service pushing its results
// (1 MiB tensors) through RocketMQ with ubkit's drop-ins: the producer
// and push consumer constructors change, and bodies above 64 KiB stay in
// the super node's shared memory while the broker carries 45-byte
// references to them. A dashboard consumer in the same program reads
// them back.
//
// It needs a broker: ROCKETMQ_NAMESRV=host:9876 and the topic
// inference-results created. Without one it says so and fails;
// `make examples` and `go test ./mq/ubrocketmq -run TestRocketMQ/Example`
// run it against a name server and broker they start.
//
// withbrokers: -rocketmq-topics=inference-results
package main

import (
	"context"
	"fmt"
	"hash/crc32"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/ubkit-io/ubkit/mq/offload"
	"github.com/ubkit-io/ubkit/mq/ubrocketmq"
)

func main() {
	ns := brokerAddr("ROCKETMQ_NAMESRV")
	defer offload.Remove("example-rocketmq-offload") // the store outlives processes until removed
	o := ubrocketmq.Options{Topics: []string{"inference-results"}, StoreName: "example-rocketmq-offload", StoreConfig: offload.StoreConfig{SegmentSize: 16 << 20, Segments: 4}}
	service, err := ubrocketmq.NewProducer(o, producer.WithNameServer([]string{ns}))
	check(err)
	check(service.Start())
	defer service.Shutdown()
	got := make(chan string, 8)
	dashboard, err := ubrocketmq.NewPushConsumer(o, consumer.WithNameServer([]string{ns}), consumer.WithGroupName("dashboard"),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset))
	check(err)
	check(dashboard.Subscribe("inference-results", consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			got <- fmt.Sprintf("%s: %d bytes, checksum ok %v", m.GetKeys(), len(m.Body), fmt.Sprint(crc32.ChecksumIEEE(m.Body)) == m.GetProperty("crc"))
		}
		return consumer.ConsumeSuccess, nil
	}), dashboard.Start())
	defer dashboard.Shutdown()
	for i := range 8 {
		result := tensor() // an inference result: 1 MiB
		m := primitive.NewMessage("inference-results", result).WithKeys([]string{fmt.Sprintf("request-%d", i)})
		m.WithProperty("crc", fmt.Sprint(crc32.ChecksumIEEE(result)))
		_, err := service.SendSync(context.Background(), m)
		check(err)
	}
	for range 8 {
		fmt.Println(waitFor(got))
	}
}
