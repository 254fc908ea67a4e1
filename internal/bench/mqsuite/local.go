package mqsuite

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/mq/ubpulsar"
	"github.com/ubkit-io/ubkit/mq/ubrocketmq"
)

// LocalSize is the payload of the local-latency cases: an inference
// result's size, as the demo's.
const LocalSize = 1 << 10

// localInterval paces the local-latency cases' sends: one message every
// 2 ms, a load every contender keeps up with, so that the figure is the
// path's latency and not a queue's.
const localInterval = 2 * time.Millisecond

// targetLocalRatio is issue 18's target: a local topic's p50 and p99 at
// most 0.05x the broker's.
const targetLocalRatio = 0.05

// LocalCases are the drop-ins' local-topic cases on brokers b starts
// once: pulsar-local-latency and rocketmq-local-latency, the end-to-end
// latency (from just before the send to the consumer's receive, in
// another process) of 1 KiB messages through a local topic (ubkit) and
// through the same topic on the broker (the baseline), every payload
// byte written and summed.
func LocalCases(b *Brokers) []bench.Case {
	return []bench.Case{
		{Name: "pulsar-local-latency", Unit: "ns", Better: "lower", Latency: true, Verdict: localVerdict("pulsar"), Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return pulsarLocal(b, d, true) }},
			{Name: "pulsar", Run: func(d time.Duration) (bench.Measurement, error) { return pulsarLocal(b, d, false) }},
		}},
		{Name: "rocketmq-local-latency", Unit: "ns", Better: "lower", Latency: true, Verdict: localVerdict("rocketmq"), Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return rocketmqLocal(b, d, true) }},
			{Name: "rocketmq", Run: func(d time.Duration) (bench.Measurement, error) { return rocketmqLocal(b, d, false) }},
		}},
	}
}

func localVerdict(baseline string) func(bench.Result) string {
	return func(r bench.Result) string {
		u, b := r.Detail["ubkit"], r.Detail[baseline]
		if b.P50 == 0 || b.P99 == 0 {
			return "no baseline figures"
		}
		p50, p99 := u.P50/b.P50, u.P99/b.P99
		if p50 <= targetLocalRatio && p99 <= targetLocalRatio {
			return fmt.Sprintf("met the target of %.2fx: p50 %.3fx, p99 %.3fx of %s's", targetLocalRatio, p50, p99, baseline)
		}
		return fmt.Sprintf("MISSED the target of %.2fx: p50 %.3fx, p99 %.3fx of %s's", targetLocalRatio, p50, p99, baseline)
	}
}

// localMessages is how many messages a run of d sends.
func localMessages(d time.Duration) int { return max(int(d/localInterval), 20) }

// localArgs tell a consumer peer what to read.
type localArgs struct {
	Broker string `json:"broker"`
	Topic  string `json:"topic"`
	N      int    `json:"n"`
	Local  bool   `json:"local"`
}

// localResult is what a consumer peer reports: messages, the sum of
// their bytes, and each one's latency in ns.
type localResult struct {
	N       int       `json:"n"`
	Sum     uint64    `json:"sum"`
	Samples []float64 `json:"samples"`
}

func init() {
	bench.RegisterPeer("mq-pulsar-local", func(raw json.RawMessage) error {
		var a localArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return pulsarLocalConsumer(a)
	})
	bench.RegisterPeer("mq-rocketmq-local", func(raw json.RawMessage) error {
		var a localArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return rocketmqLocalConsumer(a)
	})
}

// stamped is message i's payload: filled, with the send time in its
// first 8 bytes.
func stamped(i int) []byte {
	b := make([]byte, LocalSize)
	bench.Fill(b, uint64(i))
	binary.LittleEndian.PutUint64(b, uint64(time.Now().UnixNano()))
	return b
}

// latencyOf is the time since payload b was stamped.
func latencyOf(b []byte) (float64, error) {
	if len(b) != LocalSize {
		return 0, fmt.Errorf("a %d-byte message, %d sent", len(b), LocalSize)
	}
	return float64(time.Now().UnixNano() - int64(binary.LittleEndian.Uint64(b))), nil
}

