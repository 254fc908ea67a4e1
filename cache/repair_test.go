package cache

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// tally is what a table holds, counted by reading it (not by Repair): its
// entries whose record verifies, their bytes, entries that do not verify,
// buckets locked by a dead process, the buffers loaned from the pool, and
// dead processes still noted as attached (a sweep frees a dead process's
// entry once its buffers, cached ones too, are back); beside what the
// counters say.
type tally struct {
	entries, bytes, bad, deadLocks, inUse, deadProcs uint64
	counted, countedBytes                            uint64
}

func (t tally) true() bool {
	return t.bad == 0 && t.deadLocks == 0 && t.deadProcs == 0 && t.inUse == t.entries &&
		t.counted == t.entries && t.countedBytes == t.bytes
}

func audit(p *Store) tally {
	var t tally
	for i := range maxProcs {
		if w := p.procWord(i).Load(); w != 0 && !shm.AliveWord(w) {
			t.deadProcs++
		}
	}
	for i := range p.nbuckets {
		bk := headerSize + int(i)*bucketSize
		if w := p.word(bk + bOffLock).Load(); w != 0 && !shm.AliveWord(w) {
			t.deadLocks++
		}
		for j := range slotsPerBkt {
			s := slotOff(bk, j)
			h := p.word(s + sOffHash).Load()
			switch {
			case h == 0:
			case p.validSlot(s, h):
				t.entries++
				t.bytes += p.word(s+sOffSize).Load() &^ refBit
			default:
				t.bad++
			}
		}
	}
	for _, c := range p.pool.Stats() {
		t.inUse += uint64(c.InUse)
	}
	st := p.Stats()
	t.counted, t.countedBytes = st.Items, st.Bytes
	return t
}

// TestKilledWritersGiveCapacityBack SIGKILLs 150 writer processes at
// random moments (many inside a write, where a test hook pauses) while
// this process keeps writing. Ordinary writes, without Verify, must then
// have taken back everything the dead held: buffers in use are exactly
// the live entries, and the item and byte counters are exactly what the
// entries hold. Repair afterwards finds nothing left to do.
func TestKilledWritersGiveCapacityBack(t *testing.T) {
	p, name := newStore(t, Config{MaxBytes: 2 << 20, Buckets: 256})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		r := rand.New(rand.NewPCG(7, 8))
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := []byte(strconv.Itoa(r.IntN(500)))
			if _, err := p.Set(ctx, k, value(r.Uint64(), r.IntN(2000)), SetOptions{}); err != nil {
				t.Errorf("set while writers die: %v", err)
				return
			}
		}
	})
	stopWriter := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopWriter()
	type child struct {
		cmd *exec.Cmd
		out *lockedBuffer
	}
	const kills, parallel = 150, 3
	var running []child
	r := rand.New(rand.NewPCG(9, 10))
	for range kills {
		for len(running) < parallel {
			cmd, out := startChild(t, name, "writer")
			running = append(running, child{cmd, out})
		}
		c := running[0]
		running = running[1:]
		c.out.waitFor(t, "writing")
		// Not a synchronisation: it spreads the kills over the writer's loop.
		time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
	for _, c := range running {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	}
	stopWriter()
	before := audit(p)
	// This process's writes notice the dead and take back what they held.
	deadline := time.Now().Add(10 * time.Second)
	writes := 0
	var after tally
	for {
		for i := range maintainEvery {
			if _, err := p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 100), SetOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		writes += maintainEvery
		if after = audit(p); after.true() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d kills and %d writes: %d buffers in use for %d entries (%d that do not verify, %d buckets locked by the dead, %d dead processes noted); counters say %d entries of %d bytes, the entries hold %d bytes",
				kills, writes, after.inUse, after.entries, after.bad, after.deadLocks, after.deadProcs, after.counted, after.countedBytes, after.bytes)
		}
	}
	st := p.Stats()
	t.Logf("after %d kills: %d buffers in use for %d entries, counters %d entries and %d bytes for %d; %d writes later all true (%d buffers reclaimed, %d buckets repaired)",
		kills, before.inUse, before.entries, before.counted, before.countedBytes, before.bytes, writes, st.Reclaimed, st.Repairs)
	if st.Reclaimed == 0 || st.Repairs == 0 {
		t.Errorf("no kill left a buffer or a bucket to take back (stats %+v): the test proved nothing", st)
	}
	rep, err := p.Repair(ctx)
	if err != nil || rep != (RepairReport{}) {
		t.Errorf("Repair after the online reclaim: %+v, %v; want nothing left to do", rep, err)
	}
}

