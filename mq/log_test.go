package mq

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

func TestMain(m *testing.M) {
	testenv.RegisterChild("producer", producerChild)
	testenv.RegisterChild("holder", holderChild)
	testenv.RegisterChild("reader", readerChild)
	testenv.Main(m)
}

var logSeq atomic.Int64

func newLog(t testing.TB, c Config) *Log {
	t.Helper()
	return newLogNamed(t, fmt.Sprintf("test-%d-%d", os.Getpid(), logSeq.Add(1)), c)
}

// newLogNamed is newLog for log name.
func newLogNamed(t testing.TB, name string, c Config) *Log {
	t.Helper()
	l, err := Create(name, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
		if err := Remove(name); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
	return l
}

func newReader(t testing.TB, l *Log, p int, from uint64) *Reader {
	t.Helper()
	r, err := l.NewReader(p, from)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// message is a self-checking payload: producer, sequence, then bytes made
// from both.
func message(b []byte, producer, seq uint64) {
	binary.LittleEndian.PutUint64(b, producer)
	binary.LittleEndian.PutUint64(b[8:], seq)
	bench.Fill(b[16:], producer<<32|seq)
}

func parse(t testing.TB, b []byte) (producer, seq uint64) {
	t.Helper()
	if len(b) < 16 {
		t.Fatalf("a %d-byte payload", len(b))
	}
	producer, seq = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	if bench.Sum(b[16:]) != bench.FillSum(len(b)-16, producer<<32|seq) {
		t.Fatalf("torn payload of producer %d seq %d", producer, seq)
	}
	return producer, seq
}

// TestSendNext sends records of many sizes through small segments, so that
// the log rolls and pads, and reads them back in order.
func TestSendNext(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 512})
	r := newReader(t, l, 0, Oldest)
	ctx := timeout(t, 10*time.Second)
	const n = 2000
	var offsets []uint64
	for i := range n {
		b := make([]byte, 16+(i*37)%700)
		message(b, 0, uint64(i))
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		offsets = append(offsets, off)
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, seq := parse(t, rec.Payload); seq != uint64(i) || rec.Offset != off || len(rec.Payload) != len(b) {
			t.Fatalf("record %d: seq %d at %d, sent at %d", i, seq, rec.Offset, off)
		}
	}
	// A second reader from an offset in the middle.
	r2 := newReader(t, l, 0, offsets[n/2])
	rec, err := r2.Next(ctx)
	if err != nil || rec.Offset != offsets[n/2] {
		t.Fatalf("from offset %d: %d %v", offsets[n/2], rec.Offset, err)
	}
	st, _ := l.Stats(0)
	if st.Tail <= offsets[n-1] || st.Aborted != 0 {
		t.Errorf("stats %+v", st)
	}
	if _, err := l.Loan(ctx, 0, 4096); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a loan larger than a segment: %v", err)
	}
}

// TestLoanAbort: an aborted loan is skipped, a committed one read in place.
func TestLoanAbort(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	r := newReader(t, l, 0, Newest)
	ctx := timeout(t, 10*time.Second)
	a, err := l.Loan(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Loan(ctx, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	copy(b.Bytes(), "hello")
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	a.Abort()
	if err := a.Commit(); !errors.Is(err, ErrAborted) {
		t.Errorf("commit after abort: %v", err)
	}
	rec, err := r.Next(ctx)
	if err != nil || string(rec.Payload) != "hello" || rec.Offset != b.Offset() {
		t.Fatalf("%q at %d, %v", rec.Payload, rec.Offset, err)
	}
	short := timeout(t, 50*time.Millisecond)
	if _, err := r.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an empty partition: %v", err)
	}
}

// TestGoroutines: producers in goroutines, one reader; every record once,
// in each producer's order.
func TestGoroutines(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 16 << 10, Segments: 4})
	ctx, cancel := context.WithCancelCause(timeout(t, 60*time.Second))
	defer cancel(nil)
	const producers, n = 4, 3000
	// The reader registers before the producers start: FullBlock keeps
	// only what a registered reader needs (made after them, it found
	// offset 0 dropped now and then).
	r := newReader(t, l, 1, 0)
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			b := make([]byte, 100)
			for i := range n {
				message(b, uint64(p), uint64(i))
				if _, err := l.Send(ctx, 1, b); err != nil {
					errs <- err
					cancel(err)
					return
				}
			}
		})
	}
	consume(t, ctx, r, producers, n)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// consume reads producers*n records and checks each producer's order.
