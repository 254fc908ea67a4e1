package ubpulsar

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mq"
)

func init() {
	testenv.RegisterChild("local-producer", localProducerChild)
	testenv.RegisterChild("local-consumer", localConsumerChild)
}

// localOptions makes topic pattern (and its DLQ) local, with parts
// partitions of small segments.
func localOptions(parts int, topics ...string) Options {
	return Options{Local: LocalConfig{Topics: topics, Partitions: parts, Log: mq.Config{SegmentSize: 1 << 20, Segments: 4}}}
}

// localClient is a drop-in serving topics locally; their logs and
// groups are removed after the test.
func localClient(t testing.TB, url string, o Options, topics ...string) pulsar.Client {
	t.Helper()
	// Removed after the client's Close (cleanups run newest first),
	// which waits for the segments its logs make ahead.
	for _, topic := range topics {
		t.Cleanup(func() { mq.Remove(LocalLogName(topic)) })
	}
	c, err := NewClient(clientOptions(url), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// removeGroups removes subscriptions subs of local topic after the test.
func removeGroups(t testing.TB, topic string, subs ...string) {
	for _, s := range subs {
		t.Cleanup(func() { mq.RemoveGroup(LocalLogName(topic), localGroupName(s)) })
	}
}

// op is what the consumer does with each delivery of a message: nack
// the first nacks deliveries, then ack (or nack forever if dead).
type diffMsg struct {
	sent
	event time.Time
	nacks int
	dead  bool
}

// seen is one delivery, for comparisons.
type seen struct {
	I           int // the message's index in the sequence
	Partition   int32
	Key         string
	Props       map[string]string
	EventTime   int64
	Size        int
	Sum         uint64
	Redelivered uint32
}

const dlqMaxDeliveries = 3

// diffSequence is n messages from 3 producers, every one keyed (so that
// both sides route it to the same partition), some nacked once or
// twice, some nacked until they go to the dead-letter topic.
func diffSequence(rng *rand.Rand, n int) []diffMsg {
	var out []diffMsg
	for i := range n {
		m := diffMsg{sent: sent{producer: rng.IntN(3), key: "k" + strconv.Itoa(rng.IntN(7)), size: 1 + rng.IntN(4000), seed: uint64(1000 + i)}}
		if rng.IntN(2) == 0 {
			m.event = time.UnixMilli(1_700_000_000_000 + int64(i))
		}
		switch r := rng.IntN(10); {
		case r < 2:
			m.nacks = 1
		case r < 3:
			m.nacks = 2
		case r < 4:
			m.dead = true
		}
		out = append(out, m)
	}
	return out
}

// diffOutcome is what the consumers of one side saw.
type diffOutcome struct {
	first      map[int32][]seen // first deliveries by partition, in order
	deliveries map[int][]uint32 // redelivery counts of each message's deliveries
	dead       []seen           // what the dead-letter topic got, by index
}

// runDiff sends seq through client to topic and consumes it on a Shared
// subscription with a DLQ policy, nacking and acking as each message
// says, until every message is acked or dead-lettered.
func runDiff(t *testing.T, client pulsar.Client, topic string, seq []diffMsg) diffOutcome {
	t.Helper()
	ctx := timeout(t, 3*time.Minute)
	dlqTopic := topic + "-DLQ"
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "diff", Type: pulsar.Shared,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest, NackRedeliveryDelay: 300 * time.Millisecond,
		DLQ: &pulsar.DLQPolicy{MaxDeliveries: dlqMaxDeliveries, DeadLetterTopic: dlqTopic, ProducerOptions: pulsar.ProducerOptions{SendTimeout: sendTimeout}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// After c: the subscription with the DLQ policy makes a local
	// dead-letter topic's log, with room for the dead-letter header.
	dlq, err := client.Subscribe(pulsar.ConsumerOptions{Topic: dlqTopic, SubscriptionName: "dlq", Type: pulsar.Shared,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer dlq.Close()
	var producers []pulsar.Producer
	for i := range 3 {
		p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout, Name: fmt.Sprintf("%s-p%d", topic, i)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		producers = append(producers, p)
	}
	for i, s := range seq {
		msg := &pulsar.ProducerMessage{Payload: s.payload(), Key: s.key, EventTime: s.event,
			Properties: map[string]string{"i": strconv.Itoa(i), "producer": strconv.Itoa(s.producer)}}
		if _, err := producers[s.producer].Send(ctx, msg); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	toAck, toDie := 0, 0
	for _, s := range seq {
		if s.dead {
			toDie++
		} else {
			toAck++
		}
	}
	out := diffOutcome{first: map[int32][]seen{}, deliveries: map[int][]uint32{}}
	seenOf := func(m pulsar.Message) seen {
		i, err := strconv.Atoi(m.Properties()["i"])
		if err != nil || i < 0 || i >= len(seq) {
			t.Fatalf("a message with property i %q", m.Properties()["i"])
		}
		props := maps.Clone(m.Properties())
		// The broker's dead letters carry where they came from; local
		// ones do not (docs/mq.md, "Local topics").
		delete(props, pulsar.SysPropertyRealTopic)
		delete(props, pulsar.SysPropertyOriginMessageID)
		delete(props, pulsar.PropertyOriginMessageID)
		var ev int64
		if !m.EventTime().IsZero() {
			ev = m.EventTime().UnixNano()
		}
		return seen{I: i, Partition: m.ID().PartitionIdx(), Key: m.Key(), Props: props, EventTime: ev,
			Size: len(m.Payload()), Sum: bench.Sum(m.Payload()), Redelivered: m.RedeliveryCount()}
	}
	// The main consumer's Receive must go on while the last dead
	// letters are routed: it runs until both counts are reached.
	var wg sync.WaitGroup
	recvCtx, stop := context.WithCancel(ctx)
	defer stop()
	acked := make(chan struct{})
	var recvErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		n := 0
		for {
			m, err := c.Receive(recvCtx)
			if err != nil {
				if recvCtx.Err() == nil {
					recvErr = err
				}
				return
			}
			s := seenOf(m)
			d := seq[s.I]
			if s.Redelivered == 0 {
				out.first[s.Partition] = append(out.first[s.Partition], s)
			}
			out.deliveries[s.I] = append(out.deliveries[s.I], s.Redelivered)
			if d.dead || int(s.Redelivered) < d.nacks {
				c.Nack(m)
				continue
			}
			if err := c.Ack(m); err != nil {
				recvErr = err
				return
			}
			if n++; n == toAck {
				close(acked)
			}
		}
	}()
	for range toDie {
		m, err := dlq.Receive(ctx)
		if err != nil {
			stop()
			wg.Wait()
			t.Fatalf("dead letters after %d: %v (consumer: %v)", len(out.dead), err, recvErr)
		}
		s := seenOf(m)
		s.Partition, s.Redelivered = 0, 0 // where and how a dead letter is, is each side's
		out.dead = append(out.dead, s)
		dlq.Ack(m)
	}
	select {
	case <-acked:
	case <-ctx.Done():
	}
	stop()
	wg.Wait()
	if recvErr != nil || ctx.Err() != nil {
		t.Fatalf("consumer: %v %v", recvErr, ctx.Err())
	}
	slices.SortFunc(out.dead, func(a, b seen) int { return a.I - b.I })
	return out
}

// testLocalDifferential runs one random sequence of sends (three
// producers, keys, properties, event times), nacks, acks and dead
// letters through a local topic and through the same topic on the
// broker, and compares what the consumers got: per-partition order of
// first deliveries with payloads, keys and properties; every message's
// redelivery counts; the dead letters.
func testLocalDifferential(t *testing.T, b *testenv.Pulsar) {
	seq := diffSequence(rand.New(rand.NewPCG(18, 2)), 80)
	local := "persistent://public/default/" + unique("local-diff")
	broker := "persistent://public/default/" + unique("broker-diff")
	createPartitioned(t, b.WebURL, broker, 3)
	removeGroups(t, local, "diff")
	removeGroups(t, local+"-DLQ", "dlq")
	gotLocal := runDiff(t, localClient(t, b.ServiceURL, localOptions(3, local+"*"), local, local+"-DLQ"), local, seq)
	gotBroker := runDiff(t, plain(t, b.ServiceURL), broker, seq)
	if !reflect.DeepEqual(gotLocal.first, gotBroker.first) {
		t.Errorf("first deliveries per partition differ:\nlocal  %v\nbroker %v", gotLocal.first, gotBroker.first)
	}
	if !reflect.DeepEqual(gotLocal.deliveries, gotBroker.deliveries) {
		t.Errorf("redelivery counts differ:\nlocal  %v\nbroker %v", gotLocal.deliveries, gotBroker.deliveries)
	}
	if !reflect.DeepEqual(gotLocal.dead, gotBroker.dead) {
		t.Errorf("dead letters differ:\nlocal  %v\nbroker %v", gotLocal.dead, gotBroker.dead)
	}
	redelivered := 0
	for _, d := range gotLocal.deliveries {
		if len(d) > 1 {
			redelivered++
		}
	}
	if len(gotLocal.first) < 2 || redelivered == 0 || len(gotLocal.dead) == 0 {
		t.Fatalf("%d partitions, %d redelivered, %d dead: the sequence tests too little", len(gotLocal.first), redelivered, len(gotLocal.dead))
	}
	t.Logf("%d messages, %d partitions, %d redelivered, %d dead-lettered: the same on both", len(seq), len(gotLocal.first), redelivered, len(gotLocal.dead))
}

// localProducerChild publishes UBP_N messages (sent{key k<i%5>, size
// 100+i, seed i}) to local topic UBP_TOPIC, then prints "sent".
func localProducerChild() int {
	topic := os.Getenv("UBP_TOPIC")
	n, _ := strconv.Atoi(os.Getenv("UBP_N"))
	c, err := NewClient(clientOptions(os.Getenv("UBP_URL")), localOptions(2, topic))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, Name: "child"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer p.Close()
	for i := range n {
		s := sent{key: "k" + strconv.Itoa(i%5), size: 100 + i, seed: uint64(i)}
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: s.payload(), Key: s.key, Properties: map[string]string{"i": strconv.Itoa(i)}}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("sent")
	return 0
}

// testLocalProducerProcess: a producer in another process publishes to
// a local topic; this process consumes every message, in order per key,
// with its payload and producer name.
func testLocalProducerProcess(t *testing.T, b *testenv.Pulsar) {
	const n = 200
	topic := "persistent://public/default/" + unique("local-proc")
	client := localClient(t, b.ServiceURL, localOptions(2, topic), topic)
	removeGroups(t, topic, "s")
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Failover})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd := testenv.Child(t, "local-producer", "UBP_URL="+b.ServiceURL, "UBP_TOPIC="+topic, "UBP_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil || string(out) != "sent\n" {
		t.Fatalf("the producer process said %q: %v", out, err)
	}
	ctx := timeout(t, time.Minute)
	last := map[string]int{}
	for range n {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i, _ := strconv.Atoi(m.Properties()["i"])
		s := sent{key: "k" + strconv.Itoa(i%5), size: 100 + i, seed: uint64(i)}
		if m.Key() != s.key || len(m.Payload()) != s.size || bench.Sum(m.Payload()) != bench.Sum(s.payload()) || m.ProducerName() != "child" {
			t.Fatalf("message %d: key %q, %d bytes, producer %q", i, m.Key(), len(m.Payload()), m.ProducerName())
		}
		if j, ok := last[s.key]; ok && j >= i {
			t.Fatalf("key %s: message %d after %d", s.key, i, j)
		}
		last[s.key] = i
		if want := int32(javaStringHash(s.key) % 2); m.ID().PartitionIdx() != want {
			t.Fatalf("key %s in partition %d, Pulsar's router picks %d", s.key, m.ID().PartitionIdx(), want)
		}
		if err := c.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
}

// localConsumerChild receives one message of local topic UBP_TOPIC on
// shared subscription s, prints its index, and waits unacked until
// killed.
func localConsumerChild() int {
	topic := os.Getenv("UBP_TOPIC")
	c, err := NewClient(clientOptions(os.Getenv("UBP_URL")), localOptions(1, topic))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Shared})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := cons.Receive(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(m.Properties()["i"])
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// testLocalKilledConsumer: a consumer process receives a message of a
// local topic and is killed before its ack; this process's consumer on
// the same subscription gets it redelivered (redelivery count 1, a
// deliberate difference from the broker's 0).
func testLocalKilledConsumer(t *testing.T, b *testenv.Pulsar) {
	topic := "persistent://public/default/" + unique("local-killed")
	client := localClient(t, b.ServiceURL, localOptions(1, topic), topic)
	removeGroups(t, topic, "s")
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := timeout(t, time.Minute)
	want := sent{size: 5000, seed: 3}.payload()
	if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: want, Properties: map[string]string{"i": "0"}}); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Child(t, "local-consumer", "UBP_URL="+b.ServiceURL, "UBP_TOPIC="+topic)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "0\n" {
		t.Fatalf("the consumer process said %q (%v)", line, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Shared})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m, err := c.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Payload()) != string(want) || m.RedeliveryCount() != 1 {
		t.Fatalf("redelivered %d bytes, redelivery count %d", len(m.Payload()), m.RedeliveryCount())
	}
	if err := c.Ack(m); err != nil {
		t.Fatal(err)
	}
}

// TestLocalSemantics: what local topics refuse, and the subscription
// types' exclusivity, without a broker.
func TestLocalSemantics(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-sem")
	client := localClient(t, "pulsar://127.0.0.1:1", localOptions(1, topic), topic)
	removeGroups(t, topic, "ex")
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := timeout(t, time.Minute)
	for name, msg := range map[string]*pulsar.ProducerMessage{
		"delayed": {Payload: []byte("x"), DeliverAfter: time.Second},
		"value":   {Value: 1},
	} {
		if _, err := p.Send(ctx, msg); !errors.Is(err, ErrLocalUnsupported) {
			t.Errorf("%s: %v", name, err)
		}
	}
	ex, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "ex", Type: pulsar.Exclusive})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "ex", Type: pulsar.Exclusive}); err == nil {
		t.Error("a second consumer of an exclusive subscription")
	}
	for name, f := range map[string]func() error{
		"seek":       func() error { return ex.Seek(nil) },
		"seekByTime": func() error { return ex.SeekByTime(time.Now()) },
		"cumulative": func() error { return ex.AckIDCumulative(nil) },
		"lastIDs":    func() error { _, err := ex.GetLastMessageIDs(); return err },
	} {
		if err := f(); !errors.Is(err, ErrLocalUnsupported) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("hello"), Key: "k", Properties: map[string]string{"a": "b"}}); err != nil {
		t.Fatal(err)
	}
	m, err := ex.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Payload()) != "hello" || m.Key() != "k" || m.Properties()["a"] != "b" || m.Topic() != topic {
		t.Fatalf("received %q key %q props %v topic %s", m.Payload(), m.Key(), m.Properties(), m.Topic())
	}
	if err := ex.Ack(m); err != nil {
		t.Fatal(err)
	}
	if err := ex.Ack(m); err == nil {
		t.Error("a second ack succeeded")
	}
	ex.Close()
	ex2, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "ex", Type: pulsar.Exclusive})
	if err != nil {
		t.Fatalf("after the exclusive consumer closed: %v", err)
	}
	ex2.Close()
}
