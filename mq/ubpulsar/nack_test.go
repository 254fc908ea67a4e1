package ubpulsar

import (
	"context"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mq/offload"
)

// nackOutcome is what a consumer saw of a sequence with nacks: the
// redelivery counts each message arrived with, in order, and the
// dead-lettered messages (payload size and sum by index).
type nackOutcome struct {
	Deliveries map[int][]uint32
	Dead       map[int][2]uint64
}

// runNacks sends n messages (sizes below and above threshold) to topic
// and consumes them on a shared subscription with a DLQ policy of 3
// deliveries: message i is nacked every time if i%3 == 0 (so it is
// dead-lettered), nacked once and then acked if i%3 == 1, acked at once
// otherwise.
func runNacks(t *testing.T, client pulsar.Client, topic string, n, threshold int) nackOutcome {
	t.Helper()
	ctx := timeout(t, 2*time.Minute)
	dlq := topic + "-dlq"
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "nacks", Type: pulsar.Shared,
		NackRedeliveryDelay: 200 * time.Millisecond,
		DLQ:                 &pulsar.DLQPolicy{MaxDeliveries: 3, DeadLetterTopic: dlq, ProducerOptions: pulsar.ProducerOptions{SendTimeout: sendTimeout}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead, err := client.Subscribe(pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "dlq", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout, DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sizes := []int{100, threshold + 1, 4 * threshold}
	for i := range n {
		s := sent{size: sizes[i%len(sizes)], seed: uint64(i)}
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: s.payload(), Properties: map[string]string{"i": strconv.Itoa(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	wantAcks, wantDead := 0, 0
	for i := range n {
		if i%3 == 0 {
			wantDead++
		} else {
			wantAcks++
		}
	}
	out := nackOutcome{Deliveries: map[int][]uint32{}, Dead: map[int][2]uint64{}}
	var mu sync.Mutex
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	deadDone := make(chan error, 1)
	go func() {
		for range wantDead {
			m, err := dead.Receive(ctx)
			if err != nil {
				deadDone <- err
				return
			}
			i, _ := strconv.Atoi(m.Properties()["i"])
			mu.Lock()
			out.Dead[i] = [2]uint64{uint64(len(m.Payload())), bench.Sum(m.Payload())}
			mu.Unlock()
			dead.Ack(m)
		}
		deadDone <- nil
	}()
	acks := 0
	deadErr := make(chan error, 1)
	var watch sync.Once
	for {
		if acks == wantAcks {
			// Only dead letters to come: go on receiving (the DLQ
			// routing runs inside Receive) until they are all there.
			watch.Do(func() {
				go func() {
					deadErr <- <-deadDone
					stop()
				}()
			})
		}
		m, err := c.Receive(rctx)
		if err != nil {
			if rctx.Err() != nil && ctx.Err() == nil {
				break
			}
			t.Fatalf("after %d acks: %v", acks, err)
		}
		i, _ := strconv.Atoi(m.Properties()["i"])
		if want := (sent{size: sizes[i%len(sizes)], seed: uint64(i)}).payload(); bench.Sum(m.Payload()) != bench.Sum(want) || len(m.Payload()) != len(want) {
			t.Fatalf("message %d: %d bytes, not the payload sent", i, len(m.Payload()))
		}
		out.Deliveries[i] = append(out.Deliveries[i], m.RedeliveryCount())
		if i%3 == 0 || i%3 == 1 && len(out.Deliveries[i]) == 1 {
			c.Nack(m)
			continue
		}
		c.Ack(m)
		acks++
	}
	if err := <-deadErr; err != nil {
		t.Fatalf("dead letters: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	return out
}

// testNackDifferential: nacks, redeliveries and dead letters through the
// drop-in (offload on) and through the plain client, on the same broker:
// the same redelivery counts per message, the same messages
// dead-lettered; the drop-in's DLQ consumer gets their payloads back.
func testNackDifferential(t *testing.T, b *testenv.Pulsar) {
	const threshold, n = 8 << 10, 12
	s := store(t, offload.StoreConfig{SegmentSize: 4 << 20})
	topicUB, topicPlain := "persistent://public/default/"+unique("nack-ub"), "persistent://public/default/"+unique("nack-plain")
	ub := runNacks(t, dropIn(t, b.ServiceURL, s, threshold, nil, topicUB, topicUB+"-dlq"), topicUB, n, threshold)
	plainOut := runNacks(t, plain(t, b.ServiceURL), topicPlain, n, threshold)
	if !reflect.DeepEqual(ub.Deliveries, plainOut.Deliveries) {
		t.Fatalf("redelivery counts: drop-in %v, plain %v", ub.Deliveries, plainOut.Deliveries)
	}
	if !reflect.DeepEqual(ub.Dead, plainOut.Dead) {
		t.Fatalf("dead letters: drop-in %v, plain %v", ub.Dead, plainOut.Dead)
	}
	if len(ub.Dead) == 0 {
		t.Fatal("nothing dead-lettered")
	}
	t.Logf("%d messages: redelivery counts %v, %d dead-lettered, alike", n, ub.Deliveries, len(ub.Dead))
}