func consume(t *testing.T, ctx context.Context, r *Reader, producers, n int) {
	t.Helper()
	next := make([]uint64, producers)
	for range producers * n {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err, context.Cause(ctx))
		}
		p, seq := parse(t, rec.Payload)
		if p >= uint64(producers) || seq != next[p] {
			t.Fatalf("producer %d seq %d, want %d", p, seq, next[p])
		}
		next[p]++
	}
	// Nothing more: every record was delivered once.
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if rec, err := r.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after all the records: %d bytes at %d, %v", len(rec.Payload), rec.Offset, err)
	}
}

// producerChild sends MQ_N records of 100 bytes to partition 0 of log
// MQ_LOG as producer MQ_ID.
func producerChild() int {
	id, _ := strconv.Atoi(os.Getenv("MQ_ID"))
	n, _ := strconv.Atoi(os.Getenv("MQ_N"))
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := make([]byte, 100)
	for i := range n {
		r, err := l.Loan(ctx, 0, len(b))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		message(r.Bytes(), uint64(id), uint64(i))
		if err := r.Commit(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// TestProcesses: three producer processes and this one reading, through
// segments small enough that the producers roll and block on the reader
// (FullBlock, 4 segments kept): every record once, in per-producer order,
// none torn.
func TestProcesses(t *testing.T) {
	l := produceInProcesses(t, Config{SegmentSize: 32 << 10, Segments: 4})
	if st, _ := l.Stats(0); st.Oldest == 0 || st.Aborted != 0 {
		t.Errorf("stats %+v: retention dropped nothing, or records were aborted", st)
	}
}

// produceInProcesses runs three producer processes of 20,000 records
// each through a new log of configuration c and reads them all here, in
// order per producer (consume), and returns the log.
func produceInProcesses(t *testing.T, c Config) *Log {
	t.Helper()
	l := newLog(t, c)
	r := newReader(t, l, 0, 0)
	const producers, n = 3, 20000
	var cmds []func() error
	for id := range producers {
		cmd := testenv.Child(t, "producer", "MQ_LOG="+l.Name(), "MQ_ID="+strconv.Itoa(id), "MQ_N="+strconv.Itoa(n))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd.Wait)
	}
	consume(t, timeout(t, 2*time.Minute), r, producers, n)
	for _, wait := range cmds {
		if err := wait(); err != nil {
			t.Fatalf("producer: %v", err)
		}
	}
	return l
}

// holderChild loans a record in log MQ_LOG, says so on standard output and
// waits to be killed (its standard input, a pipe the test never writes,
// ends only with the test).
func holderChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	res, err := l.Loan(context.Background(), 0, 100)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	copy(res.Bytes(), "half written")
	holdReady("loaned")
	return 1
}

// startWaiting starts the child role on log l and returns once it has
// said ready; it then waits, on a standard input the test holds open,
// until it is killed.
func startWaiting(t *testing.T, role string, l *Log, ready string) *exec.Cmd {
	t.Helper()
	cmd := testenv.Child(t, role, "MQ_LOG="+l.Name())
	startReady(t, cmd, ready)
	return cmd
}

// holdReady is a child's side of startReady: it says word and waits
// until its standard input ends (the parent closed it, or died).
func holdReady(word string) {
	fmt.Println(word)
	io.Copy(io.Discard, os.Stdin)
}

// startReady starts child cmd with pipes for its standard input (held
// open: children wait on it) and output, and returns them once it has
// said ready.
func startReady(t *testing.T, cmd *exec.Cmd, ready string) (in io.WriteCloser, out *bufio.Reader) {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	out = bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || line != ready+"\n" {
		t.Fatalf("%s said %q, %v", cmd.Args, line, err)
	}
	return in, out
}

// TestKilledProducer: a producer process SIGKILLed while it holds a loan
// leaves a record stuck in writing; the reader finds its writer dead,
// aborts and skips it, counts it, and reads the records sent after it.
func TestKilledProducer(t *testing.T) {
	for _, w := range readerWaits {
		t.Run(w.name, func(t *testing.T) { killedProducer(t, w.wait) })
	}
}

// readerWaits are the ways a Reader waits (SetWait) that tests try.
var readerWaits = []struct {
	name string
	wait shm.Wait
}{{"sleeps", shm.Wait{}}, {"yields", shm.Wait{Mode: shm.WaitYield}}, {"spins", shm.Wait{Mode: shm.WaitSpin}}}

// killedProducer is TestKilledProducer with a reader that waits so.
func killedProducer(t *testing.T, w shm.Wait) {
	l := newLog(t, Config{SegmentSize: 4096})
	r := newReader(t, l, 0, 0)
	r.SetWait(w)
	ctx := timeout(t, 30*time.Second)
	before := make([]byte, 100)
	message(before, 1, 0)
	if _, err := l.Send(ctx, 0, before); err != nil {
		t.Fatal(err)
	}
	cmd := startWaiting(t, "holder", l, "loaned")
	after := make([]byte, 100)
	message(after, 1, 1)
	if _, err := l.Send(ctx, 0, after); err != nil {
		t.Fatal(err)
	}
	for seq := range uint64(1) {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, got := parse(t, rec.Payload); got != seq {
			t.Fatalf("seq %d, want %d", got, seq)
		}
	}
	// The held record of a live writer is not skipped: the reader waits.
	if _, err := r.Next(timeout(t, 100*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("on a live writer's record: %v, want the deadline", err)
	}
	// Waiting on it again, its writer is killed (SIGKILL): the reader
	// skips the record, whether it was asleep then or not yet.
	next := make(chan error, 1)
	var rec Record
	go func() {
		var err error
		rec, err = r.Next(ctx)
		next <- err
	}()
	cmd.Process.Kill()
	if err := <-next; err != nil {
		t.Fatal(err)
	}
	if _, seq := parse(t, rec.Payload); seq != 1 {
		t.Fatalf("after the dead writer's record: seq %d", seq)
	}
	cmd.Wait()
	if st, _ := l.Stats(0); st.Aborted != 1 || r.Aborted() != 1 {
		t.Errorf("aborted: stats %d, reader %d; want 1", st.Aborted, r.Aborted())
	}
}

// TestFullPolicies: a reader that stays at the start keeps its segment
// under FullFail (ErrFull) and FullBlock (waits until it moves on or the
// context ends); FullOverwrite drops it and the reader is told.
func TestFullPolicies(t *testing.T) {
	fill := func(l *Log, ctx context.Context) (int, error) {
		b := make([]byte, 1000)
		for i := range 100 {
			if _, err := l.Send(ctx, 0, b); err != nil {
				return i, err
			}
		}
		return 100, nil
	}
	t.Run("fail", func(t *testing.T) {
		l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
		newReader(t, l, 0, 0)
		if _, err := fill(l, timeout(t, 10*time.Second)); !errors.Is(err, ErrFull) {
			t.Fatalf("%v, want ErrFull", err)
		}
	})
	t.Run("block", func(t *testing.T) {
		l := newLog(t, Config{SegmentSize: 4096, Segments: 2})
		r := newReader(t, l, 0, 0)
		sent, err := fill(l, timeout(t, 100*time.Millisecond))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v, want the context's deadline", err)
		}
		// The reader drains what is there while a producer waits.
		ctx := timeout(t, 30*time.Second)
		done := make(chan error, 1)
		go func() { _, err := fill(l, ctx); done <- err }()
		for got := range sent + 100 {
			if _, err := r.Next(ctx); err != nil {
				t.Fatalf("after %d records: %v", got, err)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("overwrite", func(t *testing.T) {
		l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullOverwrite})
		r := newReader(t, l, 0, 0)
		if _, err := fill(l, timeout(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Next(timeout(t, time.Second)); !errors.Is(err, ErrOffsetGone) {
			t.Fatalf("a reader whose segment was dropped: %v", err)
		}
		if _, err := l.NewReader(0, 0); !errors.Is(err, ErrOffsetGone) {
			t.Fatalf("a reader from a dropped offset: %v", err)
		}
	})
}

// TestCorruptHeaders writes bad header words where a reader will read and
// checks each is an error wrapping shm.ErrCorrupt, not a panic.
func TestCorruptHeaders(t *testing.T) {
	bad := []struct {
		name string
		w    func(w, w1 uint64) (uint64, uint64)
	}{
		{"length past the segment", func(w, w1 uint64) (uint64, uint64) { return w&0xffffffff | 1<<40, w1 }},
		{"length just past the segment", func(w, w1 uint64) (uint64, uint64) { return w&0xffffffff | 4081<<32, w1 }},
		{"checksum", func(w, w1 uint64) (uint64, uint64) { return w, w1 ^ 1 }},
		{"offset", func(w, w1 uint64) (uint64, uint64) { return w, w1 ^ 1<<40 }},
		{"reserved bit", func(w, w1 uint64) (uint64, uint64) { return w | 8, w1 }},
		{"producer slot", func(w, w1 uint64) (uint64, uint64) { return w&^stateMask | 0xfff<<4 | stateWriting, w1 }},
		{"padding mid-segment", func(w, w1 uint64) (uint64, uint64) { return w | flagPad, w1 }},
		{"zero below the tail", func(w, w1 uint64) (uint64, uint64) { return 0, w1 }},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096})
			ctx := timeout(t, 5*time.Second)
			if _, err := l.Send(ctx, 0, []byte("payload")); err != nil {
				t.Fatal(err)
			}
			seg, err := shm.OpenSegment(segName(l.Name(), 0, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			w, _ := seg.Uint64At(0)
			w1, _ := seg.Uint64At(8)
			a, b := c.w(w.Load(), w1.Load())
			w.Store(a)
			w1.Store(b)
			r := newReader(t, l, 0, 0)
			if _, err := r.Next(ctx); !errors.Is(err, shm.ErrCorrupt) {
				t.Fatalf("%v, want shm.ErrCorrupt", err)
			}
		})
	}
}

// FuzzDecode feeds the record decoder arbitrary headers over arbitrary
// segment bytes: it returns an error or a payload inside the segment.
func FuzzDecode(f *testing.F) {
	f.Add(make([]byte, 64), uint64(0), uint64(5)<<32|stateCommitted, uint64(0), uint64(0))
	f.Add(make([]byte, 64), uint64(8), uint64(48)<<32|flagPad|stateCommitted, uint64(0), uint64(8))
	f.Add(make([]byte, 4096), uint64(16), uint64(3)<<32|stateWriting|5<<4, uint64(1), uint64(16))
	f.Fuzz(func(t *testing.T, data []byte, at, w, w1, o uint64) {
		data = data[:len(data)&^7]
		if len(data) < headerSize {
			return
		}
		payload, next, err := decode(data, at, w, w1, o)
		if err != nil {
			return
		}
		if next == 0 || at+next > uint64(len(data)) || next%8 != 0 {
			t.Fatalf("record at %d of %d bytes: next %d", at, len(data), next)
		}
		if payload != nil && uint64(len(payload)) != w>>32 {
			t.Fatalf("payload of %d bytes, header says %d", len(payload), w>>32)
		}
	})
}

// TestOpenCorrupt: a meta segment whose configuration makes no sense is
// refused with shm.ErrCorrupt.
func TestOpenCorrupt(t *testing.T) {
	for _, c := range []struct {
		name string
		off  int
		v    uint64
	}{
		{"no partitions", offParts, 0},
		{"too many partitions", offParts, 1 << 40},
		{"segment size not a multiple of 8", offSegSize, 4097},
		{"huge segments", offSegSize, 1 << 62},
		{"one segment kept", offSegments, 1},
		{"unknown policy", offPolicy, 9},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096})
			seg, err := shm.OpenSegment(metaName(l.Name()))
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			w, _ := seg.Uint64At(c.off)
			old := w.Swap(c.v)
			defer w.Store(old) // so that Remove can open it
			if l2, err := Open(l.Name()); !errors.Is(err, shm.ErrCorrupt) {
				if err == nil {
					l2.Close()
				}
				t.Fatalf("%v, want shm.ErrCorrupt", err)
			}
		})
	}
}