// TestRepairReports: Repair says what it set right, and sets it right.
func TestRepairReports(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16})
	for i := range 100 {
		if _, err := p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 50), SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A record handed to the table that no entry names.
	orphan, err := p.pool.Loan(200)
	if err != nil {
		t.Fatal(err)
	}
	if err := orphan.Share(); err != nil {
		t.Fatal(err)
	}
	// A bucket locked by a process that died (this pid, another start
	// time: a reused pid), whose writer stopped with the sequence odd.
	bk := p.bucketOff(hashKey([]byte("7")))
	p.word(bk + bOffLock).Store(deadWord(t))
	p.lockOf(bk).BeginWrite()
	// An entry (of another bucket) whose record no longer verifies.
	spoiled := -1
	for i := range 100 {
		k := []byte(strconv.Itoa(i))
		if b := p.bucketOff(hashKey(k)); b != bk {
			r, j, ok := p.lookup(b, hashKey(k), k, 0)
			if !ok {
				t.Fatalf("key %d is missing", i)
			}
			r.b()[recHeader] ^= 1
			spoiled = slotOff(b, j)
			break
		}
	}
	if p.validSlot(spoiled, p.word(spoiled+sOffHash).Load()) {
		t.Fatal("the spoiled entry still verifies")
	}
	// Counters that drifted.
	p.used.Add(1000)
	p.items.Add(3)

	rep, err := p.Repair(ctx)
	if !errors.Is(err, ErrCorrupt) {
		t.Errorf("Repair of a spoiled entry: %v, want ErrCorrupt", err)
	}
	if want := (RepairReport{Buckets: 1, Entries: 1, Buffers: 1, Items: 3, Bytes: 1000}); rep != want {
		t.Errorf("Repair reported %+v, want %+v", rep, want)
	}
	if a := audit(p); !a.true() {
		t.Errorf("after Repair: %+v", a)
	}
	if rep, err := p.Repair(ctx); err != nil || rep != (RepairReport{}) {
		t.Errorf("a second Repair: %+v, %v; want nothing left", rep, err)
	}
}

// deadWord names a process that does not run: this pid with another start
// time, as if the pid had been reused.
func deadWord(t *testing.T) uint64 {
	t.Helper()
	me := shm.Self()
	if me.Start == 0 {
		t.Fatal("no start time for this process: is /proc mounted?")
	}
	w := shm.Process{PID: me.PID, Start: me.Start + 1}.Word()
	if shm.AliveWord(w) {
		t.Fatal("a word with a wrong start time counts as alive")
	}
	return w
}

// A live writer that holds a bucket's lock for longer than Repair waits
// (stopped, or slow under load) is not corruption: Repair says ErrBusy and
// not ErrCorrupt, Verify finds nothing, and once the writer lets go Repair
// checks everything.
func TestRepairBusyIsNotCorrupt(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16})
	for i := range 100 {
		if _, err := p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 50), SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The go command that runs this test runs as long as it does.
	writer, err := shm.LookupProcess(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	saved := lockTimeout
	lockTimeout = 50 * time.Millisecond
	defer func() { lockTimeout = saved }()
	l := p.word(headerSize + bOffLock)
	if !l.CompareAndSwap(0, writer.Word()) {
		t.Fatal("bucket 0 is locked")
	}
	defer l.CompareAndSwap(writer.Word(), 0)
	if _, err := p.Repair(ctx); !errors.Is(err, ErrBusy) || errors.Is(err, ErrCorrupt) {
		t.Errorf("Repair with a bucket a live writer holds: %v; want ErrBusy, not ErrCorrupt", err)
	}
	if err := p.Verify(ctx); err != nil {
		t.Errorf("Verify with a bucket a live writer holds: %v; want nil, nothing is corrupt", err)
	}
	l.CompareAndSwap(writer.Word(), 0)
	if rep, err := p.Repair(ctx); err != nil {
		t.Errorf("Repair once the writer let go: %+v, %v", rep, err)
	}
}

// A bucket whose write was left open with nobody holding its lock (which
// no writer's death explains) does not hang its readers: the first one
// takes the bucket over and repairs it, and Repair reports the corruption.
// The reader used to wait for it for good.
func TestOpenWriteWithoutWriter(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16})
	key := []byte("k")
	if _, err := p.Set(ctx, key, value(1, 50), SetOptions{}); err != nil {
		t.Fatal(err)
	}
	bk := p.bucketOff(hashKey(key))
	p.lockOf(bk).BeginWrite()
	if v, _, err := p.Get(ctx, key, nil); err != nil || !intact(v) {
		t.Fatalf("Get from a bucket left open: %v", err)
	}
	p.lockOf(bk).BeginWrite()
	if _, err := p.Repair(ctx); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Repair of a bucket left open with no writer: %v, want ErrCorrupt", err)
	}
	if rep, err := p.Repair(ctx); err != nil || rep != (RepairReport{}) {
		t.Errorf("a second Repair: %+v, %v; want nothing left", rep, err)
	}
}

