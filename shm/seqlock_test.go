//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests' record, guarded by a SeqLock at offset 0 of a segment: eight
// words from recOff, the first counting increments and word i holding
// count*(i+1), so that a read of a half-written record breaks the
// invariant. A writer commits an increment by storing the count last; a
// successor rolls a half-done write back to the count. Beside them, two
// words the processes of a test share: a flag at flagOff (a child in the
// middle of a write says so there) and, at repairsOff, how many times a
// successor repaired the record.
const (
	flagOff    = SeqLockSize
	repairsOff = 48
	recOff     = 64
	recWords   = 8
	recSegSize = recOff + 8*recWords
)

// patience is the tests' bound on a wait for a live holder: a guard
// against a hang, far longer than any holder of these tests holds.
const patience = time.Minute

type seqRecord struct {
	l       SeqLock
	w       []atomic.Uint64
	flag    *atomic.Uint32
	repairs *atomic.Uint64
}

func openRecord(t testing.TB, seg *Segment) seqRecord {
	t.Helper()
	r, err := recordIn(seg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func recordIn(seg *Segment) (seqRecord, error) {
	l, err := SeqLockAt(seg, 0)
	if err != nil {
		return seqRecord{}, err
	}
	w, err := seg.Uint64s(recOff, recWords)
	if err != nil {
		return seqRecord{}, err
	}
	flag, err := seg.Uint32At(flagOff)
	if err != nil {
		return seqRecord{}, err
	}
	repairs, err := seg.Uint64At(repairsOff)
	if err != nil {
		return seqRecord{}, err
	}
	return seqRecord{l: l, w: w, flag: flag, repairs: repairs}, nil
}

// lock takes the lock, repairing the record if Lock hands it over from a
// holder that is gone; the write is then closed again.
func (r seqRecord) lock() error {
	err := r.l.Lock(patience)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrOwnerDied) {
		return err
	}
	c := r.w[0].Load()
	for i := 1; i < recWords; i++ {
		r.w[i].Store(c * uint64(i+1))
	}
	r.repairs.Add(1)
	r.l.EndWrite()
	return nil
}

// increment adds one to the record; mid, if set, runs half-way through
// the write.
func (r seqRecord) increment(mid func()) error {
	if err := r.lock(); err != nil {
		return err
	}
	r.l.BeginWrite()
	c := r.w[0].Load() + 1
	for i := 1; i < recWords; i++ {
		r.w[i].Store(c * uint64(i+1))
		if i == recWords/2 && mid != nil {
			mid()
		}
	}
	r.w[0].Store(c)
	r.l.EndWrite()
	r.l.Unlock()
	return nil
}

// read returns the count, from a read that Validate accepted, and fails if
// such a read breaks the invariant. A writer gone in the middle of its
// write is taken over and repaired.
func (r seqRecord) read() (uint64, error) {
	var v [recWords]uint64
	for {
		s, err := r.l.Begin(patience)
		if errors.Is(err, ErrOwnerDied) {
			if err := r.lock(); err != nil {
				return 0, err
			}
			r.l.Unlock()
			continue
		}
		if err != nil {
			return 0, err
		}
		for i := range v {
			v[i] = r.w[i].Load()
		}
		if !r.l.Validate(s) {
			continue
		}
		for i := 1; i < recWords; i++ {
			if v[i] != v[0]*uint64(i+1) {
				return 0, fmt.Errorf("torn read at sequence %d: %v", s, v)
			}
		}
		return v[0], nil
	}
}

func init() {
	// seqlock-worker <segment> <n> [stall]: n increments of the record
	// (forever if n is negative), each followed by a read; every 64
	// increments it raises the flag by one and wakes it. With stall, the
	// increment after the n-th raises the flag to 1<<30 in the middle of
	// its write and stops there, holding the lock, to be killed.
	children["seqlock-worker"] = func(args []string) error {
		seg, err := OpenSegment(args[0])
		if err != nil {
			return err
		}
		defer seg.Close()
		r, err := recordIn(seg)
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(args[1])
		for i := 0; n < 0 || i < n; i++ {
			if err := r.increment(nil); err != nil {
				return err
			}
			if _, err := r.read(); err != nil {
				return err
			}
			if i%64 == 63 {
				r.flag.Add(1)
				Wake(r.flag)
			}
		}
		if len(args) > 2 && args[2] == "stall" {
			return r.increment(func() {
				r.flag.Store(1 << 30)
				Wake(r.flag)
				time.Sleep(time.Hour) // killed here, holding the lock
			})
		}
		return nil
	}
}

// waitFlag waits until the record's flag reaches at least v.
func waitFlag(t *testing.T, r seqRecord, v uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := (Wait{}).Until(ctx, r.flag, func(f uint32) bool { return f >= v }); err != nil {
		t.Fatalf("waiting for the children's flag to reach %d (it is %d): %v", v, r.flag.Load(), err)
	}
}

// readers runs n goroutines that read the record until stop closes and
// fail the test on a torn read; the returned function stops them and
// returns how many reads they made.
func readers(t *testing.T, r seqRecord, n int) func() int64 {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := r.read(); err != nil {
					t.Error(err)
					return
				}
				reads.Add(1)
			}
		})
	}
	return sync.OnceValue(func() int64 {
		close(stop)
		wg.Wait()
		return reads.Load()
	})
}