// runLocal starts the consumer peer, warms the path up (a message the
// consumer answers ready to), sends a.N stamped messages one every
// localInterval and checks the consumer's count and sum.
func runLocal(role string, a localArgs, send func(ctx context.Context, payload []byte) error) (bench.Measurement, error) {
	peer, err := bench.StartPeerPipe(role, a)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer peer.Kill()
	out := bufio.NewReader(peer.Stdout())
	if line, err := out.ReadString('\n'); err != nil || line != "subscribed\n" {
		return bench.Measurement{}, fmt.Errorf("%s: %q, %v (%v)", role, line, err, peer.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := send(ctx, warmUp); err != nil {
		return bench.Measurement{}, err
	}
	if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
		return bench.Measurement{}, fmt.Errorf("%s: %q, %v (%v)", role, line, err, peer.Err())
	}
	var sum uint64
	next := time.Now()
	for i := range a.N {
		b := stamped(i)
		sum += bench.Sum(b)
		if err := send(ctx, b); err != nil {
			return bench.Measurement{}, err
		}
		next = next.Add(localInterval)
		time.Sleep(time.Until(next)) // pacing: the offered load
	}
	var res localResult
	if err := json.NewDecoder(out).Decode(&res); err != nil {
		return bench.Measurement{}, fmt.Errorf("%s's result: %w (%v)", role, err, peer.Err())
	}
	if res.N != a.N || res.Sum != sum || len(res.Samples) != a.N {
		return bench.Measurement{}, fmt.Errorf("%s read %d messages (sum %x), %d sent (sum %x)", role, res.N, res.Sum, a.N, sum)
	}
	if err := peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: median(res.Samples), Samples: res.Samples}, nil
}

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[len(c)/2]
}

// pulsarLocal sends through a local topic of the drop-in (ubkit) or the
// same topic on Pulsar (the plain client), to a consumer process.
func pulsarLocal(b *Brokers, d time.Duration, local bool) (bench.Measurement, error) {
	br, err := b.Pulsar()
	if err != nil {
		return bench.Measurement{}, err
	}
	a := localArgs{Broker: br.ServiceURL, Topic: fmt.Sprintf("persistent://public/default/bench-local-%d-%d", os.Getpid(), offloadRun.Add(1)), N: localMessages(d), Local: local}
	opts := pulsar.ClientOptions{URL: br.ServiceURL, Logger: quietPulsarLogger(), OperationTimeout: time.Minute}
	var client pulsar.Client
	if local {
		client, err = ubpulsar.NewClient(opts, ubpulsar.Options{Local: ubpulsar.LocalConfig{Topics: []string{a.Topic}, Log: mq.Config{SegmentSize: 4 << 20, Segments: 4}}})
		defer ubpulsar.RemoveLocal(a.Topic, "bench")
	} else {
		client, err = pulsar.NewClient(opts)
	}
	if err != nil {
		return bench.Measurement{}, err
	}
	defer client.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: a.Topic, DisableBatching: true, SendTimeout: 8 * time.Second})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer p.Close()
	return runLocal("mq-pulsar-local", a, func(ctx context.Context, b []byte) error {
		_, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: b})
		return err
	})
}

