package mqsuite

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/sirupsen/logrus"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/mq/offload"
	"github.com/ubkit-io/ubkit/mq/ubpulsar"
	"github.com/ubkit-io/ubkit/mq/ubrocketmq"
)

// OffloadSize is the payload of the offload cases.
const OffloadSize = 1 << 20

// offloadMessages is how many messages one run sends: a fixed count
// (not a duration), all held by the store's retention (at most 6 of its
// 8 segments of 64 MiB, as a run starts anywhere in a segment), so the
// consumer never finds a payload gone.
// Shorter runs (-quick) send fewer.
func offloadMessages(d time.Duration) int {
	if d < time.Second {
		return 48
	}
	return 256
}

// maxPending bounds the messages a producer has in flight, for both
// contenders of a case alike: 32 for Pulsar; 4 for RocketMQ, whose
// broker (512 MiB of heap, as testenv starts it) answers 32 MiB in flight
// with "broker busy" (TIMEOUT_CLEAN_QUEUE).
const (
	maxPending         = 32
	maxPendingRocketMQ = 4
)

// brokerWarmupRounds are the offload cases' unmeasured rounds: the
// brokers start for the suite moments before, and their JVMs compile
// their hot paths over the first thousands of messages (a system-wide
// profile of a run put a third of the CPU in the JIT compiler threads,
// and the offload contender's rounds rose from 537 to 850-913 msg/s over
// the first four of ten; docs/PERFORMANCE.md). Both contenders run them,
// in turn, as the measured rounds.
const brokerWarmupRounds = 4

// OffloadCases are the drop-ins' payload-offload cases on brokers b
// starts once: pulsar-offload-1MiB and rocketmq-offload-1MiB, msg/s of
// 1 MiB messages from this process to a consumer process through the
// broker, with offload (ubkit) and with the plain client (the baseline),
// every payload byte written by the producer and summed by the consumer.
func OffloadCases(b *Brokers) []bench.Case {
	return []bench.Case{
		{Name: "pulsar-offload-1MiB", Unit: "msg/s", Better: "higher", WarmupRounds: brokerWarmupRounds, Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return pulsarOffload(b, d, true) }},
			{Name: "pulsar", Run: func(d time.Duration) (bench.Measurement, error) { return pulsarOffload(b, d, false) }},
		}},
		{Name: "rocketmq-offload-1MiB", Unit: "msg/s", Better: "higher", WarmupRounds: brokerWarmupRounds, Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return rocketmqOffload(b, d, true) }},
			{Name: "rocketmq", Run: func(d time.Duration) (bench.Measurement, error) { return rocketmqOffload(b, d, false) }},
		}},
	}
}

// offloadArgs tell a consumer peer what to read.
type offloadArgs struct {
	Broker  string `json:"broker"` // Pulsar's service URL, RocketMQ's name server
	Topic   string `json:"topic"`
	N       int    `json:"n"`
	Offload bool   `json:"offload"`
}

func init() {
	registerPeer("mq-pulsar-consumer", pulsarConsumer)
	registerPeer("mq-rocketmq-consumer", rocketmqConsumer)
}

var offloadRun atomic.Uint64

func quietPulsarLogger() plog.Logger {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(logrus.ErrorLevel)
	return plog.NewLoggerWithLogrus(l)
}

// store is the offload contenders' store, one for the suite, as a
// service keeps one: each run's 256 MiB go into it after the runs before
// (retention keeps 512 MiB, every message of a run: the consumer never
// finds a payload gone), so that the measured runs see a store in its
// steady state, reusing the segments retention drops (mq.Config.Recycle).
// A fresh store per run, as before, measured every payload's first
// touch of fresh memory, which a long-lived store pays only once.
func (b *Brokers) offloadStore() (*offload.Store, error) {
	b.storeOnce.Do(func() {
		name := fmt.Sprintf("bench-offload-%d-%d", os.Getpid(), time.Now().UnixNano())
		b.store, b.storeErr = offload.OpenStore(name, offload.StoreConfig{SegmentSize: 64 << 20, Segments: 8})
		if b.storeErr == nil {
			b.removeStore = func() { b.store.Close(); offload.Remove(name) }
		}
	})
	return b.store, b.storeErr
}

// runOffload runs a case's measured phase, send, after the warm-up, and
// returns the rate at which the consumer got all n messages (from the
// first send to its report) after checking its count and sum.
func runOffload(role string, a offloadArgs, warm func(ctx context.Context, payload []byte) error, send func(ctx context.Context) (sum uint64, err error)) (bench.Measurement, error) {
	elapsed, err := runBroker(role, a, &result{}, warm, func(ctx context.Context) (uint64, uint64, error) {
		sum, err := send(ctx)
		return uint64(a.N), sum, err
	})
	if err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: float64(a.N) / elapsed.Seconds()}, nil
}

