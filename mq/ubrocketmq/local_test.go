package ubrocketmq

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mq"
)

func init() {
	testenv.RegisterChild("local-producer", localProducerChild)
	testenv.RegisterChild("local-consumer", localConsumerChild)
}

// localOpts makes topics local with queues queues of small segments,
// consumed in group group; their logs and the group are removed after
// the test.
func localOpts(t testing.TB, group string, queues int, topics ...string) *Options {
	if t != nil {
		for _, topic := range topics {
			t.Cleanup(func() {
				mq.RemoveGroup(LocalLogName(topic), localGroupName(group))
				mq.Remove(LocalLogName(topic))
			})
		}
	}
	return &Options{Local: LocalConfig{Topics: topics, Queues: queues, Group: group, RetryDelay: 200 * time.Millisecond,
		Log: mq.Config{SegmentSize: 1 << 20, Segments: 4}}}
}

// The upstream clients need a name server address even when every topic
// is local; nothing listens at this one.
var (
	noBrokerP = []producer.Option{producer.WithNameServer([]string{"127.0.0.1:9"})}
	noBrokerC = []consumer.Option{consumer.WithNameServer([]string{"127.0.0.1:9"}), consumer.WithGroupName("unused")}
)

type rdiffMsg struct {
	sent
	tag     string
	retries int
}

// delivery is one delivery, for comparisons.
type delivery struct {
	offset    int64
	I         int
	Queue     int
	Tag, Keys string
	Props     map[string]string
	Size      int
	Sum       uint64
}

type rdiffOutcome struct {
	first     map[int][]delivery // first deliveries per queue, in queue order
	reconsume map[int][]int32    // reconsume times of each message's deliveries
}

// runLocalDiff sends seq (sharding keys, tags a, b and c, properties)
// from three producers to topic and consumes it with selector "a || b",
// returning ConsumeRetryLater as often as each message says.
func runLocalDiff(t *testing.T, b *testenv.RocketMQ, o *Options, topic, group string, seq []rdiffMsg) rdiffOutcome {
	t.Helper()
	ctx := timeout(t, 3*time.Minute)
	for i := range 3 {
		p := newProducer(t, b, o)
		for j, s := range seq {
			if s.producer != i {
				continue
			}
			m := primitive.NewMessage(topic, s.payload()).WithShardingKey(s.key).WithKeys([]string{s.key}).WithTag(s.tag)
			m.WithProperty("i", strconv.Itoa(j))
			if r, err := p.SendSync(ctx, m); err != nil || r.Status != primitive.SendOK {
				t.Fatalf("send %d: %v %v", j, r, err)
			}
		}
	}
	want := 0
	for _, s := range seq {
		if s.tag != "c" {
			want++
		}
	}
	var mu sync.Mutex
	out := rdiffOutcome{first: map[int][]delivery{}, reconsume: map[int][]int32{}}
	done, n := make(chan struct{}), 0
	consume(t, b, o, topic, group, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		m := msgs[0]
		i, err := strconv.Atoi(m.GetProperty("i"))
		if err != nil || i < 0 || i >= len(seq) {
			t.Errorf("a message with property i %q", m.GetProperty("i"))
			return consumer.ConsumeSuccess, nil
		}
		out.reconsume[i] = append(out.reconsume[i], m.ReconsumeTimes)
		if m.ReconsumeTimes == 0 {
			props := map[string]string{"i": m.GetProperty("i")}
			out.first[m.Queue.QueueId] = append(out.first[m.Queue.QueueId], delivery{offset: m.QueueOffset, I: i, Queue: m.Queue.QueueId,
				Tag: m.GetTags(), Keys: m.GetKeys(), Props: props, Size: len(m.Body), Sum: bench.Sum(m.Body)})
		}
		if int(m.ReconsumeTimes) < seq[i].retries {
			return consumer.ConsumeRetryLater, nil
		}
		if n++; n == want {
			close(done)
		}
		return consumer.ConsumeSuccess, nil
	}, consumer.WithConsumeMessageBatchMaxSize(1))
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d consumed: %v", n, want, out.reconsume)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, ds := range out.first {
		slices.SortFunc(ds, func(a, b delivery) int { return cmp.Compare(a.offset, b.offset) })
		for i := range ds {
			ds[i].offset = 0
		}
	}
	return out
}

