// Command pulsar-offload is an inference service pushing its results
// (1 MiB tensors) through Pulsar with ubkit's drop-in: one constructor
// changes, and payloads above 64 KiB stay in the super node's shared
// memory while the broker carries 45-byte references to them. A
// dashboard consumer in the same program reads them back.
//
// It needs a broker: PULSAR_URL=pulsar://host:6650. Without one it says
// so and fails; `make examples` and `go test ./mq/ubpulsar -run
// TestPulsar/Example` run it against a Pulsar standalone they start.
package main

import (
	"context"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq/offload"
	"github.com/ubkit-io/ubkit/mq/ubpulsar"
)

func main() {
	url := brokerAddr("PULSAR_URL")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer offload.Remove("example-pulsar-offload") // a store outlives processes until removed
	client, err := ubpulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: quiet()}, ubpulsar.Options{Topics: []string{"inference-results"},
		StoreName: "example-pulsar-offload", StoreConfig: offload.StoreConfig{SegmentSize: 16 << 20, Segments: 4}})
	check(err)
	defer client.Close()
	dashboard, err := client.Subscribe(pulsar.ConsumerOptions{Topic: "inference-results", SubscriptionName: "dashboard"})
	check(err)
	defer dashboard.Close()
	service, err := client.CreateProducer(pulsar.ProducerOptions{Topic: "inference-results"})
	check(err)
	defer service.Close()
	for i := range 8 {
		result := tensor() // an inference result: 1 MiB
		_, err := service.Send(ctx, &pulsar.ProducerMessage{Key: fmt.Sprintf("request-%d", i), Payload: result,
			Properties: map[string]string{"crc": fmt.Sprint(crc32.ChecksumIEEE(result))}})
		check(err)
	}
	for range 8 {
		m, err := dashboard.Receive(ctx)
		check(err)
		if fmt.Sprint(crc32.ChecksumIEEE(m.Payload())) != m.Properties()["crc"] {
			check(fmt.Errorf("%s: the payload is not the one sent", m.Key()))
		}
		fmt.Printf("%s: %d bytes, checksum ok\n", m.Key(), len(m.Payload()))
		check(dashboard.Ack(m))
	}
}
