package mqsuite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// The broker consumer peers of the offload and local-latency cases: the
// same handshake (subscribed, the warm-up message, ready), the same count
// and sum of n messages, a case's own tally.

// brokerTimeout bounds a broker case's run, on both ends.
const brokerTimeout = 5 * time.Minute

// pulsarOptions are the client options of both ends of the Pulsar cases.
func pulsarOptions(serviceURL string) pulsar.ClientOptions {
	return pulsar.ClientOptions{URL: serviceURL, Logger: quietPulsarLogger(), OperationTimeout: time.Minute}
}

// rocketmqProducerOptions are the producer options of the RocketMQ cases,
// a group and an instance of the topic's own.
func rocketmqProducerOptions(nameServer, topic string) []producer.Option {
	return []producer.Option{producer.WithNameServer([]string{nameServer}), producer.WithRetry(1),
		producer.WithGroupName("bench-" + topic), producer.WithInstanceName(topic), producer.WithSendMsgTimeout(time.Minute)}
}

// rocketmqGroup is the consumer group of the RocketMQ cases: a fresh one
// per topic.
func rocketmqGroup(topic string) string { return "bench-" + topic }

// rocketmqConsumerOptions are the consumer options of the RocketMQ cases:
// a fresh group, from the first offset.
func rocketmqConsumerOptions(nameServer, topic string) []rmqconsumer.Option {
	return []rmqconsumer.Option{rmqconsumer.WithNameServer([]string{nameServer}), rmqconsumer.WithGroupName(rocketmqGroup(topic)),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset), rmqconsumer.WithInstance(topic)}
}

// pulsarReceive is a Pulsar consumer peer's body: it subscribes with
// opts (a subscription made before it says subscribed), takes the
// warm-up message, says ready, then receives n messages, passing each
// payload to t, summing it and acking it, and prints its report.
func pulsarReceive(client pulsar.Client, opts pulsar.ConsumerOptions, n int, t tally) error {
	c, err := client.Subscribe(opts)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("subscribed")
	ctx, cancel := context.WithTimeout(context.Background(), brokerTimeout)
	defer cancel()
	m, err := c.Receive(ctx)
	if err != nil {
		return err
	}
	if string(m.Payload()) != string(warmUp) {
		return fmt.Errorf("a first message of %d bytes, not the warm-up", len(m.Payload()))
	}
	c.AckID(m.ID())
	fmt.Println("ready")
	var res result
	for range n {
		m, err := c.Receive(ctx)
		if err != nil {
			return err
		}
		if t.add != nil {
			if err := t.add(m.Payload()); err != nil {
				return err
			}
		}
		res.N++
		res.Sum += bench.Sum(m.Payload())
		c.AckID(m.ID())
	}
	bench.PeerFinished() // its profile, before the harness kills it
	return t.print(res)
}

// rocketmqReceive is a RocketMQ consumer peer's body: it subscribes c to
// topic, starts it and says subscribed, waits for the warm-up message,
// says ready, then consumes n messages, passing each body to t and
// summing it (redeliveries beyond n are dropped), and prints its report.
func rocketmqReceive(c rocketmq.PushConsumer, topic string, n int, t tally) error {
	var mu sync.Mutex
	var res result
	var bad error
	all, warm := make(chan struct{}), make(chan struct{})
	warmed := false
	err := c.Subscribe(topic, rmqconsumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if string(m.Body) == string(warmUp) {
				if !warmed {
					warmed = true
					close(warm)
				}
				continue
			}
			if res.N == uint64(n) {
				break // a redelivery beyond the count
			}
			if t.add != nil {
				if err := t.add(m.Body); err != nil {
					bad = err
				}
			}
			res.N++
			res.Sum += bench.Sum(m.Body)
			if res.N == uint64(n) {
				close(all)
			}
		}
		return rmqconsumer.ConsumeSuccess, nil
	})
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	defer c.Shutdown()
	fmt.Println("subscribed")
	select {
	case <-warm:
	case <-time.After(brokerTimeout):
		return errors.New("no warm-up message in 5 minutes")
	}
	fmt.Println("ready")
	select {
	case <-all:
	case <-time.After(brokerTimeout):
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("%d of %d messages in 5 minutes", res.N, n)
	}
	bench.PeerFinished() // its profile, before the harness kills it
	mu.Lock()
	defer mu.Unlock()
	if bad != nil {
		return bad
	}
	return t.print(res)
}

// pulsarSend sends each payload through p, synchronously.
func pulsarSend(p pulsar.Producer) func(ctx context.Context, payload []byte) error {
	return func(ctx context.Context, payload []byte) error {
		_, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: payload})
		return err
	}
}

// rocketmqSend sends each payload to topic through p, synchronously.
func rocketmqSend(p rocketmq.Producer, topic string) func(ctx context.Context, payload []byte) error {
	return func(ctx context.Context, payload []byte) error {
		r, err := p.SendSync(ctx, primitive.NewMessage(topic, payload))
		if err == nil && r.Status != primitive.SendOK {
			err = fmt.Errorf("send status %v", r.Status)
		}
		return err
	}
}

// runBroker is the producer's side of a broker case: it starts the
// consumer peer role with args, waits until it has subscribed, sends the
// warm-up message with send and waits until the consumer has it, then
// runs measure (the measured phase, which returns how many messages it
// sent and the sum of their bytes), decodes the consumer's report into v
// and checks its count and sum. It returns the time from the start of
// measure to the report.
func runBroker(role string, args any, v interface{ counted() result }, send func(ctx context.Context, payload []byte) error, measure func(ctx context.Context) (n, sum uint64, err error)) (time.Duration, error) {
	peer, err := startConsumer(role, role, args)
	if err != nil {
		return 0, err
	}
	defer peer.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), brokerTimeout)
	defer cancel()
	if err := peer.warmUp(ctx, send); err != nil {
		return 0, err
	}
	start := time.Now()
	n, sum, err := measure(ctx)
	if err != nil {
		return 0, err
	}
	if err := peer.report(v, n, sum); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	return elapsed, peer.Wait()
}
