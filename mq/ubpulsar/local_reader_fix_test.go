package ubpulsar

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/shm"
)

// TestLocalReaderCreateVsClose: CreateReader racing with the client's
// Close either gets a reader (closed by Close) or fails with
// mq.ErrClosed; it never reads a log Close unmapped (a SIGSEGV, as a
// review found: the reader was registered only after its positions).
func TestLocalReaderCreateVsClose(t *testing.T) {
	for range 30 {
		topic := "persistent://public/default/" + unique("local-rclose")
		c, err := NewClient(clientOptions("pulsar://127.0.0.1:1"), localOptions(1, topic))
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		sendLocal(t, timeout(t, time.Minute), p, 0, 200)
		p.Close()
		var wg sync.WaitGroup
		started := make(chan struct{}, 4)
		for range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					r, err := c.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
					if err != nil {
						if !errors.Is(err, mq.ErrClosed) {
							t.Errorf("CreateReader: %v", err)
						}
						return
					}
					r.Close()
					if i == 0 {
						started <- struct{}{}
					}
				}
			})
		}
		for range 4 {
			<-started
		}
		c.Close()
		wg.Wait()
		mq.Remove(LocalLogName(topic))
	}
}

// TestLocalReaderHeldRecord: a record loaned and not committed while its
// writer is alive ends what HasNext, GetLastMessageID, SeekByTime and
// CreateReader(Latest, inclusive) see, as upstream's do not see
// uncommitted messages: none of them waits for it. Next reads it once
// committed.
func TestLocalReaderHeldRecord(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-rheld")
	client, p := producerOf(t, localOptions(1, topic), topic)
	ctx := timeout(t, time.Minute)
	ids := sendLocal(t, ctx, p, 0, 2)
	l, err := mq.Open(LocalLogName(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held, err := l.Loan(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Abort()
	sendLocal(t, ctx, p, 2, 1) // committed, after the held record
	// Each call in a goroutine: a wait on the held record fails the test
	// at ctx's end instead of hanging it.
	done := func(what string, f func()) {
		t.Helper()
		ch := make(chan struct{})
		go func() { defer close(ch); f() }()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s waits on a held record", what)
		}
	}
	r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if got := readAll(t, ctx, r, 2); got[0] != 0 || got[1] != 1 {
		t.Fatalf("read %v", got)
	}
	var has bool
	done("HasNext", func() { has = r.HasNext() })
	if has {
		t.Fatal("HasNext true at a held record")
	}
	var last pulsar.MessageID
	done("GetLastMessageID", func() { last, err = r.GetLastMessageID() })
	if err != nil || last.String() != ids[1].String() {
		t.Fatalf("GetLastMessageID %v, %v; want %v", last, err, ids[1])
	}
	done("SeekByTime", func() { err = r.SeekByTime(time.Now().Add(time.Hour)) })
	if err != nil {
		t.Fatal(err)
	}
	// An exclusive start at the held record (an id that names it, as a
	// forged or deserialized one can) is refused: the message after it
	// is not known yet.
	if r3, err := client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: &localID{partition: 0, offset: held.Offset()}}); err == nil {
		r3.Close()
		t.Fatal("a reader after a message not yet sent")
	}
	var r2 pulsar.Reader
	done("CreateReader(Latest, inclusive)", func() {
		r2, err = client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	held.Abort()
	if got := readAll(t, ctx, r2, 2); got[0] != 1 || got[1] != 2 {
		t.Fatalf("Latest inclusive read %v, want [1 2] (from the last record before the held one)", got)
	}
}

// TestLocalReaderTailBelowHead: a meta segment (corrupt or hostile) whose
// tail is below its head makes the reader's methods fail with an error
// wrapping shm.ErrCorrupt; GetLastMessageID looped ~2^52 times under the
// reader's lock, as a review found, Close blocking behind it.
func TestLocalReaderTailBelowHead(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-rtail")
	o := Options{Local: LocalConfig{Topics: []string{topic}, Log: mq.Config{SegmentSize: 4096, Segments: 2, Full: mq.FullOverwrite}}}
	client, p := producerOf(t, o, topic)
	ctx := timeout(t, time.Minute)
	sendLocal(t, ctx, p, 0, 400)
	r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	meta, err := shm.OpenSegment("mq-" + LocalLogName(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	// Partition 0's tail and head words (mq/log.go's meta layout:
	// offParts0 = 128 + 256 producers x 16 + 64 readers x 128).
	const offParts0 = 128 + 256*16 + 64*128
	tail, err := meta.Uint64At(offParts0)
	if err != nil {
		t.Fatal(err)
	}
	head, err := meta.Uint64At(offParts0 + 128)
	if err != nil {
		t.Fatal(err)
	}
	if head.Load() == 0 {
		t.Fatal("nothing dropped: the test needs a head above 0")
	}
	good := tail.Load()
	tail.Store(0)
	defer tail.Store(good)
	calls := map[string]func() error{
		"GetLastMessageID": func() error { _, err := r.GetLastMessageID(); return err },
		"SeekByTime":       func() error { return r.SeekByTime(time.Unix(0, 0)) },
		"CreateReader(Latest, inclusive)": func() error {
			r2, err := client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.LatestMessageID(), StartMessageIDInclusive: true})
			if err == nil {
				r2.Close()
			}
			return err
		},
	}
	for what, f := range calls {
		ch := make(chan error, 1)
		go func() { ch <- f() }()
		select {
		case err := <-ch:
			if !errors.Is(err, shm.ErrCorrupt) {
				t.Errorf("%s with the tail below the head: %v, want shm.ErrCorrupt", what, err)
			}
		case <-ctx.Done():
			tail.Store(good)
			t.Fatalf("%s with the tail below the head: still running", what)
		}
	}
}

// TestLocalReaderOneSlot: with every other reader slot of the log taken,
// a reader still Seeks (forward, back), answers
// GetLastMessageID and SeekByTime, in its own slot, and reads on from
// where each put it. Each used to take a second slot before it gave its
// own up, and failed with mq.ErrNoSlot.
func TestLocalReaderOneSlot(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-rslot")
	client, p := producerOf(t, localOptions(1, topic), topic)
	ctx := timeout(t, time.Minute)
	ids := sendLocal(t, ctx, p, 0, 6)
	r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID(), StartMessageIDInclusive: true})
	l, err := mq.Open(LocalLogName(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []*mq.Reader
	defer func() {
		for _, mr := range held {
			mr.Close()
		}
	}()
	for {
		mr, err := l.NewReader(0, mq.Oldest)
		if errors.Is(err, mq.ErrNoSlot) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, mr)
	}
	if got := readAll(t, ctx, r, 1); got[0] != 0 {
		t.Fatalf("read %v", got)
	}
	if err := r.Seek(ids[3]); err != nil {
		t.Fatalf("Seek forward: %v", err)
	}
	if got := readAll(t, ctx, r, 1); got[0] != 3 {
		t.Fatalf("after Seek(3): %v", got)
	}
	if err := r.Seek(ids[1]); err != nil {
		t.Fatalf("Seek back: %v", err)
	}
	if got := readAll(t, ctx, r, 1); got[0] != 1 {
		t.Fatalf("after Seek(1): %v", got)
	}
	if !r.HasNext() { // reads message 2 ahead
		t.Fatal("HasNext false")
	}
	last, err := r.GetLastMessageID()
	if err != nil || last.String() != ids[5].String() {
		t.Fatalf("GetLastMessageID: %v, %v; want %v", last, err, ids[5])
	}
	if got := readAll(t, ctx, r, 2); got[0] != 2 || got[1] != 3 {
		t.Fatalf("after GetLastMessageID: %v, want [2 3] (where it was)", got)
	}
	if err := r.SeekByTime(time.Unix(0, 0)); err != nil {
		t.Fatalf("SeekByTime: %v", err)
	}
	if got := readAll(t, ctx, r, 1); got[0] != 0 {
		t.Fatalf("after SeekByTime(0): %v", got)
	}
	// A failed Seek leaves it where it was.
	if err := r.Seek(&localID{partition: 0, offset: 1 << 40}); err == nil {
		t.Fatal("Seek beyond the tail succeeded")
	}
	if got := readAll(t, ctx, r, 1); got[0] != 1 {
		t.Fatalf("after a failed Seek: %v", got)
	}
}

// TestLocalIDSerialize: a local message id's Serialize is what
// pulsar.DeserializeMessageID reads (upstream's way to keep a reader's
// place across restarts), and the id it makes starts a reader and seeks
// one to the same message. DeserializeMessageID failed on the 12 bytes
// Serialize used to return.
func TestLocalIDSerialize(t *testing.T) {
	topic := "persistent://public/default/" + unique("local-rser")
	client, p := producerOf(t, localOptions(1, topic), topic)
	ctx := timeout(t, time.Minute)
	ids := sendLocal(t, ctx, p, 0, 4)
	for i, id := range ids {
		back, err := pulsar.DeserializeMessageID(id.Serialize())
		if err != nil {
			t.Fatalf("DeserializeMessageID of %v: %v", id, err)
		}
		if back.LedgerID() != id.LedgerID() || back.EntryID() != id.EntryID() || back.PartitionIdx() != id.PartitionIdx() || back.BatchIdx() != id.BatchIdx() {
			t.Fatalf("%v came back as %v", id, back)
		}
		for _, inclusive := range []bool{true, false} {
			r := newLocalReader(t, client, pulsar.ReaderOptions{Topic: topic, StartMessageID: back, StartMessageIDInclusive: inclusive})
			want := i
			if !inclusive {
				want++
			}
			if want < len(ids) {
				if got := readAll(t, ctx, r, 1); got[0] != want {
					t.Fatalf("a reader from deserialized %v (inclusive %v) read %v, want %d", id, inclusive, got, want)
				}
			}
			if err := r.Seek(back); err != nil {
				t.Fatalf("Seek to deserialized %v: %v", id, err)
			}
			if want < len(ids) {
				if got := readAll(t, ctx, r, 1); got[0] != want {
					t.Fatalf("after Seek to deserialized %v (inclusive %v): read %v, want %d", id, inclusive, got, want)
				}
			} else if r.HasNext() {
				t.Fatalf("after Seek past the last message: HasNext true")
			}
		}
	}
	// A broker's id is not taken for a local one.
	if _, err := client.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.NewMessageID(3, 0, -1, 0)}); err == nil {
		t.Fatal("a reader of a local topic from a broker's message id")
	}
}
