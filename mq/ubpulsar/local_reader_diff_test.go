package ubpulsar

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

// readerOp is one step of a reader's script: Next (if HasNext says
// there is a message, else just that), HasNext, or a Seek to the id of
// a message this reader read (pick chooses which) and a Next.
type readerOp struct {
	kind string // "next", "hasNext", "seek"
	pick int
}

// readerCase is a reader of the differential test: where it starts,
// whether that is inclusive, and its script.
type readerCase struct {
	start     string // "earliest", "latest" or "id"
	startAt   int    // the message index of an "id" start
	inclusive bool
	made      int // how many messages were sent when it is made
	ops       []readerOp
}

// readerScript is the differential test's random plan: n1 messages,
// readers made, n2 more messages, then each reader's script.
func readerScript(rng *rand.Rand, n1 int) []readerCase {
	cases := []readerCase{
		{start: "latest", made: 0},
		{start: "latest", inclusive: true, made: 0},
		{start: "earliest", made: n1},
		{start: "latest", made: n1},
		{start: "latest", inclusive: true, made: n1},
		{start: "id", startAt: rng.IntN(n1), made: n1},
		{start: "id", startAt: rng.IntN(n1), inclusive: true, made: n1},
		{start: "earliest", inclusive: true, made: n1},
	}
	for i := range cases {
		for range 80 {
			op := readerOp{kind: "next", pick: rng.IntN(1 << 20)}
			switch r := rng.IntN(10); {
			case r < 2:
				op.kind = "hasNext"
			case r < 4:
				op.kind = "seek"
			}
			cases[i].ops = append(cases[i].ops, op)
		}
	}
	return cases
}

// readerMsg is what a reader returned, for comparisons: the message's
// index in the sequence, key, properties, event time and payload.
type readerMsg struct {
	I     int
	Key   string
	Props map[string]string
	Event int64
	Size  int
	Sum   uint64
}

func (m readerMsg) String() string { return fmt.Sprintf("#%d", m.I) }

func readerMsgOf(t *testing.T, m pulsar.Message) readerMsg {
	t.Helper()
	var ev int64
	if !m.EventTime().IsZero() {
		ev = m.EventTime().UnixNano()
	}
	return readerMsg{I: index(t, m), Key: m.Key(), Props: m.Properties(), Event: ev, Size: len(m.Payload()), Sum: bench.Sum(m.Payload())}
}

// diffSend sends messages from..to of seq (keyed, with properties and,
// for some, event times) and returns their ids.
func diffSend(t *testing.T, ctx context.Context, p pulsar.Producer, seq []diffMsg, from, to int) []pulsar.MessageID {
	t.Helper()
	var ids []pulsar.MessageID
	for i := from; i < to; i++ {
		s := seq[i]
		id, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: s.payload(), Key: s.key, EventTime: s.event,
			Properties: map[string]string{"i": strconv.Itoa(i), "producer": strconv.Itoa(s.producer)}})
		if err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		ids = append(ids, id)
	}
	return ids
}