func rdiffSequence(rng *rand.Rand, n int) []rdiffMsg {
	var out []rdiffMsg
	for i := range n {
		m := rdiffMsg{sent: sent{producer: rng.IntN(3), key: "k" + strconv.Itoa(rng.IntN(7)), size: 1 + rng.IntN(4000), seed: uint64(500 + i)},
			tag: []string{"a", "b", "c"}[rng.IntN(3)]}
		if rng.IntN(5) == 0 {
			m.retries = 1
		}
		out = append(out, m)
	}
	return out
}

// testLocalDifferential runs one random sequence (three producers,
// sharding keys, tags, properties, retries) through a local topic and
// through the same topic on the broker, side by side: the same first
// deliveries per queue in queue order, with bodies, tags, keys and
// properties, and the same reconsume counts for every message.
func testLocalDifferential(t *testing.T, b *testenv.RocketMQ) {
	seq := rdiffSequence(rand.New(rand.NewPCG(18, 3)), 60)
	// Every message is tagged a or b: the tag selector test is
	// TestLocalTags (a broker's subscription data is per group).
	for i := range seq {
		if seq[i].tag == "c" {
			seq[i].tag = "a"
		}
	}
	local, broker := unique("local-diff"), unique("broker-diff")
	groupLocal, groupBroker := unique("ldg"), unique("bdg")
	createTopic(t, b, broker, 4)
	var got, want rdiffOutcome
	t.Run("both", func(t *testing.T) {
		t.Run("local", func(t *testing.T) {
			t.Parallel()
			got = runLocalDiff(t, b, localOpts(t, groupLocal, 4, local), local, groupLocal, seq)
		})
		t.Run("broker", func(t *testing.T) {
			t.Parallel()
			want = runLocalDiff(t, b, nil, broker, groupBroker, seq)
		})
	})
	if t.Failed() {
		return
	}
	if !reflect.DeepEqual(got.first, want.first) {
		t.Errorf("first deliveries per queue differ:\nlocal  %v\nbroker %v", got.first, want.first)
	}
	if !reflect.DeepEqual(got.reconsume, want.reconsume) {
		t.Errorf("reconsume counts differ:\nlocal  %v\nbroker %v", got.reconsume, want.reconsume)
	}
	retried := 0
	for _, r := range got.reconsume {
		if len(r) > 1 {
			retried++
		}
	}
	if len(got.first) < 2 || retried == 0 {
		t.Fatalf("%d queues, %d retried: the sequence tests too little", len(got.first), retried)
	}
	t.Logf("%d messages over %d queues, %d retried: the same on both", len(seq), len(got.first), retried)
}