// readerChild registers a reader at offset 0 of log MQ_LOG, says so and
// waits to be killed (as holderChild does).
func readerChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := l.NewReader(0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	holdReady("reading")
	return 1
}

// TestKilledReader: under FullBlock a reader process that stays at offset
// 0 blocks the producer once the partition is full; killed, it no longer
// holds the partition: the blocked producer goes on.
func TestKilledReader(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2})
	cmd := startWaiting(t, "reader", l, "reading")
	b := make([]byte, 1000)
	send := func(ctx context.Context) error {
		for range 20 {
			if _, err := l.Send(ctx, 0, b); err != nil {
				return err
			}
		}
		return nil
	}
	if err := send(timeout(t, 100*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("with a live reader at 0: %v, want the deadline", err)
	}
	done := make(chan error, 1)
	go func() { done <- send(timeout(t, 30*time.Second)) }()
	// Blocked (as above) or about to be: either way the reader's death
	// lets it go on.
	cmd.Process.Kill()
	cmd.Wait()
	if err := <-done; err != nil {
		t.Fatalf("after the reader died: %v", err)
	}
}

// TestStaleProducer: a producer whose view of the tail is in a segment
// retention dropped is told at once (and Loan reads the tail again), not
// after retrying the open as for a segment being created, under the lock
// every producer of the handle needs.
func TestStaleProducer(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2})
	ctx := timeout(t, 10*time.Second)
	b := make([]byte, 1000)
	for range 20 {
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	pt := l.parts[0]
	if pt.head.Load() == 0 {
		t.Fatal("retention dropped nothing")
	}
	start := time.Now()
	if _, err := l.segment(0, pt, 0, true); !errors.Is(err, ErrOffsetGone) {
		t.Fatalf("segment 0 after it was dropped: %v", err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("a dropped segment took %v to report", d)
	}
	if _, err := l.Send(ctx, 0, b); err != nil {
		t.Fatal(err)
	}
}

// TestMadeAhead: a producer entering segment k makes segment k+1 in the
// background and the producer that reaches it finds it in the cache; a
// segment that cannot be made ahead (a file of this user in its way)
// fails the producer that reaches it with that cause, not with a missing
// segment.
func TestMadeAhead(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 8})
	ctx := timeout(t, 10*time.Second)
	b := make([]byte, 1000)
	if _, err := l.Send(ctx, 0, b); err != nil {
		t.Fatal(err)
	}
	pt := l.parts[0]
	waitAhead(t, pt)
	if got := pt.made.Load(); got != 2 {
		t.Fatalf("after the first record %d segments made, want 2 (one ahead)", got)
	}
	pt.mu.Lock()
	ahead := pt.segs[1]
	pt.mu.Unlock()
	if ahead == nil {
		t.Fatal("segment 1 is not in the cache")
	}
	for pt.tail.Load() < 4096 {
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	if cur := pt.cur.Load(); cur != ahead {
		t.Fatalf("the producers' segment is %v, not the one made ahead", cur)
	}
	waitAhead(t, pt)
	if got := pt.made.Load(); got != 3 {
		t.Fatalf("in segment 1, %d segments made, want 3", got)
	}

	// A file in the way of segment 3, made ahead when the producer enters
	// segment 2.
	in := filepath.Join(shm.ShmDir, fmt.Sprintf("%s%d-%s", shm.NamePrefix, os.Geteuid(), segName(l.Name(), 0, 3)))
	if err := os.WriteFile(in, []byte("not a segment"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(in)
	for pt.tail.Load() < 2*4096 {
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	waitAhead(t, pt)
	var err error
	for err == nil && pt.tail.Load() < 4*4096 {
		_, err = l.Send(ctx, 0, b)
	}
	if !errors.Is(err, os.ErrExist) || errors.Is(err, ErrOffsetGone) {
		t.Fatalf("a producer reaching a segment that could not be made: %v, want the cause (exists)", err)
	}
}

// waitAhead waits for pt's goroutine making a segment ahead to end.
func waitAhead(t *testing.T, pt *partition) {
	t.Helper()
	var bo shm.Backoff
	deadline := time.Now().Add(10 * time.Second)
	for pt.ahead.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the segment made ahead took 10 s")
		}
		bo.Pause()
	}
}

// TestMadeAheadWhenFull: a partition that keeps all the segments it may
// (the steady state of a log that has run a while) still makes the next
// segment ahead, so that its producers do not make one in their path at
// every segment; the partition then holds at most Segments+1 segments,
// and the ones retention dropped are removed.
func TestMadeAheadWhenFull(t *testing.T) {
	const size, keep = 4096, 2
	l := newLog(t, Config{SegmentSize: size, Segments: keep})
	ctx := timeout(t, 10*time.Second)
	b := make([]byte, 1000)
	pt := l.parts[0]
	for k := uint64(0); k < 6; k++ {
		for pt.tail.Load() < k*size+1 {
			if _, err := l.Send(ctx, 0, b); err != nil {
				t.Fatal(err)
			}
		}
		waitAhead(t, pt)
		if got := pt.made.Load(); got != k+2 {
			t.Fatalf("in segment %d (head %d), %d segments made, want %d (one ahead)", k, pt.head.Load(), got, k+2)
		}
	}
	var there []uint64
	for k := uint64(0); k < 7; k++ {
		s, err := shm.OpenSegment(segName(l.Name(), 0, k))
		if err == nil {
			there = append(there, k)
			s.Close()
		}
	}
	if head := pt.head.Load(); len(there) > keep+1 || len(there) == 0 || there[0] != head {
		t.Fatalf("segments %v in /dev/shm with the head at %d: want the head and at most %d more", there, head, keep)
	}
}

// TestNextBelowHeld: NextBelow stops at a record being written by a live
// producer (ok false, the reader stays there) instead of waiting for it,
// and returns it once committed.
func TestNextBelowHeld(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 64})
	ctx := timeout(t, 10*time.Second)
	send := func(seq uint64) uint64 {
		b := make([]byte, 100)
		message(b, 0, seq)
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		return off
	}
	first := send(0)
	held, err := l.Loan(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	message(held.Bytes(), 0, 1)
	last := send(2)
	st, _ := l.Stats(0)
	r := newReader(t, l, 0, Oldest)
	if rec, ok, err := r.NextBelow(ctx, st.Tail); !ok || err != nil || rec.Offset != first {
		t.Fatalf("first: %d %v %v", rec.Offset, ok, err)
	}
	if _, ok, err := r.NextBelow(ctx, st.Tail); ok || err != nil {
		t.Fatalf("at a held record: ok %v, %v", ok, err)
	}
	if r.Offset() != held.Offset() {
		t.Fatalf("offset %d after a held record at %d", r.Offset(), held.Offset())
	}
	if err := held.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint64{held.Offset(), last} {
		if rec, ok, err := r.NextBelow(ctx, st.Tail); !ok || err != nil || rec.Offset != want {
			t.Fatalf("after the commit: %d %v %v, want %d", rec.Offset, ok, err, want)
		}
	}
}