// Goroutines contending for the lock lose no increment, and readers never
// accept a half-written record.
func TestSeqLockGoroutines(t *testing.T) {
	r := openRecord(t, newSegment(t, recSegSize))
	stopReaders := readers(t, r, 3)
	defer stopReaders()
	const writers, each = 6, 3000
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				if err := r.increment(nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	reads := stopReaders()
	got, err := r.read()
	if err != nil {
		t.Fatal(err)
	}
	if got != writers*each {
		t.Fatalf("count %d after %d increments", got, writers*each)
	}
	if reads == 0 {
		t.Fatal("no read completed: the test proved nothing about readers")
	}
	if o, s := r.l.Owner(), r.l.Seq(); o != 0 || s != 2*writers*each {
		t.Fatalf("owner %#x, sequence %d after %d writes; want 0 and %d", o, s, writers*each, 2*writers*each)
	}
}

// With one P, a goroutine that holds the lock and hands the P over in the
// middle of its write gets it back from the goroutines waiting for it:
// everything completes, exactly.
func TestSeqLockOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := openRecord(t, newSegment(t, recSegSize))
	stopReaders := readers(t, r, 2)
	defer stopReaders()
	const writers, each = 3, 300
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				if err := r.increment(runtime.Gosched); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	stopReaders()
	if got, err := r.read(); err != nil || got != writers*each {
		t.Fatalf("count %d (%v) after %d increments", got, err, writers*each)
	}
}

// With one P, a goroutine climbing the Backoff ladder lets the goroutine
// it waits for run within its first checkpoints, not after the 10 ms the
// scheduler takes to preempt it (hundreds of thousands of looks).
func TestBackoffOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, b := range []Backoff{{}, {Spin: time.Hour, Yield: -1}} {
		var ran atomic.Bool
		go ran.Store(true) // runnable, and runs only when the P is handed over
		looks := 0
		for !ran.Load() {
			looks++
			b.Pause()
		}
		if looks > 16*backoffEvery {
			t.Errorf("Backoff{Spin: %v, Yield: %v}: the peer goroutine ran after %d looks", b.Spin, b.Yield, looks)
		}
	}
}

// Pause asks to park only at a checkpoint, once Spin has passed (at the
// first one for a negative Spin), goes on asking until Reset, and Reset
// starts the ladder again.
func TestBackoffRungs(t *testing.T) {
	b := Backoff{Spin: -1}
	for round := range 2 {
		for i := 1; i < backoffEvery; i++ {
			if !b.Pause() {
				t.Fatalf("round %d: a Backoff with a negative Spin parks at look %d, before its first checkpoint", round, i)
			}
		}
		if b.Pause() {
			t.Fatalf("round %d: a Backoff with a negative Spin did not park at its first checkpoint", round)
		}
		// Woken without what it waited for, the caller parks again.
		for i := range 2 * backoffEvery {
			if b.Pause() {
				t.Fatalf("round %d: a Backoff that said park said look again %d looks later", round, i+1)
			}
		}
		b.Reset()
	}
	long := Backoff{Spin: time.Hour}
	for i := range 100 * backoffEvery {
		if !long.Pause() {
			t.Fatalf("a Backoff spinning for an hour parked after %d looks", i+1)
		}
	}
}