// TestLocalTags: a local subscription's tag selector delivers the tags
// it names and skips the rest; a SQL selector is refused. No broker:
// local topics need none.
func TestLocalTags(t *testing.T) {
	topic, group := unique("local-tags"), unique("ltg")
	o := localOpts(t, group, 2, topic, "%DLQ%"+group)
	o.Local.MaxReconsumeTimes = 1
	p, err := NewProducer(*o, noBrokerP...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown()
	ctx := timeout(t, time.Minute)
	for i, tag := range []string{"a", "c", "b", "c", "dead", "a"} {
		m := primitive.NewMessage(topic, []byte(strconv.Itoa(i))).WithTag(tag)
		if _, err := p.SendSync(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.SendSync(ctx, primitive.NewMessage(topic, nil).WithDelayTimeLevel(1)); !errors.Is(err, ErrLocalUnsupported) {
		t.Errorf("a delayed message: %v", err)
	}
	c, err := NewPushConsumer(*o, noBrokerC...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	if err := c.Subscribe(topic, consumer.MessageSelector{Type: consumer.SQL92, Expression: "a > 1"}, nil); err == nil {
		t.Error("a SQL selector accepted")
	}
	var mu sync.Mutex
	var got []string
	dead := make(chan struct{})
	if err := c.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "a || b || dead"}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(msgs[0].Body)+msgs[0].GetTags()+strconv.Itoa(int(msgs[0].ReconsumeTimes)))
		if msgs[0].GetTags() == "dead" {
			return consumer.ConsumeRetryLater, nil
		}
		return consumer.ConsumeSuccess, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Subscribe("%DLQ%"+group, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, "dlq:"+string(msgs[0].Body))
		close(dead)
		return consumer.ConsumeSuccess, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dead:
	case <-ctx.Done():
		t.Fatal("no dead letter")
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	if want := []string{"0a0", "2b0", "4dead0", "4dead1", "5a0", "dlq:4"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("consumed %v, want %v", got, want)
	}
}

// localProducerChild sends RMQ_N messages (key k<i%5>, body sent{size
// 100+i, seed i}) to local topic RMQ_TOPIC, then prints "sent".
func localProducerChild() int {
	rlog.SetLogLevel("error")
	n, _ := strconv.Atoi(os.Getenv("RMQ_N"))
	p, err := NewProducer(*localOpts(nil, "", 2, os.Getenv("RMQ_TOPIC")), noBrokerP...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer p.Shutdown()
	for i := range n {
		s := sent{key: "k" + strconv.Itoa(i%5), size: 100 + i, seed: uint64(i)}
		m := primitive.NewMessage(os.Getenv("RMQ_TOPIC"), s.payload()).WithShardingKey(s.key)
		m.WithProperty("i", strconv.Itoa(i))
		if _, err := p.SendSync(context.Background(), m); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	fmt.Println("sent")
	return 0
}

// TestLocalProducerProcess: a producer process sends to a local topic;
// this process's push consumer gets every message, in order per key.
func TestLocalProducerProcess(t *testing.T) {
	const n = 200
	topic, group := unique("local-proc"), unique("lpg")
	o := localOpts(t, group, 2, topic)
	cmd := testenv.Child(t, "local-producer", "RMQ_TOPIC="+topic, "RMQ_N="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	if out, err := cmd.Output(); err != nil || string(out) != "sent\n" {
		t.Fatalf("the producer process said %q: %v", out, err)
	}
	c, err := NewPushConsumer(*o, noBrokerC...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	var mu sync.Mutex
	last, bad, count := map[string]int{}, "", 0
	done := make(chan struct{})
	if err := c.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		m := msgs[0]
		i, _ := strconv.Atoi(m.GetProperty("i"))
		s := sent{key: "k" + strconv.Itoa(i%5), size: 100 + i, seed: uint64(i)}
		if m.GetShardingKey() != s.key || len(m.Body) != s.size || bench.Sum(m.Body) != bench.Sum(s.payload()) {
			bad = fmt.Sprintf("message %d: key %q, %d bytes", i, m.GetShardingKey(), len(m.Body))
		}
		if j, ok := last[s.key]; ok && j >= i {
			bad = fmt.Sprintf("key %s: message %d after %d", s.key, i, j)
		}
		last[s.key] = i
		if count++; count == n {
			close(done)
		}
		return consumer.ConsumeSuccess, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-timeout(t, time.Minute).Done():
		t.Fatalf("%d of %d", count, n)
	}
	mu.Lock()
	defer mu.Unlock()
	if bad != "" {
		t.Fatal(bad)
	}
}

// localConsumerChild consumes local topic RMQ_TOPIC in group RMQ_GROUP,
// prints the first body's index and holds it in its callback until
// killed.
func localConsumerChild() int {
	rlog.SetLogLevel("error")
	got := make(chan string, 1)
	c, err := NewPushConsumer(*localOpts(nil, os.Getenv("RMQ_GROUP"), 1, os.Getenv("RMQ_TOPIC")), noBrokerC...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = c.Subscribe(os.Getenv("RMQ_TOPIC"), consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		got <- string(msgs[0].Body)
		select {} // killed here, before the ack
	})
	if err == nil {
		err = c.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(<-got)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestLocalKilledConsumer: a consumer process is killed in its callback;
// a consumer of the same group here gets the message (reconsume times 1:
// the group counts the killed delivery).
func TestLocalKilledConsumer(t *testing.T) {
	topic, group := unique("local-killed"), unique("lkg")
	o := localOpts(t, group, 1, topic)
	p, err := NewProducer(*o, noBrokerP...)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown()
	ctx := timeout(t, time.Minute)
	if _, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte("held"))); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Child(t, "local-consumer", "RMQ_TOPIC="+topic, "RMQ_GROUP="+group)
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
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("the consumer process said %q (%v)", line, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	c, err := NewPushConsumer(*o, noBrokerC...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	got := make(chan string, 1)
	if err := c.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		select {
		case got <- fmt.Sprintf("%s %d", msgs[0].Body, msgs[0].ReconsumeTimes):
		default:
		}
		return consumer.ConsumeSuccess, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "held 1" {
			t.Fatalf("redelivered %q", s)
		}
	case <-ctx.Done():
		t.Fatal("not redelivered")
	}
}