// TestNextBelow: NextBelow returns the committed records below its
// limit, skips padding and aborted records, and returns at the limit
// without waiting, also when what is left below it is an aborted record.
func TestNextBelow(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 64})
	ctx := timeout(t, 10*time.Second)
	var offsets []uint64
	for i := range 30 { // 30 records of 500 bytes: padding at each segment's end
		b := make([]byte, 500)
		message(b, 0, uint64(i))
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		offsets = append(offsets, off)
	}
	a, err := l.Loan(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	a.Abort()
	st, _ := l.Stats(0)
	r := newReader(t, l, 0, Oldest)
	for i := range 30 {
		rec, ok, err := r.NextBelow(ctx, st.Tail)
		if err != nil || !ok {
			t.Fatalf("record %d: ok %v, %v", i, ok, err)
		}
		if _, seq := parse(t, rec.Payload); seq != uint64(i) || rec.Offset != offsets[i] {
			t.Fatalf("record %d: seq %d at %d, sent at %d", i, seq, rec.Offset, offsets[i])
		}
	}
	if _, ok, err := r.NextBelow(ctx, st.Tail); ok || err != nil {
		t.Fatalf("at the limit (an aborted record below it): ok %v, %v", ok, err)
	}
	if r.Offset() != st.Tail {
		t.Fatalf("offset %d after the aborted record, tail %d", r.Offset(), st.Tail)
	}
	// A limit at a record: the records before it.
	r2 := newReader(t, l, 0, offsets[3])
	if rec, ok, err := r2.NextBelow(ctx, offsets[4]); !ok || err != nil || rec.Offset != offsets[3] {
		t.Fatalf("from %d below %d: %d %v %v", offsets[3], offsets[4], rec.Offset, ok, err)
	}
	if _, ok, err := r2.NextBelow(ctx, offsets[4]); ok || err != nil {
		t.Fatalf("at the limit: ok %v, %v", ok, err)
	}
	r2.Close()
	if _, _, err := r2.NextBelow(ctx, st.Tail); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

// TestReaderSeek: Seek moves a reader in its own slot to a record, Oldest
// or Newest, refuses an offset inside a record or one retention dropped
// (the reader stays where it was and reads on), and keeps the reader's
// place from retention while it checks the new one.
func TestReaderSeek(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 4, Full: FullOverwrite})
	ctx := timeout(t, 10*time.Second)
	var offs []uint64
	send := func(seq uint64) {
		b := make([]byte, 100)
		message(b, 0, seq)
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
	}
	for i := range 10 {
		send(uint64(i))
	}
	r := newReader(t, l, 0, Oldest)
	expect := func(want uint64) {
		t.Helper()
		rec, err := r.Next(ctx)
		if err != nil || rec.Offset != want {
			t.Fatalf("Next: %d, %v; want %d", rec.Offset, err, want)
		}
	}
	if err := r.Seek(offs[5]); err != nil {
		t.Fatal(err)
	}
	expect(offs[5])
	if err := r.Seek(offs[2] + 8); err == nil {
		t.Fatal("Seek inside a record succeeded")
	}
	if err := r.Seek(offs[2] + 4); err == nil {
		t.Fatal("Seek to an unaligned offset succeeded")
	}
	for _, beyond := range []uint64{1 << 40, 64 * 4096} { // aligned to a segment too
		if err := r.Seek(beyond); err == nil {
			t.Fatalf("Seek(%d) beyond the tail succeeded", beyond)
		}
		if _, err := l.NewReader(0, beyond); err == nil {
			t.Fatalf("NewReader at %d beyond the tail succeeded", beyond)
		}
	}
	expect(offs[6]) // stayed where it was
	if err := r.Seek(Newest); err != nil || r.Offset() != offs[9]+align8(headerSize+100) {
		t.Fatalf("Seek(Newest): %v, offset %d", err, r.Offset())
	}
	if err := r.Seek(Oldest); err != nil {
		t.Fatal(err)
	}
	expect(offs[0])
	// Overwrite until segment 0 is dropped; the reader is in it (under
	// FullOverwrite a reader holds nothing back).
	for i := 10; l.parts[0].head.Load() == 0; i++ {
		send(uint64(i))
	}
	if err := r.Seek(offs[1]); !errors.Is(err, ErrOffsetGone) {
		t.Fatalf("Seek to a dropped offset: %v, want ErrOffsetGone", err)
	}
	if r.Offset() != offs[1] {
		t.Fatalf("offset %d after a failed Seek, want %d (unchanged)", r.Offset(), offs[1])
	}
	if err := r.Seek(Oldest); err != nil || r.Offset() != l.parts[0].head.Load()*4096 {
		t.Fatalf("Seek(Oldest): %v, offset %d", err, r.Offset())
	}
	// A failed Seek back leaves the slot (what producers see) where the
	// reader is.
	if err := r.Seek(offs[1]); !errors.Is(err, ErrOffsetGone) {
		t.Fatalf("Seek back to a dropped offset: %v", err)
	}
	if got := r.off.Load(); got/4096 != r.Offset()/4096 {
		t.Fatalf("slot at %d after a failed Seek back, reader at %d", got, r.Offset())
	}
	r.Close()
	if err := r.Seek(Oldest); !errors.Is(err, ErrClosed) {
		t.Fatalf("Seek after Close: %v", err)
	}
}

