package mq

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

func init() {
	testenv.RegisterChild("viewer", viewerChild)
	testenv.RegisterChild("squat-file", squatFileChild)
}

// squatFileChild, run as another user, makes a file anyone may write at
// path MQ_SQUAT (a segment's file in /dev/shm, taken before its maker
// gets to it), says "squatted" and waits for its standard input to end.
func squatFileChild() int {
	path := os.Getenv("MQ_SQUAT")
	if err := os.WriteFile(path, nil, 0o666); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.Chmod(path, 0o666); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	holdReady("squatted")
	return 0
}

// TestRecycleSquatted: another user's file at the name of a segment to be
// made, while the partition has spares, makes the maker create the
// segment elsewhere (shm.CreateSegment's other file), as without
// Recycle, not leave it to a producer to take over a second later; the
// records read back whole.
func TestRecycleSquatted(t *testing.T) {
	u := testenv.OtherUser(t)
	l := newLog(t, Config{SegmentSize: 4096, Segments: 3, Full: FullOverwrite, Recycle: true})
	rollTo(t, l, 5)
	k := l.parts[0].made.Load() // the next segment to make
	squat := shmFile(segName(l.Name(), 0, k))
	t.Cleanup(func() { os.Remove(squat) })
	cmd := u.Child(t, "squat-file", "MQ_SQUAT="+squat)
	in, _ := startReady(t, cmd, "squatted")
	defer func() { in.Close(); cmd.Wait() }()
	f := func(_ *Log, p int, k uint64) {
		t.Errorf("segment %d of partition %d taken over: its maker left it", k, p)
	}
	testTakeOver.Store(&f)
	defer testTakeOver.Store(nil)
	if st, _ := l.Stats(0); st.Reused == 0 {
		t.Fatal("no spare reused before the squat: the test shows nothing")
	}
	rollTo(t, l, k+3)
	r := newReader(t, l, 0, Oldest)
	st, _ := l.Stats(0)
	ctx := timeout(t, 10*time.Second)
	for {
		rec, ok, err := r.NextBelow(ctx, st.Tail)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		parse(t, rec.Payload)
	}
}

