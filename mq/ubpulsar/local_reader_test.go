package ubpulsar

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
)

// sendLocal sends n messages (key k<i%3>, property i, an event time on
// even ones) to topic through p, from index from, and returns their ids.
func sendLocal(t *testing.T, ctx context.Context, p pulsar.Producer, from, n int) []pulsar.MessageID {
	t.Helper()
	var ids []pulsar.MessageID
	for i := from; i < from+n; i++ {
		msg := &pulsar.ProducerMessage{Payload: sent{size: 10 + i, seed: uint64(i)}.payload(), Key: "k" + strconv.Itoa(i%3),
			Properties: map[string]string{"i": strconv.Itoa(i)}}
		if i%2 == 0 {
			msg.EventTime = time.UnixMilli(1_700_000_000_000 + int64(i))
		}
		id, err := p.Send(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// index is a message's property i.
func index(t *testing.T, m pulsar.Message) int {
	t.Helper()
	i, err := strconv.Atoi(m.Properties()["i"])
	if err != nil {
		t.Fatalf("a message with property i %q", m.Properties()["i"])
	}
	return i
}

// next is r.Next, failing the test on an error.
func next(t *testing.T, ctx context.Context, r pulsar.Reader) pulsar.Message {
	t.Helper()
	m, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// readAll reads n messages and returns their indexes.
func readAll(t *testing.T, ctx context.Context, r pulsar.Reader, n int) []int {
	t.Helper()
	var got []int
	for range n {
		got = append(got, index(t, next(t, ctx, r)))
	}
	return got
}

// producerOf is a client of local topic and a producer of it, for
// the reader tests; both close at the test's end.
func producerOf(t *testing.T, o Options, topic string) (pulsar.Client, pulsar.Producer) {
	t.Helper()
	client := localClient(t, "pulsar://127.0.0.1:1", o, topic)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return client, p
}

func newLocalReader(t *testing.T, client pulsar.Client, opts pulsar.ReaderOptions) pulsar.Reader {
	t.Helper()
	r, err := client.CreateReader(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestLocalReaderOptions: the options a local reader refuses, and why.
func TestLocalReaderOptions(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-ropts")
	parted := "persistent://public/default/" + unique("local-ropts-p")
	client := localClient(t, "pulsar://127.0.0.1:1", localOptions(1, topic), topic)
	client3 := localClient(t, "pulsar://127.0.0.1:1", localOptions(3, parted), parted)
	ctx := timeout(t, time.Minute)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	id := sendLocal(t, ctx, p, 0, 1)[0]
	earliest := pulsar.EarliestMessageID()
	for _, c := range []struct {
		name        string
		client      pulsar.Client
		opts        pulsar.ReaderOptions
		unsupported bool
	}{
		{"no start", client, pulsar.ReaderOptions{Topic: topic}, false},
		{"schema", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: earliest, Schema: pulsar.NewStringSchema(nil)}, true},
		{"decryption", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: earliest, Decryption: &pulsar.MessageDecryptionInfo{}}, true},
		{"compacted", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: earliest, ReadCompacted: true}, true},
		{"channel", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: earliest, MessageChannel: make(chan pulsar.ReaderMessage)}, true},
		{"broker id", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.NewMessageID(7, 3, -1, 0)}, false},
		{"id on a partitioned topic", client3, pulsar.ReaderOptions{Topic: parted, StartMessageID: id}, true},
		{"id beyond the tail", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: &localID{offset: 1 << 30}}, false},
		{"id of another partition", client, pulsar.ReaderOptions{Topic: topic, StartMessageID: &localID{partition: 2}}, false},
	} {
		r, err := c.client.CreateReader(c.opts)
		if err == nil {
			r.Close()
			t.Errorf("%s: a reader", c.name)
			continue
		}
		if errors.Is(err, ErrLocalUnsupported) != c.unsupported {
			t.Errorf("%s: %v (ErrLocalUnsupported: want %v)", c.name, err, c.unsupported)
		}
	}
	// Options that change nothing on a local topic are taken.
	r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: earliest, Name: "n", SubscriptionName: "s",
		ReceiverQueueSize: 5, Properties: map[string]string{"a": "b"}, MaxPendingChunkedMessage: 3})
	if m := next(t, ctx, r); index(t, m) != 0 || r.Topic() != topic {
		t.Fatalf("message %d of topic %s", index(t, m), r.Topic())
	}
}