// TestNewScanner: a scanner takes no reader slot (it works with every
// slot taken) and holds nothing back: a FullFail producer drops the
// segment it is in instead of failing, and the scanner, which keeps its
// segment mapped, reads on in it and then says ErrOffsetGone.
func TestNewScanner(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
	ctx := timeout(t, 10*time.Second)
	send := func(seq uint64) (uint64, error) {
		b := make([]byte, 100)
		message(b, 0, seq)
		return l.Send(ctx, 0, b)
	}
	first, err := send(0)
	if err != nil {
		t.Fatal(err)
	}
	// Take every slot, for a partition the log has not (they hold no
	// segment of partition 0).
	var taken []*atomic.Uint64
	for i := range maxReaders {
		owner, _ := l.meta.Uint64At(offReaders + i*line)
		if owner.CompareAndSwap(0, shm.Self().Word()) {
			part, _ := l.meta.Uint64At(offReaders + i*line + 8)
			part.Store(99)
			taken = append(taken, owner)
		}
	}
	defer func() {
		for _, o := range taken {
			o.Store(0)
		}
	}()
	if _, err := l.NewReader(0, Oldest); !errors.Is(err, ErrNoSlot) {
		t.Fatalf("NewReader with every slot taken: %v", err)
	}
	sc, err := l.NewScanner(0, Oldest)
	if err != nil {
		t.Fatalf("NewScanner with every slot taken: %v", err)
	}
	defer sc.Close()
	if rec, err := sc.Next(ctx); err != nil || rec.Offset != first {
		t.Fatalf("Next: %d, %v", rec.Offset, err)
	}
	for i := uint64(1); l.parts[0].head.Load() < 2; i++ {
		if _, err := send(i); err != nil {
			t.Fatalf("send %d with a scanner at the oldest segment: %v (a scanner holds nothing back)", i, err)
		}
	}
	var err2 error
	for n := 0; err2 == nil; n++ {
		_, err2 = sc.Next(ctx)
		if n > 100 {
			t.Fatal("the scanner read on past its segment")
		}
	}
	if !errors.Is(err2, ErrOffsetGone) {
		t.Fatalf("the scanner after its next segment was dropped: %v, want ErrOffsetGone", err2)
	}
	if _, err := l.NewScanner(0, 1<<40); err == nil {
		t.Fatal("NewScanner beyond the tail succeeded")
	}
}