// Processes contending for the lock lose no increment, and none of their
// reads accepts a half-written record.
func TestSeqLockProcesses(t *testing.T) {
	seg := newSegment(t, recSegSize)
	r := openRecord(t, seg)
	stopReaders := readers(t, r, 1)
	defer stopReaders()
	const children, each, here = 3, 2000, 1000
	var cmds []*exec.Cmd
	for range children {
		cmds = append(cmds, startChild(t, "seqlock-worker", seg.Name(), strconv.Itoa(each)))
	}
	for range here {
		if err := r.increment(nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("a worker process: %v", err)
		}
	}
	stopReaders()
	if got, err := r.read(); err != nil || got != children*each+here {
		t.Fatalf("count %d (%v), want %d", got, err, children*each+here)
	}
}

// A process SIGKILLed in the middle of a write, holding the lock, while
// processes and goroutines contend for it: exactly one successor takes the
// lock over and rolls the write back, every other increment counts, and no
// read ever accepts a half-written record.
func TestSeqLockHolderKilled(t *testing.T) {
	for round := range 4 {
		seg := newSegment(t, recSegSize)
		r := openRecord(t, seg)
		stopReaders := readers(t, r, 1)
		const workers, each, here = 2, 1500, 500
		stalled := 100 + round // increments before the stalled one
		var cmds []*exec.Cmd
		for range workers {
			cmds = append(cmds, startChild(t, "seqlock-worker", seg.Name(), strconv.Itoa(each)))
		}
		victim := startChild(t, "seqlock-worker", seg.Name(), strconv.Itoa(stalled), "stall")
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				for range here {
					if err := r.increment(nil); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		waitFlag(t, r, 1<<30)
		if err := victim.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		victim.Wait()
		for _, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("round %d: a worker process: %v", round, err)
			}
		}
		wg.Wait()
		stopReaders()
		want := uint64(workers*each + 2*here + stalled)
		if got, err := r.read(); err != nil || got != want {
			t.Fatalf("round %d: count %d (%v), want %d", round, got, err, want)
		}
		if n := r.repairs.Load(); n != 1 {
			t.Fatalf("round %d: the record was repaired %d times after one holder died", round, n)
		}
	}
}

// Holders SIGKILLed at whatever instruction they are at: reads never
// accept a half-written record, and the lock goes on working.
func TestSeqLockRandomKills(t *testing.T) {
	seg := newSegment(t, recSegSize)
	r := openRecord(t, seg)
	stopReaders := readers(t, r, 1)
	defer stopReaders()
	for round := range 8 {
		before := r.flag.Load()
		a := startChild(t, "seqlock-worker", seg.Name(), "-1")
		b := startChild(t, "seqlock-worker", seg.Name(), "-1")
		// Both are under way once the flag moved by two (each raises it
		// every 64 increments); they are killed wherever they are then.
		waitFlag(t, r, before+2+uint32(round%3))
		a.Process.Kill()
		b.Process.Kill()
		a.Wait()
		b.Wait()
		c, err := r.read()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if err := r.increment(nil); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if got, err := r.read(); err != nil || got != c+1 {
			t.Fatalf("round %d: count %d (%v) after an increment of %d", round, got, err, c)
		}
	}
}

// deadWord names a process that does not run: this pid with another
// start time, as if the pid had been reused.
func deadWord(t *testing.T) uint64 {
	t.Helper()
	me := Self()
	if me.Start == 0 {
		t.Fatal("no start time for this process: is /proc mounted?")
	}
	return Process{PID: me.PID, Start: me.Start + 1}.Word()
}

