package mq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

func init() { testenv.RegisterChild("batch-holder", batchHolderChild) }

// TestLoanBatch: batches of many sizes and counts, through segments small
// enough that most batches end at a segment's end (Len below what was
// asked, then padding), from four producers at once, two of them with
// plain Loans between their batches: a reader reads every record once,
// intact, each producer's in its order, at the offsets the batches gave,
// and nothing aborted.
func TestLoanBatch(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 1 << 12})
	r := newReader(t, l, 0, 0)
	ctx := timeout(t, time.Minute)
	const producers, per = 4, 2000
	offsets := make([]map[uint64]uint64, producers) // seq -> offset, under mu
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		offsets[p] = map[uint64]uint64{}
		wg.Go(func() {
			seq := uint64(0)
			for i := 0; seq < per; i++ {
				n := 16 + (i*37+p*11)%300
				if p%2 == 1 && i%3 == 0 {
					b := make([]byte, n)
					message(b, uint64(p), seq)
					off, err := l.Send(ctx, 0, b)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					offsets[p][seq] = off
					mu.Unlock()
					seq++
					continue
				}
				b, err := l.LoanBatch(ctx, 0, n, min(1+i%40, per-int(seq)))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for j := range b.Len() {
					message(b.Bytes(j), uint64(p), seq)
					offsets[p][seq] = b.Offset(j)
					seq++
				}
				mu.Unlock()
				if err := b.Commit(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	// Read while the producers write (records of batches being
	// committed meanwhile): check the offsets at the end.
	next := make([]uint64, producers)
	got := make([]map[uint64]uint64, producers)
	for p := range got {
		got[p] = map[uint64]uint64{}
	}
	for range producers * per {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		p, seq := parse(t, rec.Payload)
		if p >= producers || seq != next[p] {
			t.Fatalf("producer %d seq %d, want seq %d", p, seq, next[p])
		}
		next[p]++
		got[p][seq] = rec.Offset
	}
	wg.Wait()
	for p := range producers {
		for seq, off := range got[p] {
			if offsets[p][seq] != off {
				t.Fatalf("producer %d seq %d at %d, the batch said %d", p, seq, off, offsets[p][seq])
			}
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st, _ := l.Stats(0); st.Aborted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLoanBatchLen: a batch takes as many records as fit in the rest of
// the segment, and the next one starts in the next segment after a pad.
func TestLoanBatchLen(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	b, err := l.LoanBatch(ctx, 0, 100, 1000) // 116 -> 120 bytes a record
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 4096/120 || b.Offset(0) != 0 || b.Offset(1) != 120 {
		t.Fatalf("a batch of %d at %d, %d", b.Len(), b.Offset(0), b.Offset(1))
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	b, err = l.LoanBatch(ctx, 0, 100, 2)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 2 || b.Offset(0) != 4096 {
		t.Fatalf("the next batch: %d at %d, want 2 at 4096", b.Len(), b.Offset(0))
	}
	b.Abort()
	if _, err := l.LoanBatch(ctx, 0, 100, 0); err == nil {
		t.Fatal("a batch of 0 records")
	}
	if _, err := l.LoanBatch(ctx, 0, 4096, 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a record larger than a segment: %v", err)
	}
	var zero Batch
	if err := zero.Commit(); !errors.Is(err, ErrAborted) {
		t.Fatalf("the zero batch's Commit: %v", err)
	}
}

// TestLoanBatchNotSeenUntilCommit: a reader sees none of a batch's
// records while it is being filled (NextBelow says there is nothing, Next
// waits), all of them once it is committed, and none of an aborted one
// (the record after it is read next).
func TestLoanBatchNotSeenUntilCommit(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 64 << 10})
	r := newReader(t, l, 0, 0)
	ctx := timeout(t, 10*time.Second)
	b, err := l.LoanBatch(ctx, 0, 40, 10)
	if err != nil {
		t.Fatal(err)
	}
	for j := range b.Len() {
		message(b.Bytes(j), 7, uint64(j))
	}
	st, _ := l.Stats(0)
	if _, ok, err := r.NextBelow(ctx, st.Tail); ok || err != nil {
		t.Fatalf("a record of a batch being filled: %v, %v", ok, err)
	}
	if _, err := r.Next(timeout(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next on a batch being filled: %v, want the deadline", err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for j := range 10 {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if p, seq := parse(t, rec.Payload); p != 7 || seq != uint64(j) || rec.Offset != b.Offset(j) {
			t.Fatalf("record %d: producer %d seq %d at %d", j, p, seq, rec.Offset)
		}
	}
	a, err := l.LoanBatch(ctx, 0, 40, 10)
	if err != nil {
		t.Fatal(err)
	}
	a.Abort()
	after := make([]byte, 40)
	message(after, 8, 0)
	if _, err := l.Send(ctx, 0, after); err != nil {
		t.Fatal(err)
	}
	rec, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := parse(t, rec.Payload); p != 8 {
		t.Fatalf("after an aborted batch: producer %d", p)
	}
}

// TestLoanBatchInnerFirst: the records after a batch's first have their
// headers before the first one's header publishes them all: a goroutine
// that sees the first committed finds the second's header there (the
// other way round it found 0, in 4 runs of 5).
func TestLoanBatchInnerFirst(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 1 << 20, Segments: 64})
	ctx := timeout(t, 30*time.Second)
	for range 200 {
		b, err := l.LoanBatch(ctx, 0, 200000, 2) // checksums long enough to be seen between
		if err != nil {
			t.Fatal(err)
		}
		if b.Len() < 2 {
			b.Abort()
			continue
		}
		first, second := &b.m.words[b.at/8], &b.m.words[(b.at+b.stride())/8]
		started, seen := make(chan struct{}), make(chan uint64)
		go func() {
			close(started)
			for first.Load()&stateMask == stateWriting {
				runtime.Gosched()
			}
			seen <- second.Load()
		}()
		<-started
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
		if w := <-seen; w&stateMask != stateCommitted {
			t.Fatalf("the first header committed, the second %#x", w)
		}
	}
}

// TestLoanBatchFlushOne: a log in files under a flush policy loans one
// record at a time (see LoanBatch), and it is on disk after Commit.
func TestLoanBatchFlushOne(t *testing.T) {
	for _, flush := range []FlushPolicy{FlushEverySend, FlushInterval} {
		l, _ := newDirLog(t, Config{SegmentSize: 64 << 10, Flush: flush})
		b, err := l.LoanBatch(timeout(t, 10*time.Second), 0, 100, 64)
		if err != nil {
			t.Fatal(err)
		}
		if b.Len() != 1 {
			t.Fatalf("flush %d: a batch of %d", flush, b.Len())
		}
		if err := b.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	l, _ := newDirLog(t, Config{SegmentSize: 64 << 10})
	b, err := l.LoanBatch(timeout(t, 10*time.Second), 0, 100, 64)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 64 {
		t.Fatalf("FlushNone: a batch of %d", b.Len())
	}
	b.Abort()
}

// batchHolderChild loans a batch of 20 records in log MQ_LOG, fills half,
// says so and waits to be killed.
func batchHolderChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	b, err := l.LoanBatch(context.Background(), 0, 100, 20)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for j := range b.Len() / 2 {
		message(b.Bytes(j), 9, uint64(j))
	}
	holdReady("loaned")
	return 1
}

// TestLoanBatchKilledProducer: a producer process SIGKILLed while it
// holds a batch leaves one claim stuck in writing: the reader finds its
// writer dead and skips the whole batch as one aborted record, and reads
// the record sent after it.
func TestLoanBatchKilledProducer(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 64 << 10})
	r := newReader(t, l, 0, 0)
	ctx := timeout(t, 30*time.Second)
	cmd := startWaiting(t, "batch-holder", l, "loaned")
	after := make([]byte, 100)
	message(after, 1, 1)
	off, err := l.Send(ctx, 0, after)
	if err != nil {
		t.Fatal(err)
	}
	if off != 20*120 {
		t.Fatalf("the record after the batch at %d, want %d", off, 20*120)
	}
	if _, err := r.Next(timeout(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("on a live writer's batch: %v, want the deadline", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	rec, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, seq := parse(t, rec.Payload); p != 1 || seq != 1 || rec.Offset != off {
		t.Fatalf("after the dead writer's batch: producer %d seq %d at %d", p, seq, rec.Offset)
	}
	if st, _ := l.Stats(0); st.Aborted != 1 || r.Aborted() != 1 {
		t.Errorf("aborted: stats %d, reader %d; want 1", st.Aborted, r.Aborted())
	}
}

// BenchmarkSendBatch100B: one goroutine loans 100-byte records 64 at a
// time, fills each and commits each batch; no reader (retention drops the
// oldest segment at each roll). Against BenchmarkSend100B's Loan per
// record.
func BenchmarkSendBatch100B(b *testing.B) {
	l := newLog(b, Config{})
	ctx := context.Background()
	b.SetBytes(100)
	b.ReportAllocs()
	for i := 0; i < b.N; {
		bt, err := l.LoanBatch(ctx, 0, 100, min(64, b.N-i))
		if err != nil {
			b.Fatal(err)
		}
		for j := range bt.Len() {
			message(bt.Bytes(j), 0, uint64(i+j))
		}
		if err := bt.Commit(); err != nil {
			b.Fatal(err)
		}
		i += bt.Len()
	}
}
