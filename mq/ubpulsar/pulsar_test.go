package ubpulsar

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mq/offload"
)

func TestMain(m *testing.M) {
	testenv.RegisterChild("consumer", consumerChild)
	testenv.Main(m)
}

// quietLogger is pulsar-client-go's logrus logger at error level.
func quietLogger() plog.Logger {
	l := logrus.New()
	l.SetOutput(os.Stderr)
	l.SetLevel(logrus.ErrorLevel)
	return plog.NewLoggerWithLogrus(l)
}

func clientOptions(url string) pulsar.ClientOptions {
	return pulsar.ClientOptions{URL: url, Logger: quietLogger(), ConnectionTimeout: 30 * time.Second, OperationTimeout: 30 * time.Second}
}

// sendTimeout is every test producer's: a closed producer's timeout
// goroutine lives SendTimeout on (default 30 s), and testenv.Main's leak
// check waits 10 s.
const sendTimeout = 7 * time.Second

var seq atomic.Int64

func unique(what string) string { return fmt.Sprintf("%s-%d-%d", what, os.Getpid(), seq.Add(1)) }

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// store is a store for one test, removed after it.
func store(t testing.TB, c offload.StoreConfig) *offload.Store {
	t.Helper()
	name := unique("ubpulsar-test")
	s, err := offload.OpenStore(name, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		offload.Remove(name)
	})
	return s
}