// runReaders runs the script through client on a one-partition topic
// and returns each reader's trace: what every step saw.
//
// With reopen, a Seek is a new reader from the id (the same
// StartMessageIDInclusive): upstream's Reader.Seek in this version
// leaves its Next waiting for ever now and then after a second seek
// (seen in two runs of four), and fails with "Consumer not found" when
// a Seek follows a Seek before the consumer reconnected.
func runReaders(t *testing.T, client pulsar.Client, topic string, seq []diffMsg, n1 int, cases []readerCase, reopen bool) [][]string {
	t.Helper()
	ctx := timeout(t, time.Minute)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	readers := make([]pulsar.Reader, len(cases))
	open := func(made int, ids []pulsar.MessageID) {
		for i, c := range cases {
			if c.made != made {
				continue
			}
			opts := pulsar.ReaderOptions{Topic: topic, StartMessageIDInclusive: c.inclusive}
			switch c.start {
			case "earliest":
				opts.StartMessageID = pulsar.EarliestMessageID()
			case "latest":
				opts.StartMessageID = pulsar.LatestMessageID()
			default:
				opts.StartMessageID = ids[c.startAt]
			}
			r, err := client.CreateReader(opts)
			if err != nil {
				t.Fatalf("reader %d: %v", i, err)
			}
			if r.Topic() != topic {
				t.Fatalf("reader %d of topic %s", i, r.Topic())
			}
			t.Cleanup(r.Close)
			readers[i] = r
		}
	}
	open(0, nil)
	ids := diffSend(t, ctx, p, seq, 0, n1)
	open(n1, ids)
	diffSend(t, ctx, p, seq, n1, len(seq))
	traces := make([][]string, len(cases))
	for i, c := range cases {
		r := readers[i]
		var read []pulsar.MessageID // ids this reader returned, by read order
		var readIdx []int
		var trace []string
		// Upstream's HasNext of a reader that started at Latest and
		// has read nothing since compares the broker's last id with
		// Latest's, and so is false however many messages were sent
		// (docs/mq.md, "Local topics"): until then the script reads
		// without asking (the plan sends messages after every Latest
		// start).
		unasked := func() bool { return c.start == "latest" && len(read) == 0 }
		next := func() string {
			m, err := r.Next(ctx)
			if err != nil {
				t.Fatalf("%s, reader %d: %v after\n%s", topic, i, err, strings.Join(trace, "\n"))
			}
			s := readerMsgOf(t, m)
			read, readIdx = append(read, m.ID()), append(readIdx, s.I)
			return fmt.Sprintf("next %d %s %v %d %d %d", s.I, s.Key, s.Props, s.Event, s.Size, s.Sum)
		}
		for _, op := range c.ops {
			switch op.kind {
			case "hasNext":
				if unasked() {
					trace = append(trace, "hasNext not asked")
					continue
				}
				trace = append(trace, "hasNext "+strconv.FormatBool(r.HasNext()))
			case "seek":
				if len(read) == 0 {
					trace = append(trace, "no seek")
					continue
				}
				j := op.pick % len(read)
				target := readIdx[j]
				if !c.inclusive && target == len(seq)-1 {
					trace = append(trace, "no seek")
					continue
				}
				trace = append(trace, "(seeking to "+strconv.Itoa(target)+")")
				if reopen {
					r.Close()
					var err error
					if r, err = client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: read[j], StartMessageIDInclusive: c.inclusive}); err != nil {
						t.Fatalf("reader %d: a reader from %d: %v", i, target, err)
					}
					t.Cleanup(r.Close)
				} else if err := r.Seek(read[j]); err != nil {
					t.Fatalf("reader %d: seek to %d: %v", i, target, err)
				}
				// A Next after every seek (there is a message after the
				// target): upstream's consumer reconnects after a seek,
				// and a Next waits for that.
				trace[len(trace)-1] = "seek " + strconv.Itoa(target) + " " + next()
			case "next":
				if !unasked() && !r.HasNext() {
					trace = append(trace, "end")
					continue
				}
				trace = append(trace, next())
			}
		}
		traces[i] = trace
		r.Close()
	}
	return traces
}