// pulsarOffload sends 1 MiB messages through Pulsar, with the drop-in
// offloading them (ubkit) or with the plain client, each payload filled
// before its send.
func pulsarOffload(b *Brokers, d time.Duration, off bool) (bench.Measurement, error) {
	br, err := b.Pulsar()
	if err != nil {
		return bench.Measurement{}, err
	}
	a := offloadArgs{Broker: br.ServiceURL, Topic: fmt.Sprintf("persistent://public/default/bench-%d-%d", os.Getpid(), offloadRun.Add(1)), N: offloadMessages(d), Offload: off}
	opts := pulsarOptions(br.ServiceURL)
	var client pulsar.Client
	if off {
		s, err := b.offloadStore()
		if err != nil {
			return bench.Measurement{}, err
		}
		client, err = ubpulsar.NewClient(opts, ubpulsar.Options{Topics: []string{a.Topic}, Store: s})
		if err != nil {
			return bench.Measurement{}, err
		}
	} else if client, err = pulsar.NewClient(opts); err != nil {
		return bench.Measurement{}, err
	}
	defer client.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: a.Topic, MaxPendingMessages: maxPending, DisableBatching: true,
		// A closed producer's timeout goroutine lives SendTimeout on (tests
		// check for leaks 10 s after the end).
		SendTimeout: 8 * time.Second})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer p.Close()
	return runOffload("mq-pulsar-consumer", a, pulsarSend(p), func(ctx context.Context) (uint64, error) {
		var sum uint64
		var mu sync.Mutex
		var sendErr error
		for i := range a.N {
			m := &pulsar.ProducerMessage{Payload: make([]byte, OffloadSize)}
			bench.Fill(m.Payload, uint64(i))
			sum += bench.FillSum(OffloadSize, uint64(i))
			p.SendAsync(ctx, m, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					mu.Lock()
					sendErr = err
					mu.Unlock()
				}
			})
		}
		if err := p.FlushWithCtx(ctx); err != nil {
			return 0, err
		}
		mu.Lock()
		defer mu.Unlock()
		return sum, sendErr
	})
}

// pulsarConsumer receives a.N messages on a fresh subscription (made
// before it says subscribed), sums every payload byte and acks each.
func pulsarConsumer(a offloadArgs) error {
	opts := pulsarOptions(a.Broker)
	var client pulsar.Client
	var err error
	if a.Offload {
		client, err = ubpulsar.NewClient(opts, ubpulsar.Options{})
	} else {
		client, err = pulsar.NewClient(opts)
	}
	if err != nil {
		return err
	}
	defer client.Close()
	return pulsarReceive(client, pulsar.ConsumerOptions{Topic: a.Topic, SubscriptionName: "bench", ReceiverQueueSize: maxPending}, a.N, tally{})
}

// rocketmqOffload is pulsarOffload's RocketMQ twin: async sends of 1 MiB
// bodies, at most maxPending in flight.
func rocketmqOffload(b *Brokers, d time.Duration, off bool) (bench.Measurement, error) {
	rlog.SetLogLevel("error")
	br, err := b.RocketMQ()
	if err != nil {
		return bench.Measurement{}, err
	}
	a := offloadArgs{Broker: br.NamesrvAddr, Topic: fmt.Sprintf("bench-%d-%d", os.Getpid(), offloadRun.Add(1)), N: offloadMessages(d), Offload: off}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err = br.CreateTopic(ctx, a.Topic, 4)
	cancel()
	if err != nil {
		return bench.Measurement{}, err
	}
	opts := rocketmqProducerOptions(br.NamesrvAddr, a.Topic)
	var p rocketmq.Producer
	if off {
		s, err := b.offloadStore()
		if err != nil {
			return bench.Measurement{}, err
		}
		p, err = ubrocketmq.NewProducer(ubrocketmq.Options{Topics: []string{a.Topic}, Store: s}, opts...)
		if err != nil {
			return bench.Measurement{}, err
		}
	} else if p, err = rocketmq.NewProducer(opts...); err != nil {
		return bench.Measurement{}, err
	}
	if err := p.Start(); err != nil {
		return bench.Measurement{}, err
	}
	defer p.Shutdown()
	return runOffload("mq-rocketmq-consumer", a, rocketmqSend(p, a.Topic), func(ctx context.Context) (uint64, error) {
		var sum uint64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var sendErr error
		inflight := make(chan struct{}, maxPendingRocketMQ)
		for i := range a.N {
			body := make([]byte, OffloadSize)
			bench.Fill(body, uint64(i))
			sum += bench.FillSum(OffloadSize, uint64(i))
			inflight <- struct{}{}
			wg.Add(1)
			err := p.SendAsync(ctx, func(_ context.Context, r *primitive.SendResult, err error) {
				if err == nil && r.Status != primitive.SendOK {
					err = fmt.Errorf("send status %v", r.Status)
				}
				if err != nil {
					mu.Lock()
					sendErr = err
					mu.Unlock()
				}
				<-inflight
				wg.Done()
			}, primitive.NewMessage(a.Topic, body))
			if err != nil {
				<-inflight
				wg.Done()
				return 0, err
			}
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return sum, sendErr
	})
}

// rocketmqConsumer consumes a.N messages in a fresh group from the first
// offset, summing every body byte.
func rocketmqConsumer(a offloadArgs) error {
	rlog.SetLogLevel("error")
	opts := rocketmqConsumerOptions(a.Broker, a.Topic)
	var c rocketmq.PushConsumer
	var err error
	if a.Offload {
		c, err = ubrocketmq.NewPushConsumer(ubrocketmq.Options{}, opts...)
	} else {
		c, err = rocketmq.NewPushConsumer(opts...)
	}
	if err != nil {
		return err
	}
	return rocketmqReceive(c, a.Topic, a.N, tally{})
}