// rollTo sends 1000-byte records to partition 0 of l until its tail is in
// segment k, and waits for the segment made ahead. Each time the tail
// enters a segment it waits until the handle has unmapped the segments
// its cache let go of (they are unmapped in the background, and a
// segment still mapped is not reused): these tests are about other
// holders.
func rollTo(t *testing.T, l *Log, k uint64) {
	t.Helper()
	ctx := timeout(t, 20*time.Second)
	pt := l.parts[0]
	size := uint64(l.cfg.SegmentSize)
	b := make([]byte, 1000)
	in := pt.tail.Load() / size
	for i := uint64(0); pt.tail.Load() < k*size; i++ {
		if now := pt.tail.Load() / size; now != in {
			l.unmapping.Wait()
			in = now
		}
		message(b, 9, i)
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	waitAhead(t, pt)
}

// shmSegFiles is what each of segments [0, to) of partition 0 of l and its
// spares are in /dev/shm (nil: not there).
func shmSegFiles(l *Log, to uint64) (segs, spare []os.FileInfo) {
	for k := range to {
		fi, _ := os.Stat(shmFile(segName(l.Name(), 0, k)))
		segs = append(segs, fi)
	}
	for j := range spares {
		fi, _ := os.Stat(shmFile(spareName(l.Name(), 0, j)))
		spare = append(spare, fi)
	}
	return segs, spare
}

// reusedAs says which segment of partition 0 made so far, or which of its
// spares (-1 - j), is file fi now; -1-spares if none.
func reusedAs(l *Log, fi os.FileInfo) int {
	segs, spare := shmSegFiles(l, l.parts[0].made.Load())
	for k, s := range segs {
		if s != nil && os.SameFile(s, fi) {
			return k
		}
	}
	for j, s := range spare {
		if s != nil && os.SameFile(s, fi) {
			return -1 - j
		}
	}
	return -1 - spares
}

// TestRecycle: under Config.Recycle the segments retention drops become
// the spare and then new segments, zeroed; the records read back are the
// ones sent; once the segment made ahead is made, the partition holds at
// most Segments+1 segment files and a spare.
func TestRecycle(t *testing.T) {
	const size, keep = 4096, 3
	l := newLog(t, Config{SegmentSize: size, Segments: keep, Full: FullOverwrite, Recycle: true})
	if !l.Config().Recycle {
		t.Fatal("Config().Recycle is false")
	}
	o, err := Open(l.Name())
	if err != nil {
		t.Fatal(err)
	}
	recycles := o.Config().Recycle
	o.Close()
	if !recycles {
		t.Fatal("a handle opened on a recycling log reads Recycle false")
	}
	rollTo(t, l, 1)
	first, _ := shmSegFiles(l, 1)
	rollTo(t, l, 14)
	st, _ := l.Stats(0)
	if st.Reused < 10 {
		t.Fatalf("stats %+v: %d segments reused of about 12 made after the first drop", st, st.Reused)
	}
	if k := reusedAs(l, first[0]); k == -1-spares {
		t.Fatal("segment 0's file was not reused")
	}
	segs, spare := shmSegFiles(l, l.parts[0].made.Load())
	var there []int
	for k, s := range segs {
		if s != nil {
			there = append(there, k)
		}
	}
	if head := int(l.parts[0].head.Load()); len(there) == 0 || len(there) > keep+1 || there[0] != head {
		t.Fatalf("segments %v in /dev/shm with the head at %d: want the head and at most %d more", there, head, keep)
	}
	// Every record kept reads back whole, in order, from recycled
	// segments.
	r := newReader(t, l, 0, Oldest)
	ctx := timeout(t, 10*time.Second)
	var last uint64
	for n := 0; ; n++ {
		rec, ok, err := r.NextBelow(ctx, st.Tail)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			if n < 4 {
				t.Fatalf("%d records read from %d segments", n, keep)
			}
			break
		}
		_, seq := parse(t, rec.Payload)
		if n > 0 && seq != last+1 {
			t.Fatalf("record %d after %d", seq, last)
		}
		last = seq
	}
	r.Close()
	if spare[0] != nil && spare[1] != nil {
		t.Fatal("two spare segments once the segment made ahead was made")
	}
}

// TestRecycleSpares: Remove removes a partition's spares; Create removes
// ones left by a log of the same name before (of another size here, which
// would never be reused and would keep the log from recycling).
func TestRecycleSpares(t *testing.T) {
	name := fmt.Sprintf("test-%d-%d", os.Getpid(), logSeq.Add(1))
	makeSpares := func(size int) {
		t.Helper()
		for j := range spares {
			s, err := shm.CreateSegment(spareName(name, 0, j), size, &shm.SegmentConfig{Keep: true})
			if err != nil {
				t.Fatal(err)
			}
			s.Close()
		}
	}
	gone := func(when string) {
		t.Helper()
		for j := range spares {
			if _, err := os.Stat(shmFile(spareName(name, 0, j))); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("spare %d %s: %v", j, when, err)
			}
		}
	}
	t.Cleanup(func() {
		for j := range spares {
			os.Remove(shmFile(spareName(name, 0, j)))
		}
	})
	makeSpares(100)
	l, err := Create(name, Config{SegmentSize: 4096, Segments: 3, Recycle: true})
	if err != nil {
		t.Fatal(err)
	}
	gone("after Create")
	makeSpares(4096 + trailer)
	l.Close()
	if err := Remove(name); err != nil {
		t.Fatal(err)
	}
	gone("after Remove")
}

// TestRecycleSpareNames: a log's spares are named apart from every log's
// meta segment: creating log x leaves alone a log named as x's spare
// would have been named with the meta segments' prefix.
func TestRecycleSpareNames(t *testing.T) {
	x := fmt.Sprintf("test-%d-%d", os.Getpid(), logSeq.Add(1))
	other := newLogNamed(t, x+"-p0-spare0", Config{SegmentSize: 4096, Segments: 3})
	newLogNamed(t, x, Config{SegmentSize: 4096, Segments: 3, Recycle: true})
	o, err := Open(other.Name())
	if err != nil {
		t.Fatalf("log %s after log %s was created: %v", other.Name(), x, err)
	}
	o.Close()
}