// pulsarLocalConsumer receives a.N messages after the warm-up, taking
// each one's latency and summing its bytes.
func pulsarLocalConsumer(a localArgs) error {
	opts := pulsar.ClientOptions{URL: a.Broker, Logger: quietPulsarLogger(), OperationTimeout: time.Minute}
	var client pulsar.Client
	var err error
	if a.Local {
		// One partition, as the producer's (whichever makes the log).
		client, err = ubpulsar.NewClient(opts, ubpulsar.Options{Local: ubpulsar.LocalConfig{Topics: []string{a.Topic}, Partitions: 1}})
	} else {
		client, err = pulsar.NewClient(opts)
	}
	if err != nil {
		return err
	}
	defer client.Close()
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: a.Topic, SubscriptionName: "bench", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Println("subscribed")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	m, err := c.Receive(ctx)
	if err != nil {
		return err
	}
	if string(m.Payload()) != string(warmUp) {
		return fmt.Errorf("a first message of %d bytes, not the warm-up", len(m.Payload()))
	}
	c.Ack(m)
	fmt.Println("ready")
	res := localResult{Samples: make([]float64, 0, a.N)}
	for range a.N {
		m, err := c.Receive(ctx)
		if err != nil {
			return err
		}
		lat, err := latencyOf(m.Payload())
		if err != nil {
			return err
		}
		res.Samples = append(res.Samples, lat)
		res.N++
		res.Sum += bench.Sum(m.Payload())
		c.Ack(m)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// rocketmqLocal is pulsarLocal's RocketMQ twin.
func rocketmqLocal(b *Brokers, d time.Duration, local bool) (bench.Measurement, error) {
	rlog.SetLogLevel("error")
	br, err := b.RocketMQ()
	if err != nil {
		return bench.Measurement{}, err
	}
	a := localArgs{Broker: br.NamesrvAddr, Topic: fmt.Sprintf("bench-local-%d-%d", os.Getpid(), offloadRun.Add(1)), N: localMessages(d), Local: local}
	opts := []producer.Option{producer.WithNameServer([]string{br.NamesrvAddr}), producer.WithRetry(1),
		producer.WithGroupName("bench-" + a.Topic), producer.WithInstanceName(a.Topic), producer.WithSendMsgTimeout(time.Minute)}
	var p rocketmq.Producer
	if local {
		p, err = ubrocketmq.NewProducer(ubrocketmq.Options{Local: ubrocketmq.LocalConfig{Topics: []string{a.Topic}, Queues: 1, Log: mq.Config{SegmentSize: 4 << 20, Segments: 4}}}, opts...)
		defer ubrocketmq.RemoveLocal(a.Topic, "bench-"+a.Topic)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err = br.CreateTopic(ctx, a.Topic, 1)
		cancel()
		if err == nil {
			p, err = rocketmq.NewProducer(opts...)
		}
	}
	if err != nil {
		return bench.Measurement{}, err
	}
	if err := p.Start(); err != nil {
		return bench.Measurement{}, err
	}
	defer p.Shutdown()
	return runLocal("mq-rocketmq-local", a, func(ctx context.Context, b []byte) error {
		r, err := p.SendSync(ctx, primitive.NewMessage(a.Topic, b))
		if err == nil && r.Status != primitive.SendOK {
			err = fmt.Errorf("send status %v", r.Status)
		}
		return err
	})
}

// rocketmqLocalConsumer consumes a.N messages after the warm-up, in a
// fresh group from the first offset.
func rocketmqLocalConsumer(a localArgs) error {
	rlog.SetLogLevel("error")
	group := "bench-" + a.Topic
	opts := []rmqconsumer.Option{rmqconsumer.WithNameServer([]string{a.Broker}), rmqconsumer.WithGroupName(group),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset), rmqconsumer.WithInstance(a.Topic)}
	var c rocketmq.PushConsumer
	var err error
	if a.Local {
		c, err = ubrocketmq.NewPushConsumer(ubrocketmq.Options{Local: ubrocketmq.LocalConfig{Topics: []string{a.Topic}, Queues: 1, Group: group}}, opts...)
	} else {
		c, err = rocketmq.NewPushConsumer(opts...)
	}
	if err != nil {
		return err
	}
	var mu sync.Mutex
	res := localResult{Samples: make([]float64, 0, a.N)}
	var bad error
	all, warm := make(chan struct{}), make(chan struct{})
	warmed := false
	err = c.Subscribe(a.Topic, rmqconsumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
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
			if res.N == a.N {
				break // a redelivery beyond the count
			}
			lat, err := latencyOf(m.Body)
			if err != nil {
				bad = err
			}
			res.Samples = append(res.Samples, lat)
			res.N++
			res.Sum += bench.Sum(m.Body)
			if res.N == a.N {
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
	case <-time.After(5 * time.Minute):
		return errors.New("no warm-up message in 5 minutes")
	}
	fmt.Println("ready")
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		return fmt.Errorf("%d of %d messages in 5 minutes", res.N, a.N)
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != nil {
		return bad
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