// Owner and sequence words that no live process left behind are taken
// over or reported, never waited on for good: a holder that died, a pid
// that cannot exist, garbage, and a write open with no holder (corrupt).
// A live holder is waited for until the caller's patience ends.
func TestSeqLockCorruptWords(t *testing.T) {
	parent, err := LookupProcess(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	const short = 30 * time.Millisecond
	for _, c := range []struct {
		name    string
		owner   uint64
		open    bool
		corrupt bool // Lock and Begin say ErrCorrupt (else only ErrOwnerDied)
		held    bool // a live holder: ErrHeld
	}{
		{name: "dead holder", owner: deadWord(t)},
		{name: "dead holder, write open", owner: deadWord(t), open: true},
		{name: "pid that cannot exist", owner: uint64(pidMaxLimit+7) << 32, open: true},
		{name: "pid 2^32-1", owner: 0xffffffff_00000001, open: true},
		{name: "pid 0", owner: 0x12345678, open: true},
		{name: "write open, no holder", open: true, corrupt: true},
		{name: "live holder", owner: parent.Word(), held: true},
		{name: "live holder, write open", owner: parent.Word(), open: true, held: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := openRecord(t, newSegment(t, recSegSize))
			r.l.w.owner.Store(c.owner)
			if c.open {
				r.l.BeginWrite()
			}
			_, err := r.l.Begin(short)
			switch {
			case !c.open && err != nil:
				t.Errorf("Begin with no write open: %v", err)
			case c.open && c.held && !errors.Is(err, ErrHeld):
				t.Errorf("Begin with a live writer past its patience: %v, want ErrHeld", err)
			case c.open && !c.held && (!errors.Is(err, ErrOwnerDied) || errors.Is(err, ErrCorrupt) != c.corrupt):
				t.Errorf("Begin: %v, want ErrOwnerDied (ErrCorrupt: %v)", err, c.corrupt)
			}
			err = r.l.Lock(short)
			if c.held {
				if !errors.Is(err, ErrHeld) || errors.Is(err, ErrOwnerDied) {
					t.Errorf("Lock with a live holder: %v, want ErrHeld", err)
				}
				if o := r.l.Owner(); o != c.owner {
					t.Errorf("Lock took a live holder's lock: owner %#x", o)
				}
				return
			}
			if !errors.Is(err, ErrOwnerDied) || errors.Is(err, ErrCorrupt) != c.corrupt {
				t.Fatalf("Lock: %v, want ErrOwnerDied (ErrCorrupt: %v)", err, c.corrupt)
			}
			if r.l.Owner() != Self().Word() || r.l.Seq()&1 == 0 {
				t.Fatalf("after the takeover: owner %#x, sequence %d; want this process and a write open", r.l.Owner(), r.l.Seq())
			}
			r.l.EndWrite()
			r.l.Unlock()
			if err := r.l.Lock(short); err != nil {
				t.Fatalf("Lock after the repair: %v", err)
			}
			r.l.Unlock()
		})
	}
}

// LockContext and BeginContext waiting for a live holder (another
// process, or this one, whose waiters sleep in Go's scheduler) end when
// their context does, the lock not taken; a wait that need not happen
// succeeds whatever the context.
func TestSeqLockContext(t *testing.T) {
	parent, err := LookupProcess(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, holder := range []struct {
		name string
		word uint64
	}{{"another process", parent.Word()}, {"this process", Self().Word()}} {
		t.Run(holder.name, func(t *testing.T) {
			r := openRecord(t, newSegment(t, recSegSize))
			if _, err := r.l.BeginContext(cancelled, patience); err != nil {
				t.Errorf("BeginContext with no write open: %v", err)
			}
			if err := r.l.LockContext(cancelled, patience); err != nil {
				t.Fatalf("LockContext of a free lock: %v", err)
			}
			r.l.Unlock()
			r.l.w.owner.Store(holder.word)
			r.l.BeginWrite()
			if _, err := r.l.BeginContext(cancelled, patience); !errors.Is(err, context.Canceled) {
				t.Errorf("BeginContext cancelled, a write open: %v, want context.Canceled", err)
			}
			if err := r.l.LockContext(cancelled, patience); !errors.Is(err, context.Canceled) {
				t.Errorf("LockContext cancelled: %v, want context.Canceled", err)
			}
			short, stop := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer stop()
			if err := r.l.LockContext(short, patience); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("LockContext past its deadline: %v, want context.DeadlineExceeded", err)
			}
			// Cancelled while it waits (or before: either way it ends).
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() {
				_, err := r.l.BeginContext(ctx, patience)
				done <- err
			}()
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("BeginContext cancelled while waiting: %v, want context.Canceled", err)
			}
			if o := r.l.Owner(); o != holder.word {
				t.Errorf("the holder lost its lock: owner %#x", o)
			}
		})
	}
}

