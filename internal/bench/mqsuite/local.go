package mqsuite

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/rocketmq-client-go/v2"
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
	result
	Samples []float64 `json:"samples"`
}

func init() {
	registerPeer("mq-pulsar-local", pulsarLocalConsumer)
	registerPeer("mq-rocketmq-local", rocketmqLocalConsumer)
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

// latencies is the local-latency consumers' tally: each of n messages'
// latency, in the order received.
func latencies(n int) tally {
	samples := make([]float64, 0, n)
	return tally{
		add: func(payload []byte) error {
			lat, err := latencyOf(payload)
			samples = append(samples, lat)
			return err
		},
		report: func(res result) any { return localResult{result: res, Samples: samples} },
	}
}

// localWarm is how many of a run's first messages are sent, received,
// counted and summed but not timed: a quarter of the run, at most 250 ms
// of them. Both processes' first hundred-odd milliseconds after the
// warm-up message held latencies of 1-4 ms, for the local topic and the
// broker alike (the clients' own start-up work; the log mapping and
// faulting in its first segment), which made a run's p99 whatever came
// first rather than the path's steady state; log-100B-p99 leaves out
// its warm-up the same way.
func localWarm(n int) int { return min(n/4, int(250*time.Millisecond/localInterval)) }

// runLocal starts the consumer peer, warms the path up (a message the
// consumer answers ready to, then localWarm paced messages it counts but
// whose latency is left out), sends a.N stamped messages one every
// localInterval and checks the consumer's count and sum.
func runLocal(role string, a localArgs, send func(ctx context.Context, payload []byte) error) (bench.Measurement, error) {
	warm := localWarm(a.N)
	a.N += warm
	var res localResult
	_, err := runBroker(role, a, &res, send, func(ctx context.Context) (uint64, uint64, error) {
		var sum uint64
		next := time.Now()
		for i := range a.N {
			b := stamped(i)
			sum += bench.Sum(b)
			if err := send(ctx, b); err != nil {
				return 0, 0, err
			}
			next = next.Add(localInterval)
			time.Sleep(time.Until(next)) // pacing: the offered load
		}
		return uint64(a.N), sum, nil
	})
	if err != nil {
		return bench.Measurement{}, err
	}
	if len(res.Samples) != a.N {
		return bench.Measurement{}, fmt.Errorf("%s: %d latencies of %d messages", role, len(res.Samples), a.N)
	}
	timed := res.Samples[warm:]
	return bench.Measurement{Value: median(timed), Samples: timed}, nil
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
	opts := pulsarOptions(br.ServiceURL)
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
	return runLocal("mq-pulsar-local", a, pulsarSend(p))
}

// pulsarLocalConsumer receives a.N messages after the warm-up, taking
// each one's latency and summing its bytes.
func pulsarLocalConsumer(a localArgs) error {
	opts := pulsarOptions(a.Broker)
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
	return pulsarReceive(client, pulsar.ConsumerOptions{Topic: a.Topic, SubscriptionName: "bench", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest}, a.N, latencies(a.N))
}

// rocketmqLocal is pulsarLocal's RocketMQ twin.
func rocketmqLocal(b *Brokers, d time.Duration, local bool) (bench.Measurement, error) {
	rlog.SetLogLevel("error")
	br, err := b.RocketMQ()
	if err != nil {
		return bench.Measurement{}, err
	}
	a := localArgs{Broker: br.NamesrvAddr, Topic: fmt.Sprintf("bench-local-%d-%d", os.Getpid(), offloadRun.Add(1)), N: localMessages(d), Local: local}
	opts := rocketmqProducerOptions(br.NamesrvAddr, a.Topic)
	var p rocketmq.Producer
	if local {
		p, err = ubrocketmq.NewProducer(ubrocketmq.Options{Local: ubrocketmq.LocalConfig{Topics: []string{a.Topic}, Queues: 1, Log: mq.Config{SegmentSize: 4 << 20, Segments: 4}}}, opts...)
		defer ubrocketmq.RemoveLocal(a.Topic, rocketmqGroup(a.Topic))
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
	return runLocal("mq-rocketmq-local", a, rocketmqSend(p, a.Topic))
}

// rocketmqLocalConsumer consumes a.N messages after the warm-up, in a
// fresh group from the first offset.
func rocketmqLocalConsumer(a localArgs) error {
	rlog.SetLogLevel("error")
	opts := rocketmqConsumerOptions(a.Broker, a.Topic)
	var c rocketmq.PushConsumer
	var err error
	if a.Local {
		c, err = ubrocketmq.NewPushConsumer(ubrocketmq.Options{Local: ubrocketmq.LocalConfig{Topics: []string{a.Topic}, Queues: 1, Group: rocketmqGroup(a.Topic)}}, opts...)
	} else {
		c, err = rocketmq.NewPushConsumer(opts...)
	}
	if err != nil {
		return err
	}
	return rocketmqReceive(c, a.Topic, a.N, latencies(a.N))
}