// runPartitionedReaders sends seq to a partitioned topic through client
// and reads it with readers from Earliest and from Latest (made before
// the sends) and Latest inclusive (after), each to the end, the
// Earliest one again after SeekByTime to 1970:
// what each saw, per partition in order. Seek and GetLastMessageID
// fail.
func runPartitionedReaders(t *testing.T, client pulsar.Client, topic string, seq []diffMsg) map[string]map[int32][]readerMsg {
	t.Helper()
	ctx := timeout(t, 3*time.Minute)
	p, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, SendTimeout: sendTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	reader := func(start pulsar.MessageID, inclusive bool) pulsar.Reader {
		r, err := client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: start, StartMessageIDInclusive: inclusive})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		return r
	}
	latest := reader(pulsar.LatestMessageID(), false)
	ids := diffSend(t, ctx, p, seq, 0, len(seq))
	earliest := reader(pulsar.EarliestMessageID(), false)
	lastIncl := reader(pulsar.LatestMessageID(), true)
	// drain reads n messages, then checks that HasNext is false. It
	// does not ask HasNext before: upstream's, on a partitioned topic,
	// returns at the first partition that has a message and leaves the
	// others' checks running, racing with the Next that follows (the
	// race detector says so); and on a reader from Latest that has read
	// nothing it is false (see runReaders).
	drain := func(r pulsar.Reader, n int) map[int32][]readerMsg {
		got := map[int32][]readerMsg{}
		for range n {
			m, err := r.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got[m.ID().PartitionIdx()] = append(got[m.ID().PartitionIdx()], readerMsgOf(t, m))
		}
		if r.HasNext() {
			t.Error("HasNext after every message")
		}
		return got
	}
	parts := map[uint32]bool{}
	for _, s := range seq {
		parts[javaStringHash(s.key)%3] = true
	}
	out := map[string]map[int32][]readerMsg{"latest": drain(latest, len(seq)), "earliest": drain(earliest, len(seq)),
		"latest-inclusive": drain(lastIncl, len(parts))}
	if err := earliest.Seek(ids[0]); err == nil {
		t.Error("Seek on a partitioned topic's reader")
	}
	if _, err := earliest.GetLastMessageID(); err == nil {
		t.Error("GetLastMessageID on a partitioned topic's reader")
	}
	if err := earliest.SeekByTime(time.Unix(0, 0)); err != nil {
		t.Fatal(err)
	}
	out["earliest-after-seek-by-time"] = drain(earliest, len(seq))
	return out
}

// testLocalReaderDifferential runs one random plan of sends and reader
// operations (start positions, Next, HasNext, Seek to a read id)
// through a local topic and through the same topic on the broker, and
// compares every step: which message, key, properties, event time and
// payload, in order. Then readers of a 3-partition topic, on both.
func testLocalReaderDifferential(t *testing.T, b *testenv.Pulsar) {
	rng := rand.New(rand.NewPCG(18, 3))
	seq := diffSequence(rng, 60)
	const n1 = 35
	cases := readerScript(rng, n1)
	local := "persistent://public/default/" + unique("local-rdiff")
	broker := "persistent://public/default/" + unique("broker-rdiff")
	gotLocal := runReaders(t, localClient(t, b.ServiceURL, localOptions(1, local), local), local, seq, n1, cases, false)
	gotBroker := runReaders(t, plain(t, b.ServiceURL), broker, seq, n1, cases, true)
	steps := map[string]int{}
	for i := range cases {
		if !slices.Equal(gotLocal[i], gotBroker[i]) {
			t.Errorf("reader %d (%+v) differs:\nlocal  %s\nbroker %s", i, cases[i], strings.Join(gotLocal[i], "\n       "), strings.Join(gotBroker[i], "\n       "))
		}
		for _, s := range gotLocal[i] {
			steps[strings.Fields(s)[0]]++
		}
	}
	if steps["next"] < 100 || steps["seek"] < 20 || steps["end"] == 0 || steps["hasNext"] < 20 {
		t.Fatalf("steps %v: the plan tests too little", steps)
	}
	t.Logf("%d readers, steps %v: the same on both", len(cases), steps)

	localP := "persistent://public/default/" + unique("local-rdiff-p")
	brokerP := "persistent://public/default/" + unique("broker-rdiff-p")
	createPartitioned(t, b.WebURL, brokerP, 3)
	pLocal := runPartitionedReaders(t, localClient(t, b.ServiceURL, localOptions(3, localP), localP), localP, seq)
	pBroker := runPartitionedReaders(t, plain(t, b.ServiceURL), brokerP, seq)
	for name, got := range pLocal {
		if !reflect.DeepEqual(got, pBroker[name]) {
			t.Errorf("partitioned, %s: local\n%v\nbroker\n%v", name, got, pBroker[name])
		}
	}
	if n := len(pLocal["earliest"]); n != 3 || len(pLocal["latest-inclusive"][0]) != 1 {
		t.Fatalf("partitioned: %d partitions read, latest inclusive %v: the plan tests too little", n, pLocal["latest-inclusive"])
	}
}