func TestRecycleRefusesDir(t *testing.T) {
	if _, err := Create("test-recycle-dir", Config{Dir: t.TempDir(), Recycle: true}); err == nil {
		t.Fatal("a file-backed log was made with Recycle")
	}
}

// viewerChild opens log MQ_LOG, reads the record at offset 0 in place
// (ReadAt), then the records at MQ_EVICT (offsets, comma-separated; each
// released at once) so that its handle's random-read cache lets segment
// 0 go and the view alone holds it, and says "viewing"; for each line on
// its standard input it then says "same" if the record's bytes are still
// what they were, or "changed".
func viewerChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rec, release, err := l.ReadAt(0, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer release()
	for _, f := range strings.Split(os.Getenv("MQ_EVICT"), ",") {
		off, _ := strconv.ParseUint(f, 10, 64)
		_, done, err := l.ReadAt(0, off)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		done()
	}
	was := bytes.Clone(rec.Payload)
	fmt.Println("viewing")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if bytes.Equal(rec.Payload, was) {
			fmt.Println("same")
		} else {
			fmt.Println("changed")
		}
	}
	return 0
}

// viewer is a viewerChild of log l.
type viewer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startViewer(t *testing.T, l *Log) *viewer {
	t.Helper()
	size := l.cfg.SegmentSize
	cmd := testenv.Child(t, "viewer", "MQ_LOG="+l.Name(), fmt.Sprintf("MQ_EVICT=%d,%d", size, 2*size))
	in, out := startReady(t, cmd, "viewing")
	return &viewer{cmd: cmd, in: in, out: out}
}

// same asks the viewer whether its record is unchanged.
func (v *viewer) same(t *testing.T) bool {
	t.Helper()
	if _, err := io.WriteString(v.in, "?\n"); err != nil {
		t.Fatal(err)
	}
	line, err := v.out.ReadString('\n')
	if err != nil || (line != "same\n" && line != "changed\n") {
		t.Fatalf("viewer said %q, %v", line, err)
	}
	return line == "same\n"
}

// evict reads (and releases) the first records of segments 1 and 2 of
// partition 0, so that l's random-read cache holds those two and no
// longer segment 0, and waits until the cache's mapping of segment 0 is
// gone (the cache lets go in the background).
func evict(t *testing.T, l *Log) {
	t.Helper()
	for _, k := range []uint64{1, 2} {
		_, release, err := l.ReadAt(0, k*uint64(l.cfg.SegmentSize))
		if err != nil {
			t.Fatal(err)
		}
		release()
	}
	l.unmapping.Wait()
}