// A lock this process leaked (its word, nobody holding it) is a live
// holder: Lock waits for it until its patience ends, and says so.
func TestSeqLockOwnWordIsLive(t *testing.T) {
	r := openRecord(t, newSegment(t, recSegSize))
	if err := r.l.Lock(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	defer r.l.Unlock()
	if err := r.l.Lock(10 * time.Millisecond); !errors.Is(err, ErrHeld) {
		t.Fatalf("a second Lock of this process: %v, want ErrHeld", err)
	}
}

// A waiter asleep in Lock is woken by Unlock (it would also wake by
// itself within 20 ms), and a sleeper that was killed does not make every
// later Unlock a system call: the fruitless word records it.
func TestSeqLockSleepers(t *testing.T) {
	r := openRecord(t, newSegment(t, recSegSize))
	if err := r.l.Lock(patience); err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	go func() {
		err := r.l.Lock(patience)
		if err == nil {
			r.l.Unlock()
		}
		got <- err
	}()
	// Asleep once registered: its spin is over.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := (Wait{}).Until(ctx, &r.l.w.sleepers, func(v uint32) bool { return v&sleeperCount != 0 }); err != nil {
		t.Fatal(err)
	}
	r.l.Unlock()
	if err := <-got; err != nil {
		t.Fatalf("the sleeper's Lock: %v", err)
	}
	// A sleeper killed asleep: its count stays.
	r.l.w.sleepers.Add(sleeperGen)
	r.l.EndWrite() // wakes nobody, and says so
	if f, s := r.l.w.fruitless.Load(), r.l.w.sleepers.Load(); f != s {
		t.Fatalf("fruitless %#x after a wake-up of nobody, sleepers %#x", f, s)
	}
}

func TestNewSeqTableChecks(t *testing.T) {
	seg := newSegment(t, 4096)
	n := len(seg.Data())
	for _, c := range []struct{ off, count, stride int }{
		{-8, 1, 32}, {4, 1, 32}, {0, 1, 24}, {0, 1, 36}, {0, 0, 32},
		{0, n/32 + 1, 32}, {n - 24, 1, 32}, {n, 1, 32}, {n + 8, 1, 32}, {0, 1 << 60, 1 << 10},
	} {
		if _, err := NewSeqTable(seg, c.off, c.count, c.stride); err == nil {
			t.Errorf("NewSeqTable(off %d, n %d, stride %d) accepted", c.off, c.count, c.stride)
		}
	}
	tb, err := NewSeqTable(seg, 8, (n-8-SeqLockSize)/64+1, 64)
	if err != nil {
		t.Fatal(err)
	}
	last := tb.At(tb.Len() - 1)
	if err := last.Lock(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	last.Unlock()
	defer func() {
		if recover() == nil {
			t.Error("At past the table's end did not panic")
		}
	}()
	tb.At(tb.Len())
}

// Until returns once another goroutine changed the word and woke it, and
// with the context's error when that ends first.
func TestWaitUntil(t *testing.T) {
	r := openRecord(t, newSegment(t, recSegSize))
	go func() {
		r.flag.Store(7)
		Wake(r.flag)
	}()
	if err := (Wait{}).Until(context.Background(), r.flag, func(v uint32) bool { return v == 7 }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := (Wait{}).Until(ctx, r.flag, func(v uint32) bool { return v == 8 }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Until with a cancelled context: %v", err)
	}
}

func BenchmarkSeqLockRead(b *testing.B) {
	r := openRecord(b, newSegment(b, recSegSize))
	var sum uint64
	for b.Loop() {
		s, err := r.l.Begin(patience)
		if err != nil {
			b.Fatal(err)
		}
		for i := range r.w {
			sum += r.w[i].Load()
		}
		if !r.l.Validate(s) {
			b.Fatal("a write with no writer")
		}
	}
	_ = sum
}

func BenchmarkSeqLockWrite(b *testing.B) {
	r := openRecord(b, newSegment(b, recSegSize))
	for b.Loop() {
		if err := r.l.Lock(patience); err != nil {
			b.Fatal(err)
		}
		r.l.BeginWrite()
		r.w[0].Add(1)
		r.l.EndWrite()
		r.l.Unlock()
	}
}

func BenchmarkSeqLockContended(b *testing.B) {
	r := openRecord(b, newSegment(b, recSegSize))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := r.increment(nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
