package mq

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

func init() {
	testenv.RegisterChild("durable-producer", durableProducerChild)
	testenv.RegisterChild("durable-holder", durableHolderChild)
}

// newDirLog creates a file-backed log in a fresh directory; the cleanup
// removes it whether or not its meta segment is still there.
func newDirLog(t testing.TB, c Config) (*Log, string) {
	t.Helper()
	c.Dir = t.TempDir()
	name := fmt.Sprintf("durable-%d-%d", os.Getpid(), logSeq.Add(1))
	l, err := Create(name, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
		if err := Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove: %v", err)
		}
	})
	return l, c.Dir
}

// dropMeta closes l and removes its meta segment from /dev/shm: what a
// reboot, or every process dying and a sweep, leaves of a file-backed
// log is its directory.
func dropMeta(t testing.TB, l *Log) {
	t.Helper()
	l.Close()
	seg, err := shm.OpenSegment(metaName(l.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(seg.Unlink(), seg.Close()); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(l.Name()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open after the meta segment went: %v, want ErrNotExist", err)
	}
}

// reopen rebuilds log name from dir; the returned Log is closed by the
// test's cleanup.
func reopen(t testing.TB, name, dir string) *Log {
	t.Helper()
	l, err := OpenDir(name, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func durablePayload(i int) []byte { return producerPayload(7, i) }

func producerPayload(id, i int) []byte {
	b := make([]byte, 16+(i*37+id*11)%300)
	message(b, uint64(id), uint64(i))
	return b
}

// durableProducerChild sends records durablePayload(0), (1), ... to
// partition 0 of log MQ_LOG and writes "seq offset" on standard output
// after each Send returned, until MQ_N records, then waits to be killed.
func durableProducerChild() int {
	n, _ := strconv.Atoi(os.Getenv("MQ_N"))
	id := 7
	if s := os.Getenv("MQ_ID"); s != "" {
		id, _ = strconv.Atoi(s)
	}
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	for i := range n {
		off, err := l.Send(ctx, 0, producerPayload(id, i))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// Unbuffered: the line is out when the test may kill us.
		if _, err := fmt.Fprintf(os.Stdout, "%d %d\n", i, off); err != nil {
			return 1
		}
	}
	io.Copy(io.Discard, os.Stdin)
	return 1
}

// TestDurableKill: a producer process sends records and is SIGKILLed at
// a random point; every process's handle is then gone and so is the meta
// segment in /dev/shm. Reopened from its directory, the log holds every
// record whose Send returned, intact and in order, and at most the one
// record whose Send was under way, and takes new records after them.
// Every flush policy survives this: a process crash leaves the page
// cache, and the files' pages in it, alone.
func TestDurableKill(t *testing.T) {
	for _, flush := range []FlushPolicy{FlushEverySend, FlushInterval, FlushNone} {
		t.Run(strconv.Itoa(int(flush)), func(t *testing.T) {
			c := Config{SegmentSize: 16 << 10, Segments: 256, Flush: flush}
			if flush == FlushInterval {
				c.FlushPeriod = 5 * time.Millisecond
			}
			l, dir := newDirLog(t, c)
			const n = 4000
			killAt := 1 + rand.IntN(3000)
			t.Logf("killing the producer after %d records", killAt)
			cmd := testenv.Child(t, "durable-producer", "MQ_LOG="+l.Name(), "MQ_N="+strconv.Itoa(n))
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cmd.StdinPipe(); err != nil { // held open: the child waits on it at the end
				t.Fatal(err)
			}
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var offsets []uint64
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var seq int
				var off uint64
				if _, err := fmt.Sscanf(sc.Text(), "%d %d", &seq, &off); err != nil || seq != len(offsets) {
					t.Fatalf("the producer said %q after %d records (%v)", sc.Text(), len(offsets), err)
				}
				offsets = append(offsets, off)
				if len(offsets) == killAt {
					cmd.Process.Kill() // no delay: it is in the middle of its next Send
				}
			}
			cmd.Wait()
			if len(offsets) < killAt {
				t.Fatalf("the producer stopped after %d records", len(offsets))
			}
			name := l.Name()
			dropMeta(t, l)

			l2 := reopen(t, name, dir)
			st, err := l2.Stats(0)
			if err != nil {
				t.Fatal(err)
			}
			r := newReader(t, l2, 0, Oldest)
			ctx := timeout(t, time.Minute)
			check := func(got int, rec Record) {
				t.Helper()
				if _, seq := parse(t, rec.Payload); seq != uint64(got) || len(rec.Payload) != len(durablePayload(got)) {
					t.Fatalf("record %d: seq %d, %d bytes", got, seq, len(rec.Payload))
				}
				if got < len(offsets) && rec.Offset != offsets[got] {
					t.Fatalf("record %d at %d, its Send returned %d", got, rec.Offset, offsets[got])
				}
			}
			got := 0
			for ; got < len(offsets); got++ {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("after %d records: %v (reader at %d, stats %+v, %d sends returned)", got, err, r.Offset(), st, len(offsets))
				}
				check(got, rec)
			}
			// At most the record whose Send was under way, and nothing
			// after it.
			for range 2 {
				rec, err := r.Next(timeout(t, 50*time.Millisecond))
				if errors.Is(err, context.DeadlineExceeded) {
					break
				}
				if err != nil || got > len(offsets) {
					t.Fatalf("after %d records, %d sends returned: %d bytes at %d, %v", got, len(offsets), len(rec.Payload), rec.Offset, err)
				}
				check(got, rec)
				got++
			}
			if r.Offset() > st.Tail {
				t.Fatalf("read up to %d, beyond the tail %d", r.Offset(), st.Tail)
			}
			if st.Torn != 0 || st.Aborted > 1 {
				t.Errorf("stats %+v", st)
			}
			// New records go on after them.
			off, err := l2.Send(ctx, 0, durablePayload(got))
			if err != nil {
				t.Fatal(err)
			}
			rec, err := r.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, seq := parse(t, rec.Payload); seq != uint64(got) || rec.Offset != off {
				t.Fatalf("after reopening: seq %d at %d, sent at %d", seq, rec.Offset, off)
			}
		})
	}
}

// durableHolderChild sends record 0 to log MQ_LOG, loans the next, fills
// half of it, says so and waits to be killed.
func durableHolderChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	if _, err := l.Send(ctx, 0, durablePayload(0)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	res, err := l.Loan(ctx, 0, 100)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	copy(res.Bytes(), durablePayload(1)[:50])
	holdReady("loaned")
	return 1
}

// TestDurableKilledLoan: a producer process killed while it holds a loan
// at the tail. While it lives, the log cannot be rebuilt under it; after
// it died, the reopened log does not show the loaned record (it counts it
// aborted), and new sends go on after it.
func TestDurableKilledLoan(t *testing.T) {
	l, dir := newDirLog(t, Config{SegmentSize: 4096, Flush: FlushEverySend})
	name := l.Name()
	cmd := startWaiting(t, "durable-holder", l, "loaned")
	dropMeta(t, l)
	if l, err := OpenDir(name, dir); !errors.Is(err, shm.ErrLocked) {
		if err == nil {
			l.Close()
		}
		t.Fatalf("rebuilding a log a live process holds: %v, want ErrLocked", err)
	}
	// That attempt left nothing behind.
	if _, err := Open(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after the refused rebuild: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()

	l2 := reopen(t, name, dir)
	st, _ := l2.Stats(0)
	if st.Aborted != 1 || st.Torn != 0 {
		t.Errorf("reopened: stats %+v, want 1 aborted", st)
	}
	// Handles of the new log take the producer slots and generations of
	// the old one's handles (the test's and the child's): the stuck
	// record must not pass for theirs.
	l3 := reopen(t, name, dir)
	_ = l3
	r := newReader(t, l2, 0, Oldest)
	ctx := timeout(t, 30*time.Second)
	rec, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, seq := parse(t, rec.Payload); seq != 0 {
		t.Fatalf("first record: seq %d", seq)
	}
	loaned := r.Offset()
	off, err := l2.Send(ctx, 0, durablePayload(2))
	if err != nil {
		t.Fatal(err)
	}
	if off <= loaned {
		t.Fatalf("a new record at %d, over the loaned one at %d", off, loaned)
	}
	rec, err = r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, seq := parse(t, rec.Payload); seq != 2 || rec.Offset != off {
		t.Fatalf("after the loaned record: seq %d at %d, want 2 at %d", seq, rec.Offset, off)
	}
}

// TestDurableRepair: what a machine crash can leave in the files, made by
// hand: a committed record whose payload did not reach the disk in full,
// stale headers beyond the tail, a segment file its creator died making.
// Reopening shows none of it, counts the torn record and takes new
// records where the valid ones end.
func TestDurableRepair(t *testing.T) {
	l, dir := newDirLog(t, Config{SegmentSize: 4096})
	name := l.Name()
	ctx := timeout(t, 30*time.Second)
	var offs []uint64
	for i := range 3 {
		off, err := l.Send(ctx, 0, durablePayload(i))
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
	}
	tail, _ := l.Stats(0)
	dropMeta(t, l)
	seg, err := shm.OpenFileSegment(l.segPath(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	d := seg.Data()
	d[offs[1]+headerSize+20] ^= 0xff // record 1 torn
	// A stale copy of record 0 beyond the tail, where the header of the
	// second record sent after reopening goes: a producer would take it
	// for another's claim and publish it.
	copy(d[tail.Tail+align8(headerSize+uint64(len(durablePayload(3)))):], d[:headerSize+len(durablePayload(0))])
	seg.Close()
	if err := os.WriteFile(filepath.Join(dir, segPrefix(name, 0)+"1.seg"), make([]byte, 100), 0o600); err != nil {
		t.Fatal(err)
	}

	l2 := reopen(t, name, dir)
	st, _ := l2.Stats(0)
	if st.Torn != 1 || st.Tail != tail.Tail || st.Aborted != 0 {
		t.Errorf("reopened: stats %+v, want 1 torn and the tail at %d", st, tail.Tail)
	}
	if _, err := os.Lstat(filepath.Join(dir, segPrefix(name, 0)+"1.seg")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the half-made segment file: %v", err)
	}
	r := newReader(t, l2, 0, Oldest)
	var seqs []uint64
	// Enough records to cross into segment 1, which is made afresh.
	for i := 3; i < 40; i++ {
		if _, err := l2.Send(ctx, 0, durablePayload(i)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 + 37 {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, seq := parse(t, rec.Payload)
		seqs = append(seqs, seq)
	}
	for i, want := 0, uint64(0); i < len(seqs); i, want = i+1, want+1 {
		if want == 1 {
			want = 2
		}
		if seqs[i] != want {
			t.Fatalf("records after reopening: %v", seqs)
		}
	}
	if _, err := r.Next(timeout(t, 30*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the last record: %v", err)
	}

	// A configuration file that makes no sense is refused.
	l2.Close()
	dropMetaName(t, name)
	conf := configPath(dir, name)
	b, _ := os.ReadFile(conf)
	b[9] ^= 1
	os.Remove(conf)
	if err := os.WriteFile(conf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDir(name, dir); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("a corrupt configuration file: %v, want ErrCorrupt", err)
	}
}

func dropMetaName(t testing.TB, name string) {
	t.Helper()
	seg, err := shm.OpenSegment(metaName(name))
	if err != nil {
		t.Fatal(err)
	}
	seg.Unlink()
	seg.Close()
}

// TestDurableConfig: what Create accepts and refuses for file backing.
func TestDurableConfig(t *testing.T) {
	name := fmt.Sprintf("durable-%d-%d", os.Getpid(), logSeq.Add(1))
	for _, c := range []Config{
		{Flush: FlushEverySend},                                   // no directory to flush to
		{Flush: FlushInterval},                                    // same
		{Dir: t.TempDir(), Flush: 3},                              // unknown policy
		{Dir: t.TempDir(), Flush: FlushNone, FlushPeriod: 1},      // a period without FlushInterval
		{Dir: t.TempDir(), Flush: FlushInterval, FlushPeriod: -1}, // negative
		{MaxAge: -time.Second},
		{Dir: filepath.Join(t.TempDir(), "missing")},
	} {
		if l, err := Create(name, c); err == nil {
			l.Close()
			Remove(name)
			t.Errorf("Create with %+v passed", c)
		}
	}
	if _, err := Open(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused Create left a log: %v", err)
	}
	shared := t.TempDir()
	os.Chmod(shared, 0o777)
	if l, err := Create(name, Config{Dir: shared}); err == nil {
		l.Close()
		Remove(name)
		t.Error("a log was made in a directory everyone may write to")
	}
	// Two logs of one name in a directory: the second is refused, even
	// with its meta segment gone.
	l, dir := newDirLog(t, Config{Flush: FlushInterval})
	if l.Config().FlushPeriod != defaultPeriod || l.Config().Dir != dir {
		t.Errorf("config %+v", l.Config())
	}
	dropMeta(t, l)
	if l2, err := Create(l.Name(), Config{Dir: dir}); !errors.Is(err, os.ErrExist) {
		if err == nil {
			l2.Close()
		}
		t.Errorf("a second log of the name in the directory: %v, want ErrExist", err)
	}
	// Open of another process finds the directory in the meta segment.
	l3 := reopen(t, l.Name(), dir)
	l4, err := Open(l.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer l4.Close()
	if l4.Config() != l3.Config() {
		t.Errorf("Open: %+v, OpenDir: %+v", l4.Config(), l3.Config())
	}
	if _, err := OpenDir(l.Name(), t.TempDir()); !errors.Is(err, os.ErrExist) {
		t.Errorf("OpenDir of another directory: %v, want ErrExist", err)
	}
}

// TestMaxAge: retention by age on a clock the test moves: a segment goes
// once the segment after it is older than MaxAge, by Expire or by a
// producer moving to a new segment; the tail's segment stays.
func TestMaxAge(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 100, MaxAge: time.Hour})
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	l.clock.Store(&clock)
	ctx := timeout(t, 30*time.Second)
	send := func(n int) {
		for range n {
			if _, err := l.Send(ctx, 0, make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
		}
	}
	oldest := func() uint64 { st, _ := l.Stats(0); return st.Oldest / 4096 }
	send(12) // segments 0, 1, 2 full (4 records of 1016 bytes each), the tail at the end of 2
	send(1)  // segment 3
	l.Expire()
	if oldest() != 0 {
		t.Fatalf("young segments dropped: the oldest is %d", oldest())
	}
	now = now.Add(time.Hour) // exactly MaxAge: not older
	l.Expire()
	if oldest() != 0 {
		t.Fatalf("segments of exactly MaxAge dropped: the oldest is %d", oldest())
	}
	now = now.Add(time.Second)
	r := newReader(t, l, 0, 0)
	l.Expire()
	if oldest() != 3 {
		t.Fatalf("after MaxAge: the oldest is %d, want 3 (the tail's)", oldest())
	}
	// A reader in a dropped segment is told (it does not hold age back).
	if _, err := r.Next(ctx); !errors.Is(err, ErrOffsetGone) {
		t.Fatalf("a reader in an expired segment: %v, want ErrOffsetGone", err)
	}
	// Producers drop on their own when they move on: segment 3 is old
	// once segment 4 is, and goes at the roll after.
	send(3 + 4) // fills 3, then 4
	now = now.Add(2 * time.Hour)
	send(4 + 1) // segments 5 and 6: each roll looks
	if oldest() < 4 {
		t.Fatalf("producers rolling dropped nothing: the oldest is %d", oldest())
	}
	st, _ := l.Stats(0)
	if got := st.Tail / 4096; oldest() > got {
		t.Fatalf("the tail's segment %d dropped (oldest %d)", got, oldest())
	}
}

// FuzzScanSegment: reopening walks segments read from files; whatever
// they hold, it ends inside the segment, leaves it so that a second walk
// finds nothing more to repair, and leaves only sound headers from the
// start to where the records end.
func FuzzScanSegment(f *testing.F) {
	rec := func(n int, state uint64) []byte {
		b := make([]byte, align8(headerSize+uint64(n)))
		binary.LittleEndian.PutUint64(b, uint64(n)<<32|state)
		return b
	}
	good := make([]byte, 0, 4096)
	good = append(good, rec(10, stateWriting)...)
	good = append(good, rec(3, stateAborted)...)
	good = append(good, rec(5, stateCommitted)...) // fails its checksum
	f.Add(good, true)
	f.Add(good, false)
	f.Add(append(rec(4096-headerSize, stateCommitted|flagPad)[:16], make([]byte, 8)...), false)
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, true)
	f.Add(make([]byte, 4096), false)
	const size = 4096
	seg, err := shm.CreateMemfd("fuzz-scan", size, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { seg.Close() })
	words, err := seg.Uint64s(0, size/8)
	if err != nil {
		f.Fatal(err)
	}
	data := seg.Data()[:size:size]
	f.Fuzz(func(t *testing.T, b []byte, newest bool) {
		clear(data)
		copy(data, b)
		const k = 3
		end, _, _ := scanSegment(words, data, k, newest)
		if end > size || end%8 != 0 || !newest && end != size {
			t.Fatalf("records end at %d of %d (newest %v)", end, size, newest)
		}
		if again, a, tn := scanSegment(words, data, k, newest); again != end || a != 0 || tn != 0 {
			t.Fatalf("a second walk: end %d (was %d), %d aborted, %d torn", again, end, a, tn)
		}
		for at := uint64(0); at+headerSize <= end; {
			w := words[at/8].Load()
			_, next, err := decode(data, at, w, words[at/8+1].Load(), k*size+at)
			if err != nil || w&stateMask == stateWriting {
				t.Fatalf("after the walk, header %#x at %d: %v", w, at, err)
			}
			at += next
		}
		if newest {
			for i := end / 8; i < size/8; i++ {
				if words[i].Load() != 0 {
					t.Fatalf("word %d beyond the tail at %d is not zero", i, end)
				}
			}
		}
	})
}

// FuzzDecodeConfig: a log's configuration file is outside input.
func FuzzDecodeConfig(f *testing.F) {
	f.Add(encodeConfig(Config{Partitions: 1, SegmentSize: 4096, Segments: 2}))
	f.Add(encodeConfig(Config{Partitions: 4, SegmentSize: 8 << 20, Segments: 8, Flush: FlushInterval, FlushPeriod: time.Second, MaxAge: time.Hour}))
	f.Add(encodeConfig(Config{Partitions: 0, SegmentSize: 1, Segments: 1 << 40}))
	f.Add([]byte("uMQ-DIR1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeConfig(b, "/var/lib/mq")
		if err != nil {
			if !errors.Is(err, shm.ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if d, err := c.withDefaults(); err != nil || d != c {
			t.Fatalf("decoded %+v, which is not a valid configuration (%v)", c, err)
		}
		if c2, err := decodeConfig(encodeConfig(c), "/var/lib/mq"); err != nil || c2 != c {
			t.Fatalf("round trip of %+v: %+v, %v", c, c2, err)
		}
	})
}

// TestDurableReopenRace: handles reopening a log at once (processes after
// a reboot) all get it: one rebuilds, the others wait for it.
func TestDurableReopenRace(t *testing.T) {
	l, dir := newDirLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 30*time.Second)
	for i := range 20 {
		if _, err := l.Send(ctx, 0, durablePayload(i)); err != nil {
			t.Fatal(err)
		}
	}
	want, _ := l.Stats(0)
	name := l.Name()
	for round := range 5 {
		dropMeta(t, l)
		const n = 4
		logs := make(chan *Log, n)
		errs := make(chan error, n)
		for range n {
			go func() {
				l, err := OpenDir(name, dir)
				logs <- l
				errs <- err
			}()
		}
		var got []*Log
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			got = append(got, <-logs)
		}
		for _, g := range got[1:] {
			if st, _ := g.Stats(0); st != want {
				t.Errorf("round %d: stats %+v, want %+v", round, st, want)
			}
			g.Close()
		}
		l = got[0]
	}
	l.Close()
}

// TestDurableKillTwo: two producer processes send at once under
// FlushEverySend and are SIGKILLed one after the other at random points,
// so that the first one's last claim may sit stuck between the other's
// records. Reopened, the log holds every record whose Send returned, in
// each producer's order, at the offsets reported, with at most one more
// per producer, and nothing torn.
func TestDurableKillTwo(t *testing.T) {
	l, dir := newDirLog(t, Config{SegmentSize: 16 << 10, Segments: 256, Flush: FlushEverySend})
	type report struct {
		id  int
		seq int
		off uint64
	}
	reports := make(chan report, 1024)
	var cmds []*exec.Cmd
	done := make(chan struct{}, 2)
	for id := range 2 {
		cmd := testenv.Child(t, "durable-producer", "MQ_LOG="+l.Name(), "MQ_N=4000", "MQ_ID="+strconv.Itoa(id))
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
		cmds = append(cmds, cmd)
		go func() {
			defer func() { done <- struct{}{} }()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var r report
				r.id = id
				if _, err := fmt.Sscanf(sc.Text(), "%d %d", &r.seq, &r.off); err != nil {
					r.seq = -1
				}
				reports <- r
			}
		}()
	}
	killAt := [2]int{1 + rand.IntN(1500), 1 + rand.IntN(1500)}
	t.Logf("killing producer 0 after %d of its records, producer 1 after %d", killAt[0], killAt[1])
	offsets := [2][]uint64{}
	killed := [2]bool{}
	for ended := 0; ended < 2; {
		select {
		case r := <-reports:
			if r.seq != len(offsets[r.id]) {
				t.Fatalf("producer %d said seq %d after %d records", r.id, r.seq, len(offsets[r.id]))
			}
			offsets[r.id] = append(offsets[r.id], r.off)
			if len(offsets[r.id]) == killAt[r.id] && !killed[r.id] {
				killed[r.id] = true
				cmds[r.id].Process.Kill()
			}
		case <-done:
			ended++
		}
	}
	for len(reports) > 0 {
		r := <-reports
		offsets[r.id] = append(offsets[r.id], r.off)
	}
	for _, cmd := range cmds {
		cmd.Wait()
	}
	name := l.Name()
	dropMeta(t, l)

	l2 := reopen(t, name, dir)
	st, _ := l2.Stats(0)
	r := newReader(t, l2, 0, Oldest)
	ctx := timeout(t, time.Minute)
	got := [2]int{}
	for got[0] < len(offsets[0]) || got[1] < len(offsets[1]) {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("after %v records: %v (stats %+v)", got, err, st)
		}
		p, seq := parse(t, rec.Payload)
		if p > 1 || seq != uint64(got[p]) {
			t.Fatalf("producer %d seq %d, want seq %d", p, seq, got[p])
		}
		if got[p] < len(offsets[p]) && rec.Offset != offsets[p][got[p]] {
			t.Fatalf("producer %d record %d at %d, its Send returned %d", p, seq, rec.Offset, offsets[p][got[p]])
		}
		got[p]++
	}
	for {
		rec, err := r.Next(timeout(t, 50*time.Millisecond))
		if errors.Is(err, context.DeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p, seq := parse(t, rec.Payload)
		if p > 1 || seq != uint64(got[p]) || got[p] > len(offsets[p]) {
			t.Fatalf("after the returned Sends: producer %d seq %d (%v read, %d and %d returned)", p, seq, got, len(offsets[0]), len(offsets[1]))
		}
		got[p]++
	}
	if st.Torn != 0 || st.Aborted > 2 {
		t.Errorf("stats %+v", st)
	}
	t.Logf("%v records read, %d and %d Sends returned, %d aborted", got, len(offsets[0]), len(offsets[1]), st.Aborted)
}
