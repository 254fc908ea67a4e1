package brokers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/sirupsen/logrus"

	"github.com/ubkit-io/ubkit/internal/procstat"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) {
	rlog.SetLogLevel("error")
	testenv.Main(m)
}

// quietLogger is pulsar-client-go's logrus logger at error level (it logs
// every connection at info).
func quietLogger() plog.Logger {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(logrus.ErrorLevel)
	return plog.NewLoggerWithLogrus(l)
}

func payload(i int) string { return "message-" + strconv.Itoa(i) }

func logRSS(t *testing.T, what string, pid int) {
	if u, err := procstat.Of(pid); err == nil {
		t.Logf("%s: RSS %d MB", what, u.RSS>>20)
	}
}

// pulsarSend sends messages from..to-1 to topic.
func pulsarSend(ctx context.Context, client pulsar.Client, topic string, from, to int) error {
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		return fmt.Errorf("create producer: %w", err)
	}
	defer p.Close()
	for i := from; i < to; i++ {
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(payload(i))}); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	return nil
}

// pulsarReceive receives and acks messages from..to-1, in order, on
// subscription sub of topic.
func pulsarReceive(ctx context.Context, client pulsar.Client, topic, sub string, from, to int) error {
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: sub, Type: pulsar.Exclusive,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer c.Close()
	for i := from; i < to; i++ {
		msg, err := c.Receive(ctx)
		if err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		if got := string(msg.Payload()); got != payload(i) {
			return fmt.Errorf("received %q, want %q", got, payload(i))
		}
		if err := c.Ack(msg); err != nil {
			return fmt.Errorf("ack %d: %w", i, err)
		}
	}
	return nil
}

func newPulsarClient(url string, timeout time.Duration) (pulsar.Client, error) {
	return pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: quietLogger(),
		ConnectionTimeout: timeout, OperationTimeout: timeout})
}

// TestPulsar round-trips messages through a real Pulsar standalone with
// pulsar-client-go, in order, and finds them all again after the broker
// was killed and restarted on the same data.
func TestPulsar(t *testing.T) {
	start := time.Now()
	b := testenv.StartPulsar(t, testenv.BrokerOptions{Durable: true})
	t.Logf("Pulsar %s ready in %v at %s (%s)", testenv.PulsarVersion, time.Since(start).Round(time.Millisecond), b.ServiceURL, b.WebURL)
	logRSS(t, "Pulsar", b.Pid())

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, err := newPulsarClient(b.ServiceURL, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const topic, sub = "persistent://public/default/testenv-roundtrip", "testenv"
	if err := pulsarSend(ctx, client, topic, 0, 110); err != nil {
		t.Fatal(err)
	}
	if err := pulsarReceive(ctx, client, topic, sub, 0, 110); err != nil {
		t.Fatal(err)
	}
	client.Close()

	start = time.Now()
	b.Restart(false)
	t.Logf("Pulsar killed and ready again in %v", time.Since(start).Round(time.Millisecond))
	client, err = newPulsarClient(b.ServiceURL, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// A kill may lose the subscription's last acknowledgements (Pulsar
	// persists cursors lazily: at-least-once), never a message.
	if err := pulsarReceive(ctx, client, topic, "after-restart", 0, 110); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}

// TestPulsarNoBroker: the same round trip against a port no broker
// listens on fails, so TestPulsar's pass says something.
func TestPulsarNoBroker(t *testing.T) {
	port := freePort(t)
	client, err := newPulsarClient("pulsar://127.0.0.1:"+strconv.Itoa(port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pulsarSend(ctx, client, "persistent://public/default/none", 0, 1); err == nil {
		t.Fatal("a send without a broker succeeded")
	} else {
		t.Logf("without a broker: %v", err)
	}
}

// rocketmqSend sends messages from..to-1 to topic, synchronously.
func rocketmqSend(ctx context.Context, namesrv, topic string, from, to int) error {
	p, err := rocketmq.NewProducer(producer.WithNameServer([]string{namesrv}), producer.WithRetry(1),
		producer.WithGroupName("testenv-producer"), producer.WithSendMsgTimeout(5*time.Second))
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil {
		return fmt.Errorf("start producer: %w", err)
	}
	defer p.Shutdown()
	for i := from; i < to; i++ {
		r, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte(payload(i))))
		if err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
		if r.Status != primitive.SendOK {
			return fmt.Errorf("send %d: status %v", i, r.Status)
		}
	}
	return nil
}

// rocketmqReceive consumes topic from its first offset in a new consumer
// group and waits until messages from..to-1 all arrived (RocketMQ orders
// them per queue only).
func rocketmqReceive(ctx context.Context, namesrv, topic, group string, from, to int) error {
	want := map[string]bool{}
	for i := from; i < to; i++ {
		want[payload(i)] = true
	}
	var mu sync.Mutex
	all := make(chan struct{})
	c, err := rocketmq.NewPushConsumer(consumer.WithNameServer([]string{namesrv}), consumer.WithGroupName(group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset))
	if err != nil {
		return err
	}
	err = c.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			if want[string(m.Body)] {
				delete(want, string(m.Body))
				if len(want) == 0 {
					close(all)
				}
			}
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if err := c.Start(); err != nil {
		return fmt.Errorf("start consumer: %w", err)
	}
	defer c.Shutdown()
	select {
	case <-all:
		return nil
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("%d of %d messages did not arrive: %w", len(want), to-from, ctx.Err())
	}
}

// TestRocketMQ round-trips messages through a real RocketMQ name server
// and broker with rocketmq-client-go (a push consumer), and reads them
// again after both were stopped (SIGTERM) and restarted on the same store.
func TestRocketMQ(t *testing.T) {
	start := time.Now()
	b := testenv.StartRocketMQ(t, testenv.BrokerOptions{Durable: true})
	t.Logf("RocketMQ %s ready in %v, name server %s, broker %s", testenv.RocketMQVersion, time.Since(start).Round(time.Millisecond), b.NamesrvAddr, b.BrokerAddr)
	namesrvPid, brokerPid := b.Pids()
	logRSS(t, "RocketMQ name server", namesrvPid)
	logRSS(t, "RocketMQ broker", brokerPid)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const topic = "testenv-roundtrip"
	if err := b.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	if err := rocketmqSend(ctx, b.NamesrvAddr, topic, 0, 100); err != nil {
		t.Fatal(err)
	}
	if err := rocketmqReceive(ctx, b.NamesrvAddr, topic, "testenv-1", 0, 100); err != nil {
		t.Fatal(err)
	}

	start = time.Now()
	b.Restart(true)
	t.Logf("RocketMQ stopped with SIGTERM and ready again in %v", time.Since(start).Round(time.Millisecond))
	if err := b.WaitTopic(ctx, topic); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if err := rocketmqReceive(ctx, b.NamesrvAddr, topic, "testenv-2", 0, 100); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
}

// TestRocketMQNoBroker: a send through a name server that is not there
// fails, so TestRocketMQ's pass says something.
func TestRocketMQNoBroker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := rocketmqSend(ctx, "127.0.0.1:"+strconv.Itoa(freePort(t)), "testenv-none", 0, 1)
	if err == nil {
		t.Fatal("a send without a broker succeeded")
	}
	t.Logf("without a broker: %v", err)
	if errors.Is(err, context.DeadlineExceeded) {
		t.Log("(it timed out)")
	}
}