// TestRecyclePinned: a segment mapped anywhere (an in-place ReadAt view
// here, in this process or another, once the handle's read cache let the
// segment go) is never reused, even once retention dropped it: its bytes
// stay what they were for the holder. A view released, or a holder
// killed, pins nothing: the segment is reused once dropped.
func TestRecyclePinned(t *testing.T) {
	const size, keep = 4096, 4
	cfg := Config{SegmentSize: size, Segments: keep, Full: FullOverwrite, Recycle: true}
	// Records in segments 0 to 2 (the first of each at its start), none
	// dropped yet.
	start := func(t *testing.T) (*Log, os.FileInfo) {
		l := newLog(t, cfg)
		rollTo(t, l, 3)
		first, _ := shmSegFiles(l, 1)
		return l, first[0]
	}
	t.Run("this process", func(t *testing.T) {
		l, seg0 := start(t)
		rec, release, err := l.ReadAt(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		was := bytes.Clone(rec.Payload)
		evict(t, l)
		rollTo(t, l, 16)
		if !bytes.Equal(rec.Payload, was) {
			t.Fatal("a view's bytes changed: its segment was reused while mapped")
		}
		if k := reusedAs(l, seg0); k != -1-spares {
			t.Fatalf("the viewed segment 0 is now %d (-1, -2: a spare)", k)
		}
		if _, _, err := l.ReadAt(0, 0); !errors.Is(err, ErrOffsetGone) {
			t.Fatalf("ReadAt of a dropped segment: %v, want ErrOffsetGone", err)
		}
		if st, _ := l.Stats(0); st.Reused == 0 {
			t.Fatal("no segment was reused: the test shows nothing")
		}
	})
	t.Run("released", func(t *testing.T) {
		l, seg0 := start(t)
		_, release, err := l.ReadAt(0, 0)
		if err != nil {
			t.Fatal(err)
		}
		release()
		release() // a second call does nothing
		evict(t, l)
		rollTo(t, l, 16)
		if k := reusedAs(l, seg0); k == -1-spares {
			t.Fatal("segment 0, its view released and out of the read cache, was not reused")
		}
	})
	t.Run("another process", func(t *testing.T) {
		l, seg0 := start(t)
		v := startViewer(t, l)
		rollTo(t, l, 16)
		if !v.same(t) {
			t.Fatal("another process's view changed: its segment was reused while mapped")
		}
		if k := reusedAs(l, seg0); k != -1-spares {
			t.Fatalf("the viewed segment 0 is now %d (-1, -2: a spare)", k)
		}
		v.in.Close()
		if err := v.cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("killed holder", func(t *testing.T) {
		l, seg0 := start(t)
		v := startViewer(t, l)
		if err := v.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		v.cmd.Wait()
		rollTo(t, l, 16)
		if k := reusedAs(l, seg0); k == -1-spares {
			t.Fatal("segment 0, held by a process killed before it was dropped, was not reused")
		}
	})
}

// TestReadCache: the handle's random-read cache keeps the segments it
// read last mapped, and pinned (dropped, they are removed, not reused),
// and lets a caller's view outlive their eviction; segments dropped leave
// it at the next read of any partition; a view released after Close is
// harmless.
func TestReadCache(t *testing.T) {
	const size = 4096
	l := newLog(t, Config{Partitions: 2, SegmentSize: size, Segments: 4, Full: FullOverwrite, Recycle: true})
	rollTo(t, l, 3)
	pt := l.parts[0]
	cached := func() []uint64 {
		pt.readMu.Lock()
		defer pt.readMu.Unlock()
		var ks []uint64
		for _, m := range pt.reads {
			if m != nil {
				ks = append(ks, m.index)
			}
		}
		slices.Sort(ks)
		return ks
	}
	rec, release, err := l.ReadAt(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	was := bytes.Clone(rec.Payload)
	evict(t, l)
	if got := cached(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("cached segments %v after reads in 0, 1, 2; want [1 2]", got)
	}
	if !bytes.Equal(rec.Payload, was) {
		t.Fatal("a view changed once its segment left the cache")
	}
	release()
	first, _ := shmSegFiles(l, 4)
	rollTo(t, l, 16)
	for k := 1; k <= 2; k++ {
		if reusedAs(l, first[k]) != -1-spares {
			t.Fatalf("segment %d, in the read cache when dropped, was reused", k)
		}
	}
	if reusedAs(l, first[3]) == -1-spares {
		t.Fatal("segment 3, never read, was not reused: the test shows nothing")
	}
	// Dropped: a read of partition 1 lets them go.
	if _, err := l.Send(timeout(t, 10*time.Second), 1, []byte("p1")); err != nil {
		t.Fatal(err)
	}
	_, done, err := l.ReadAt(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if got := cached(); len(got) != 0 {
		t.Fatalf("cached segments %v of partition 0 after they were dropped and partition 1 was read", got)
	}
	// A view released after Close.
	_, release, err = l.ReadAt(0, 15*size)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	release()
	if _, _, err := l.ReadAt(0, 15*size); !errors.Is(err, ErrClosed) {
		t.Fatalf("ReadAt after Close: %v, want ErrClosed", err)
	}
}

// TestRecycleAcrossProcesses: producers in three processes and a reader
// in this one, through a recycling log under FullBlock: every record
// arrives once, in order per producer, and segments were reused.
func TestRecycleAcrossProcesses(t *testing.T) {
	l := produceInProcesses(t, Config{SegmentSize: 32 << 10, Segments: 4, Recycle: true})
	if st, _ := l.Stats(0); st.Reused == 0 || st.Aborted != 0 {
		t.Errorf("stats %+v: no segment reused, or records aborted", st)
	}
}

// TestRecycleKeepsMappings: under Recycle a handle keeps its mappings of
// the partition's files once done with them (partition.maps), and a
// segment made of a spare, or opened by a reader, is mapped on the
// mapping the handle had of the file before: no page table made again.
// The kept mappings hold no lock (the spares are still reused) and go
// with the handle.
func TestRecycleKeepsMappings(t *testing.T) {
	for _, keep := range []uint64{3, 8} {
		t.Run(fmt.Sprint(keep), func(t *testing.T) { keepsMappings(t, keep) })
	}
}

// keepsMappings is TestRecycleKeepsMappings with Segments keep.
func keepsMappings(t *testing.T, keep uint64) {
	const size = 64 << 10
	l := newLog(t, Config{SegmentSize: size, Segments: int(keep), Recycle: true})
	r := newReader(t, l, 0, 0)
	ctx := timeout(t, 30*time.Second)
	b := make([]byte, 1000)
	in := uint64(0)
	for seq := uint64(0); ; seq++ {
		st, _ := l.Stats(0)
		if st.Reused >= 30 {
			break
		}
		if now := st.Tail / size; now != in {
			// As rollTo: the mappings let go in the background are
			// let go before the next drop (else the segment is still
			// held then, and removed rather than made a spare).
			l.unmapping.Wait()
			in = now
		}
		if in > 200 {
			t.Fatalf("%d segments made, %d of spares", in, st.Reused)
		}
		message(b, 1, seq)
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, got := parse(t, rec.Payload); got != seq {
			t.Fatalf("seq %d, want %d", got, seq)
		}
	}
	st, _ := l.Stats(0)
	maps := l.parts[0].maps
	// Segments made of spares by the producer's maker, and as many
	// opened by the reader, each a file the handle mapped before.
	if maps.Hits() < 2*st.Reused-keep-spares {
		t.Fatalf("%d segments made of spares, %d mappings reused; want nearly all twice", st.Reused, maps.Hits())
	}
	if maps.Idle() == 0 {
		t.Fatal("no idle mappings")
	}
	r.Close()
	l.Close()
	if n := maps.Idle(); n != 0 {
		t.Fatalf("%d idle mappings after Close", n)
	}
}

// TestMapsFor: the room of a partition's MapCache (mapsFor): a cycle of
// its files twice, within 128 a partition and 1,024 a handle, and none
// where that is less than a cycle or the log does not recycle.
func TestMapsFor(t *testing.T) {
	for _, c := range []struct {
		parts, segs int
		recycle     bool
		dir         string
		want        int // 0: none
	}{
		{1, 8, true, "", 2*(8+spares+1) + 2},
		{1, 3, true, "", 2*(3+spares+1) + 2},
		{64, 8, true, "", 1024 / 64},
		{128, 2, true, "", 1024 / 128},
		{256, 2, true, "", 0},
		{256, 8, true, "", 0},
		{1, 100, true, "", maxIdlePart},
		{1, 200, true, "", 0},
		{1, 8, false, "", 0},
		{1, 8, true, "/tmp", 0},
	} {
		m := mapsFor(Config{Partitions: c.parts, Segments: c.segs, Recycle: c.recycle, Dir: c.dir})
		got := 0
		if m != nil {
			got = m.Room()
		}
		if got != c.want {
			t.Errorf("%d partitions of %d segments, Recycle %v, Dir %q: room %d, want %d", c.parts, c.segs, c.recycle, c.dir, got, c.want)
		}
	}
}