// A live writer stopped in the middle of a write (SIGSTOP, a debugger)
// makes reads of its bucket fail with ErrBusy once they have waited
// lockTimeout, instead of waiting for good; once it goes on, they succeed.
func TestReadStoppedWriter(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16})
	key := []byte("k")
	if _, err := p.Set(ctx, key, value(1, 50), SetOptions{}); err != nil {
		t.Fatal(err)
	}
	// The go command that runs this test runs as long as it does.
	writer, err := shm.LookupProcess(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	saved := lockTimeout
	lockTimeout = 50 * time.Millisecond
	defer func() { lockTimeout = saved }()
	bk := p.bucketOff(hashKey(key))
	l := p.word(bk + bOffLock)
	if !l.CompareAndSwap(0, writer.Word()) {
		t.Fatal("the bucket is locked")
	}
	p.lockOf(bk).BeginWrite()
	if _, _, err := p.Get(ctx, key, nil); !errors.Is(err, ErrBusy) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("Get while a live writer has the bucket open: %v, want ErrBusy", err)
	}
	p.lockOf(bk).EndWrite()
	l.CompareAndSwap(writer.Word(), 0)
	if v, _, err := p.Get(ctx, key, nil); err != nil || !intact(v) {
		t.Fatalf("Get once the writer went on: %v", err)
	}
}

// A context ends a wait for a bucket that a stopped writer holds, with
// the context's error and not ErrBusy, well before lockTimeout: cancelled
// before the call or while it waits, or past its deadline; reads (a write
// left open) and writes (the lock held) alike. Once the writer goes on,
// the same calls succeed.
func TestContextEndsWaitForStoppedWriter(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16})
	key := []byte("k")
	ver, err := p.Set(ctx, key, []byte("1"), SetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The go command that runs this test runs as long as it does.
	writer, err := shm.LookupProcess(os.Getppid())
	if err != nil {
		t.Fatal(err)
	}
	bk := p.bucketOff(hashKey(key))
	l := p.word(bk + bOffLock)
	if !l.CompareAndSwap(0, writer.Word()) {
		t.Fatal("the bucket is locked")
	}
	p.lockOf(bk).BeginWrite()
	calls := []struct {
		name string
		call func(context.Context) error
	}{
		{"Get", func(ctx context.Context) error { _, _, err := p.Get(ctx, key, nil); return err }},
		{"View", func(ctx context.Context) error { _, err := p.View(ctx, key, func([]byte, Info) {}); return err }},
		{"Set", func(ctx context.Context) error { _, err := p.Set(ctx, key, []byte("2"), SetOptions{}); return err }},
		{"Delete", func(ctx context.Context) error { _, err := p.Delete(ctx, key); return err }},
		{"DeleteIfVersion", func(ctx context.Context) error { return p.DeleteIfVersion(ctx, key, ver) }},
		{"Touch", func(ctx context.Context) error { return p.Touch(ctx, key, time.Hour) }},
		{"Append", func(ctx context.Context) error { return p.Append(ctx, key, []byte("0")) }},
		{"Incr", func(ctx context.Context) error { _, err := p.Incr(ctx, key, 1); return err }},
		{"Flush", func(ctx context.Context) error { return p.Flush(ctx) }},
		{"Repair", func(ctx context.Context) error { _, err := p.Repair(ctx); return err }},
		// Verify said nil (the whole table verified) and Version "not
		// there" when their context ended before they could read.
		{"Verify", func(ctx context.Context) error { return p.Verify(ctx) }},
		{"Version", func(ctx context.Context) error { _, _, err := p.Version(ctx, key); return err }},
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range calls {
		if err := c.call(cancelled); !errors.Is(err, context.Canceled) || errors.Is(err, ErrBusy) {
			t.Errorf("%s with a cancelled context: %v, want context.Canceled", c.name, err)
		}
		waiting, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- c.call(waiting) }()
		cancel() // while the call waits, or before: either way it ends
		if err := <-done; !errors.Is(err, context.Canceled) || errors.Is(err, ErrBusy) {
			t.Errorf("%s cancelled while it waits: %v, want context.Canceled", c.name, err)
		}
	}
	short, stop := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer stop()
	if _, _, err := p.Get(short, key, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Get past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if o := p.lockOf(bk).Owner(); o != writer.Word() {
		t.Fatalf("a cancelled call took the stopped writer's lock: owner %#x", o)
	}
	p.lockOf(bk).EndWrite()
	l.CompareAndSwap(writer.Word(), 0)
	for _, c := range calls {
		if ver, err = p.Set(ctx, key, []byte("1"), SetOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.call(ctx); err != nil {
			t.Errorf("%s once the writer went on: %v", c.name, err)
		}
	}
}

// A Store with a Logger says at Warn that it took a bucket over from a
// writer that died holding it.
func TestLoggerReportsTakeover(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16, Logger: log})
	key := []byte("k")
	bk := p.bucketOff(hashKey(key))
	p.word(bk + bOffLock).Store(deadWord(t))
	p.lockOf(bk).BeginWrite()
	if _, err := p.Set(ctx, key, []byte("v"), SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "writer died") {
		t.Errorf("log after a takeover: %q, want a warning", out)
	}
}