// dropIn is a drop-in client offloading topics above threshold into s.
func dropIn(t testing.TB, url string, s *offload.Store, threshold int, log *slog.Logger, topics ...string) pulsar.Client {
	t.Helper()
	c, err := NewClient(clientOptions(url), Options{Topics: topics, Threshold: threshold, Store: s, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func plain(t testing.TB, url string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(clientOptions(url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// createPartitioned makes topic a partitioned topic of n partitions.
func createPartitioned(t *testing.T, web, topic string, n int) {
	t.Helper()
	name := strings.TrimPrefix(topic, "persistent://")
	req, _ := http.NewRequest(http.MethodPut, web+"/admin/v2/persistent/"+name+"/partitions", strings.NewReader(strconv.Itoa(n)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("create %s with %d partitions: %s %s", topic, n, resp.Status, body)
	}
}

// sent is one message of a sequence: who sends it, its key, size and
// seed (its payload is bench.Fill of seed).
type sent struct {
	producer int
	key      string
	size     int
	seed     uint64
}

func (s sent) payload() []byte {
	b := make([]byte, s.size)
	bench.Fill(b, s.seed)
	return b
}

// received is what a consumer saw of a message, for comparisons.
type received struct {
	Partition int32
	Key       string
	Props     map[string]string
	Size      int
	Sum       uint64
}

func receivedOf(m pulsar.Message) received {
	return received{Partition: m.ID().PartitionIdx(), Key: m.Key(), Props: m.Properties(), Size: len(m.Payload()), Sum: bench.Sum(m.Payload())}
}

// sequence is n random messages from 3 producers: sizes below and above
// threshold, keys from a few.
func sequence(rng *rand.Rand, n, threshold int) []sent {
	sizes := []int{100, threshold / 2, threshold + 1, 3 * threshold, 5 * threshold}
	var seqn []sent
	for i := range n {
		seqn = append(seqn, sent{producer: rng.IntN(3), key: "k" + strconv.Itoa(rng.IntN(5)), size: sizes[rng.IntN(len(sizes))], seed: uint64(i)})
	}
	return seqn
}

// run sends seqn to topic through client (one producer each, in
// sequence order) and receives it all on a new exclusive subscription,
// in the order the broker delivers.
func run(t *testing.T, client pulsar.Client, topic string, seqn []sent) []received {
	t.Helper()
	ctx := timeout(t, 2*time.Minute)
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "diff", Type: pulsar.Exclusive,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var producers []pulsar.Producer
	for i := range 3 {
		p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout, Name: fmt.Sprintf("%s-p%d", topic[strings.LastIndex(topic, "/")+1:], i)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		producers = append(producers, p)
	}
	for i, s := range seqn {
		msg := &pulsar.ProducerMessage{Payload: s.payload(), Key: s.key, Properties: map[string]string{"i": strconv.Itoa(i), "producer": strconv.Itoa(s.producer)}}
		if _, err := producers[s.producer].Send(ctx, msg); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	var got []received
	for range seqn {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatalf("after %d messages: %v", len(got), err)
		}
		got = append(got, receivedOf(m))
		if err := c.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// perPartition splits messages by partition, keeping their order.
func perPartition(rs []received) map[int32][]received {
	m := map[int32][]received{}
	for _, r := range rs {
		m[r.Partition] = append(m[r.Partition], r)
	}
	return m
}

func TestPulsar(t *testing.T) {
	start := time.Now()
	b := testenv.StartPulsar(t, testenv.BrokerOptions{Durable: true})
	t.Logf("Pulsar ready in %v", time.Since(start).Round(time.Millisecond))
	t.Run("Differential", func(t *testing.T) { testDifferential(t, b) })
	t.Run("NackDifferential", func(t *testing.T) { testNackDifferential(t, b) })
	t.Run("KilledConsumer", func(t *testing.T) { testKilledConsumer(t, b) })
	t.Run("Gone", func(t *testing.T) { testGone(t, b) })
	t.Run("Example", func(t *testing.T) { testExample(t, b) })
	t.Run("Restart", func(t *testing.T) { testRestart(t, b) })
	t.Run("LocalDifferential", func(t *testing.T) { testLocalDifferential(t, b) })
	t.Run("LocalProducerProcess", func(t *testing.T) { testLocalProducerProcess(t, b) })
	t.Run("LocalKilledConsumer", func(t *testing.T) { testLocalKilledConsumer(t, b) })
	t.Run("LocalReaderDifferential", func(t *testing.T) { testLocalReaderDifferential(t, b) })
}

// testDifferential runs one random sequence through the drop-in (offload
// on) and through the plain client, each on its own partitioned topic of
// the same broker: the consumers see the same messages (payloads, keys,
// the properties the user set) in the same order per partition. A plain
// consumer of the drop-in's topic sees the deliberate difference: small
// references marked with PropertyOffload.
func testDifferential(t *testing.T, b *testenv.Pulsar) {
	const threshold = 16 << 10
	seqn := sequence(rand.New(rand.NewPCG(18, 1)), 60, threshold)
	s := store(t, offload.StoreConfig{SegmentSize: 8 << 20})
	topicUB, topicPlain := "persistent://public/default/"+unique("diff-ub"), "persistent://public/default/"+unique("diff-plain")
	createPartitioned(t, b.WebURL, topicUB, 3)
	createPartitioned(t, b.WebURL, topicPlain, 3)

	gotUB := run(t, dropIn(t, b.ServiceURL, s, threshold, nil, topicUB), topicUB, seqn)
	gotPlain := run(t, plain(t, b.ServiceURL), topicPlain, seqn)
	if !reflect.DeepEqual(perPartition(gotUB), perPartition(gotPlain)) {
		t.Fatalf("the drop-in's consumer saw\n%v\nthe plain client's\n%v", perPartition(gotUB), perPartition(gotPlain))
	}
	offloaded := 0
	for _, s := range seqn {
		if s.size > threshold {
			offloaded++
		}
	}
	if offloaded == 0 || offloaded == len(seqn) {
		t.Fatalf("%d of %d messages above the threshold: the sequence tests nothing", offloaded, len(seqn))
	}
	// What a plain client sees on the drop-in's topic.
	ctx := timeout(t, time.Minute)
	c, err := plain(t, b.ServiceURL).Subscribe(pulsar.ConsumerOptions{Topic: topicUB, SubscriptionName: "plain-view",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refs := 0
	for range seqn {
		m, err := c.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m.Properties()[PropertyOffload] == "1" {
			if _, err := offload.ParseRef(m.Payload()); err != nil || len(m.Payload()) > offload.MaxRefSize {
				t.Fatalf("a marked message's payload: %d bytes, %v", len(m.Payload()), err)
			}
			refs++
		}
		c.Ack(m)
	}
	if refs != offloaded {
		t.Fatalf("the broker carried %d references, %d payloads were above the threshold", refs, offloaded)
	}
	t.Logf("%d messages, %d offloaded, %d partitions: same per-partition sequences", len(seqn), offloaded, len(perPartition(gotUB)))
}

// consumerChild subscribes (shared subscription UBP_SUB of UBP_TOPIC)
// through the drop-in, prints the size and sum of the first message it
// receives, and waits, without acking, until killed.
func consumerChild() int {
	c, err := NewClient(clientOptions(os.Getenv("UBP_URL")), Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: os.Getenv("UBP_TOPIC"), SubscriptionName: os.Getenv("UBP_SUB"), Type: pulsar.Shared,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest, ReceiverQueueSize: 1})
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
	fmt.Printf("%d %d\n", len(m.Payload()), bench.Sum(m.Payload()))
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// testKilledConsumer: a consumer process receives an offloaded message
// and is killed before its ack; the broker redelivers the message to
// this process's consumer on the same subscription, with its payload.
func testKilledConsumer(t *testing.T, b *testenv.Pulsar) {
	const threshold = 1 << 10
	s := store(t, offload.StoreConfig{SegmentSize: 4 << 20})
	topic := "persistent://public/default/" + unique("killed")
	client := dropIn(t, b.ServiceURL, s, threshold, nil, topic)
	ctx := timeout(t, 2*time.Minute)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := sent{size: 200 << 10, seed: 7}.payload()
	// The subscription exists before the send (Earliest covers a late one too).
	sub, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Shared, ReceiverQueueSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: want}); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Child(t, "consumer", "UBP_URL="+b.ServiceURL, "UBP_TOPIC="+topic, "UBP_SUB=s")
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
	if wantLine := fmt.Sprintf("%d %d\n", len(want), bench.Sum(want)); err != nil || line != wantLine {
		t.Fatalf("the consumer process said %q (%v), want %q", line, err, wantLine)
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
	if !bytes.Equal(m.Payload(), want) {
		t.Fatalf("redelivered with %d bytes, not the payload sent", len(m.Payload()))
	}
	if m.RedeliveryCount() == 0 {
		t.Logf("redelivery count 0 (the broker counts redeliveries after nacks and timeouts, not after a consumer's death)")
	}
	c.Ack(m)
}

// logRecorder is a slog handler that keeps messages.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.msgs = append(l.msgs, b.String())
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }
func (l *logRecorder) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

// testGone: a message whose payload retention dropped is never delivered
// (empty or otherwise): it is logged and nacked, redelivered by the
// broker, and after the DLQ policy's deliveries it goes to the
// dead-letter topic, while the next message, whose payload is kept, is
// delivered.
func testGone(t *testing.T, b *testenv.Pulsar) {
	const threshold = 1 << 10
	s := store(t, offload.StoreConfig{SegmentSize: 256 << 10, Segments: 2})
	topic, dlq := "persistent://public/default/"+unique("gone"), "persistent://public/default/"+unique("gone-dlq")
	rec := &logRecorder{}
	client := dropIn(t, b.ServiceURL, s, threshold, slog.New(rec), topic)
	ctx := timeout(t, 2*time.Minute)
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Shared,
		NackRedeliveryDelay: 100 * time.Millisecond, DLQ: &pulsar.DLQPolicy{MaxDeliveries: 3, DeadLetterTopic: dlq,
			ProducerOptions: pulsar.ProducerOptions{SendTimeout: sendTimeout}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dead, err := plain(t, b.ServiceURL).Subscribe(pulsar.ConsumerOptions{Topic: dlq, SubscriptionName: "dlq",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, SendTimeout: sendTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	gone := sent{size: 100 << 10, seed: 1}
	if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: gone.payload(), Properties: map[string]string{"which": "gone"}}); err != nil {
		t.Fatal(err)
	}
	// Push it out of the store's 512 KiB.
	for i := range 8 {
		if _, err := s.Put(ctx, sent{size: 100 << 10, seed: uint64(100 + i)}.payload()); err != nil {
			t.Fatal(err)
		}
	}
	kept := sent{size: 100 << 10, seed: 2}
	if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: kept.payload(), Properties: map[string]string{"which": "kept"}}); err != nil {
		t.Fatal(err)
	}
	m, err := c.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Properties()["which"] != "kept" || !bytes.Equal(m.Payload(), kept.payload()) {
		t.Fatalf("received %v with %d bytes; want the kept message", m.Properties(), len(m.Payload()))
	}
	c.Ack(m)
	// The consumer goes on receiving (the nacks and redeliveries happen
	// inside its Receive) while the dead letter is awaited.
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		m, err := c.Receive(rctx)
		if err == nil {
			err = fmt.Errorf("delivered %v with %d bytes", m.Properties(), len(m.Payload()))
		} else if rctx.Err() != nil {
			err = nil
		}
		done <- err
	}()
	d, err := dead.Receive(ctx)
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatalf("nothing on the dead-letter topic: %v", err)
	}
	if d.Properties()["which"] != "gone" || d.Properties()[PropertyOffload] != "1" {
		t.Fatalf("the dead letter: %v", d.Properties())
	}
	dead.Ack(d)
	if n := rec.count("could not be resolved"); n < 1 {
		t.Fatalf("%d errors logged for the gone payload", n)
	}
	t.Logf("gone payload: %d resolution errors logged, then dead-lettered", rec.count("could not be resolved"))
}

// testRestart: offloaded messages survive a broker crash: sent, the
// broker killed and restarted on its data, then received (through
// Chan) with their payloads.
func testRestart(t *testing.T, b *testenv.Pulsar) {
	const threshold = 1 << 10
	s := store(t, offload.StoreConfig{SegmentSize: 4 << 20})
	topic := "persistent://public/default/" + unique("restart")
	client := dropIn(t, b.ServiceURL, s, threshold, nil, topic)
	ctx := timeout(t, 3*time.Minute)
	sub, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout})
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	for i := range n {
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: sent{size: 50 << 10, seed: uint64(i)}.payload()}); err != nil {
			t.Fatal(err)
		}
	}
	p.Close()
	client.Close()
	b.Restart(false)
	client = dropIn(t, b.ServiceURL, s, threshold, nil, topic)
	c, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range n {
		select {
		case cm := <-c.Chan():
			if want := (sent{size: 50 << 10, seed: uint64(i)}).payload(); !bytes.Equal(cm.Payload(), want) {
				t.Fatalf("message %d after the restart: %d bytes, not the payload sent", i, len(cm.Payload()))
			}
			cm.Ack(cm.Message)
		case <-ctx.Done():
			t.Fatalf("message %d after the restart: %v", i, ctx.Err())
		}
	}
}