// TestLocalReader: one partition, no broker: the start positions, Next,
// HasNext, Seek, SeekByTime, GetLastMessageID, Close; and the messages
// are the local consumer's.
func TestLocalReader(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-reader")
	client := localClient(t, "pulsar://127.0.0.1:1", localOptions(1, topic), topic)
	removeGroups(t, topic, "s")
	ctx := timeout(t, time.Minute)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, Name: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	empty := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if empty.HasNext() {
		t.Fatal("HasNext on an empty topic")
	}
	if id, err := empty.GetLastMessageID(); err != nil || id != pulsar.EarliestMessageID() {
		t.Fatalf("last id of an empty topic: %v %v", id, err)
	}
	latestEmpty := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})

	const n = 20
	ids := sendLocal(t, ctx, p, 0, n)
	latest := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID()})
	latestIncl := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
	at5 := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: ids[5]})
	at5Incl := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: ids[5], StartMessageIDInclusive: true})

	// Earliest: every message, as the local consumer gets it.
	cons, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var all []pulsar.Message
	for i := range n {
		if !empty.HasNext() {
			t.Fatalf("HasNext false before message %d", i)
		}
		m := next(t, ctx, empty)
		c, err := cons.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		cons.Ack(c)
		if string(m.Payload()) != string(c.Payload()) || m.Key() != c.Key() || !maps.Equal(m.Properties(), c.Properties()) ||
			!m.EventTime().Equal(c.EventTime()) || !m.PublishTime().Equal(c.PublishTime()) || m.ProducerName() != c.ProducerName() ||
			m.ID().String() != c.ID().String() || m.ID().String() != ids[i].String() || m.RedeliveryCount() != 0 || m.Topic() != topic {
			t.Fatalf("message %d: the reader's %v, the consumer's %v", i, m, c)
		}
		if i%2 == 0 && m.EventTime().IsZero() {
			t.Fatalf("message %d without its event time", i)
		}
		all = append(all, m)
	}
	if empty.HasNext() {
		t.Fatal("HasNext at the end")
	}
	if m := next(t, ctx, latestEmpty); index(t, m) != 0 {
		t.Fatalf("latest inclusive on an empty topic: message %d first", index(t, m))
	}
	if m := next(t, ctx, latestIncl); index(t, m) != n-1 {
		t.Fatalf("latest inclusive: message %d first", index(t, m))
	}
	if m := next(t, ctx, at5); index(t, m) != 6 {
		t.Fatalf("after id 5: message %d", index(t, m))
	}
	if m := next(t, ctx, at5Incl); index(t, m) != 5 {
		t.Fatalf("at id 5 inclusive: message %d", index(t, m))
	}
	if latest.HasNext() {
		t.Fatal("latest: HasNext before a send")
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	if _, err := latest.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with nothing to read: %v", err)
	}
	cancel()
	// A Next waiting when the message is sent returns it.
	got := make(chan int, 1)
	go func() {
		m, err := latest.Next(ctx)
		if err != nil {
			t.Error(err)
			got <- -1
			return
		}
		got <- index(t, m)
	}()
	ids = append(ids, sendLocal(t, ctx, p, n, 1)...)
	if i := <-got; i != n {
		t.Fatalf("latest: message %d", i)
	}
	if id, err := latest.GetLastMessageID(); err != nil || id.String() != ids[n].String() {
		t.Fatalf("last id %v %v, sent %v", id, err, ids[n])
	}

	// Seek to a saved id: the next message after it (the reader is not
	// inclusive), then inclusive.
	if err := empty.Seek(all[3].ID()); err != nil {
		t.Fatal(err)
	}
	if m := next(t, ctx, empty); index(t, m) != 4 {
		t.Fatalf("after seek to 3: message %d", index(t, m))
	}
	if err := at5Incl.Seek(ids[15]); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, ctx, at5Incl, 3); got[0] != 15 || got[2] != 17 {
		t.Fatalf("after inclusive seek to 15: %v", got)
	}
	for name, id := range map[string]pulsar.MessageID{"earliest": pulsar.EarliestMessageID(), "latest": pulsar.LatestMessageID(), "nil": nil} {
		if err := empty.Seek(id); err == nil {
			t.Errorf("seek to %s: no error", name)
		}
	}

	// SeekByTime: the first message published at or after a message's
	// publish time, to the millisecond.
	ms := func(m pulsar.Message) int64 { return m.PublishTime().UnixMilli() }
	target := all[n/2].PublishTime()
	want := 0
	for ms(all[want]) < target.UnixMilli() {
		want++
	}
	if err := empty.SeekByTime(target); err != nil {
		t.Fatal(err)
	}
	if m := next(t, ctx, empty); index(t, m) != want {
		t.Fatalf("seek by time %v: message %d, want %d", target, index(t, m), want)
	}
	if err := empty.SeekByTime(time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	if m := next(t, ctx, empty); index(t, m) != 0 {
		t.Fatalf("seek by time to 1970: message %d", index(t, m))
	}
	if err := empty.SeekByTime(time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if empty.HasNext() {
		t.Fatal("HasNext after a seek past the last publish time")
	}

	// Close: a waiting Next returns, later calls fail, Close again is
	// nothing.
	done := make(chan error, 1)
	go func() {
		_, err := empty.Next(ctx)
		done <- err
	}()
	empty.Close()
	if err := <-done; !errors.Is(err, mq.ErrClosed) {
		t.Fatalf("a Next waiting when the reader closed: %v", err)
	}
	empty.Close()
	if _, err := empty.Next(ctx); !errors.Is(err, mq.ErrClosed) {
		t.Errorf("Next after Close: %v", err)
	}
	if empty.HasNext() {
		t.Error("HasNext after Close")
	}
	if err := empty.Seek(ids[0]); !errors.Is(err, mq.ErrClosed) {
		t.Errorf("Seek after Close: %v", err)
	}
	if err := empty.SeekByTime(time.Now()); !errors.Is(err, mq.ErrClosed) {
		t.Errorf("SeekByTime after Close: %v", err)
	}
	if _, err := empty.GetLastMessageID(); !errors.Is(err, mq.ErrClosed) {
		t.Errorf("GetLastMessageID after Close: %v", err)
	}
}

// TestLocalReaderPartitioned: a reader of a partitioned local topic reads
// every partition, each in order; Seek and GetLastMessageID are refused
// as upstream's, SeekByTime moves every partition; the client's Close
// closes the readers still open.
func TestLocalReaderPartitioned(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-reader-p")
	client, p := producerOf(t, localOptions(3, topic), topic)
	ctx := timeout(t, time.Minute)
	r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	latestIncl := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
	const n = 30
	ids := sendLocal(t, ctx, p, 0, n)
	partOf := map[int]int32{}
	for i, id := range ids {
		partOf[i] = id.PartitionIdx()
	}
	check := func(r pulsar.Reader, want map[int32][]int) {
		t.Helper()
		got := map[int32][]int{}
		total := 0
		for _, w := range want {
			total += len(w)
		}
		for range total {
			m := next(t, ctx, r)
			i := index(t, m)
			if m.ID().PartitionIdx() != partOf[i] {
				t.Fatalf("message %d from partition %d, sent to %d", i, m.ID().PartitionIdx(), partOf[i])
			}
			got[partOf[i]] = append(got[partOf[i]], i)
		}
		for part, w := range want {
			if len(got[part]) != len(w) {
				t.Fatalf("partition %d: %v, want %v", part, got[part], w)
			}
			for j := range w {
				if got[part][j] != w[j] {
					t.Fatalf("partition %d: %v, want %v", part, got[part], w)
				}
			}
		}
		if r.HasNext() {
			t.Fatal("HasNext after every message")
		}
	}
	want := map[int32][]int{}
	for i := range n {
		want[partOf[i]] = append(want[partOf[i]], i)
	}
	if len(want) != 3 {
		t.Fatalf("%d partitions used", len(want))
	}
	check(r, want)
	// Latest inclusive made before the sends: every message too.
	check(latestIncl, want)
	// Latest inclusive now: each partition's last message.
	last := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
	lasts := map[int32][]int{}
	for part, w := range want {
		lasts[part] = w[len(w)-1:]
	}
	check(last, lasts)
	if err := r.Seek(ids[0]); err == nil {
		t.Error("seek on a partitioned topic")
	}
	if _, err := r.GetLastMessageID(); err == nil {
		t.Error("last message id on a partitioned topic")
	}
	if err := r.SeekByTime(time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	check(r, want)
	// A Next waiting on every partition gets a message sent to any.
	got := make(chan int, 1)
	go func() {
		m, err := r.Next(ctx)
		if err != nil {
			t.Error(err)
			got <- -1
			return
		}
		got <- index(t, m)
	}()
	sendLocal(t, ctx, p, n, 1)
	if i := <-got; i != n {
		t.Fatalf("message %d", i)
	}
	client.Close()
	if _, err := r.Next(ctx); !errors.Is(err, mq.ErrClosed) {
		t.Fatalf("Next after the client's Close: %v", err)
	}
}

// TestLocalReaderRetention: a reader whose next message retention
// dropped gets an error wrapping mq.ErrOffsetGone (it does not skip);
// a start id retention dropped starts at the oldest message kept; an
// open reader holds the log's segments, so under FullFail a producer
// that would drop its segment fails.
func TestLocalReaderRetention(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-reader-ret")
	o := Options{Local: LocalConfig{Topics: []string{topic}, Log: mq.Config{SegmentSize: 4096, Segments: 2, Full: mq.FullOverwrite}}}
	client, p := producerOf(t, o, topic)
	ctx := timeout(t, time.Minute)
	ids := sendLocal(t, ctx, p, 0, 1)
	behind := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	for i := 1; i < 100; i++ {
		ids = append(ids, sendLocal(t, ctx, p, i, 1)...)
	}
	if _, err := behind.Next(ctx); !errors.Is(err, mq.ErrOffsetGone) {
		t.Fatalf("a reader behind retention: %v", err)
	}
	oldest := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	first := index(t, next(t, ctx, oldest))
	if first == 0 {
		t.Fatal("nothing dropped: the test tests nothing")
	}
	fromGone := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: ids[0]})
	if i := index(t, next(t, ctx, fromGone)); i != first {
		t.Fatalf("from a dropped id: message %d, the oldest kept is %d", i, first)
	}

	failing := "persistent://public/default/" + unique("local-reader-full")
	o = Options{Local: LocalConfig{Topics: []string{failing}, Log: mq.Config{SegmentSize: 4096, Segments: 2, Full: mq.FullFail}}}
	client, p = producerOf(t, o, failing)
	newLocalReader(t, client, pulsar.ReaderOptions{Topic: failing, StartMessageID: pulsar.EarliestMessageID()})
	for i := range 100 {
		_, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: make([]byte, 200)})
		if errors.Is(err, mq.ErrFull) {
			return
		}
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	t.Fatal("100 sends past an open reader at the oldest record, under FullFail")
}

// TestLocalReaderHostile: a record that is not a local topic's (a
// hostile or buggy writer's) is logged and skipped, by Next and HasNext.
func TestLocalReaderHostile(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-reader-bad")
	o := localOptions(1, topic)
	o.Logger = slog.New(slog.DiscardHandler)
	client, p := producerOf(t, o, topic)
	ctx := timeout(t, time.Minute)
	r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	l, err := mq.Open(LocalLogName(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Send(ctx, 0, []byte("not a local record")); err != nil {
		t.Fatal(err)
	}
	if r.HasNext() {
		t.Fatal("HasNext with only a record that does not decode")
	}
	if _, err := l.Send(ctx, 0, []byte("uPL1 nor this")); err != nil {
		t.Fatal(err)
	}
	sendLocal(t, ctx, p, 0, 1)
	if !r.HasNext() {
		t.Fatal("HasNext false with a message after the bad records")
	}
	if i := index(t, next(t, ctx, r)); i != 0 {
		t.Fatalf("message %d", i)
	}
}