// TestCommitSum: CommitSum returns the payload's CRC-32C, and Next and
// ReadAt give it back as Record.CRC.
func TestCommitSum(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	res, err := l.Loan(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	message(res.Bytes(), 0, 7)
	want := crc32.Checksum(res.Bytes(), castagnoli)
	off := res.Offset()
	crc, err := res.CommitSum()
	if err != nil || crc != want {
		t.Fatalf("CommitSum: %#x, %v; want %#x", crc, err, want)
	}
	r := newReader(t, l, 0, Oldest)
	if rec, err := r.Next(ctx); err != nil || rec.CRC != want {
		t.Fatalf("Next: CRC %#x, %v; want %#x", rec.CRC, err, want)
	}
	rec, release, err := l.ReadAt(0, off)
	if err != nil || rec.CRC != want {
		t.Fatalf("ReadAt: CRC %#x, %v; want %#x", rec.CRC, err, want)
	}
	release()
}

// TestReaderNeverSleeps: a reader set to yield or spin (SetWait) waits
// for a record without ever sleeping on the partition's futex (a
// sleeper counts itself where producers look, and only a producer's
// wake-up takes the count back), and still returns when its ctx ends; a
// reader that sleeps, the default, counts itself.
func TestReaderNeverSleeps(t *testing.T) {
	for _, w := range readerWaits {
		t.Run(w.name, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096})
			r := newReader(t, l, 0, 0)
			r.SetWait(w.wait)
			if _, err := r.Next(timeout(t, 30*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Next on an empty partition: %v, want the deadline", err)
			}
			slept := l.parts[0].sleepers.Load() != 0
			if want := w.wait.Mode == shm.WaitBlock; slept != want {
				t.Fatalf("slept %v, want %v", slept, want)
			}
			// Records still come.
			if _, err := l.Send(timeout(t, 10*time.Second), 0, []byte("x")); err != nil {
				t.Fatal(err)
			}
			if rec, err := r.Next(timeout(t, 10*time.Second)); err != nil || string(rec.Payload) != "x" {
				t.Fatalf("Next: %q, %v", rec.Payload, err)
			}
		})
	}
}
