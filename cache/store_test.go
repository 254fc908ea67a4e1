package cache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

var poolSeq atomic.Int64

// ctx is the tests' context: a wait for a bucket a live writer holds ends
// by lockTimeout (the cancellation tests make their own).
var ctx = context.Background()

func newStore(t testing.TB, o Config) (*Store, string) {
	t.Helper()
	name := fmt.Sprintf("test-%d-%d", os.Getpid(), poolSeq.Add(1))
	p, err := Open(name, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		Remove(name)
	})
	return p, name
}

func TestMain(m *testing.M) {
	for _, mode := range []string{"writer", "stall", "reader"} {
		testenv.RegisterChild(mode, func() int { return child(mode) })
	}
	testenv.Main(m)
}

// value makes a self-checking value: its seed, then Fill(seed).
func value(seed uint64, n int) []byte {
	b := make([]byte, 8+n)
	binary.LittleEndian.PutUint64(b, seed)
	bench.Fill(b[8:], seed)
	return b
}

// intact reports whether v is a whole value made by value.
func intact(v []byte) bool {
	if len(v) < 8 {
		return false
	}
	seed := binary.LittleEndian.Uint64(v)
	return bench.Sum(v[8:]) == bench.FillSum(len(v)-8, seed)
}

func TestBasics(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20})
	if _, _, err := p.Get(ctx, []byte("k"), nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get of a missing key: %v", err)
	}
	v1, err := p.Set(ctx, []byte("k"), []byte("one"), SetOptions{Flags: 7})
	if err != nil {
		t.Fatal(err)
	}
	got, in, err := p.Get(ctx, []byte("k"), nil)
	if err != nil || string(got) != "one" || in.Version != v1 || in.Flags != 7 || !in.Expires.IsZero() {
		t.Fatalf("get: %q %+v %v", got, in, err)
	}
	if _, err := p.Set(ctx, []byte("k"), []byte("x"), SetOptions{Mode: IfAbsent}); !errors.Is(err, ErrExists) {
		t.Fatalf("add over an entry: %v", err)
	}
	if _, err := p.Set(ctx, []byte("nope"), []byte("x"), SetOptions{Mode: IfPresent}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("replace of a missing key: %v", err)
	}
	if _, err := p.Set(ctx, []byte("k"), []byte("x"), SetOptions{Mode: IfVersion, Version: v1 + 100}); !errors.Is(err, ErrExists) {
		t.Fatalf("cas with a wrong version: %v", err)
	}
	v2, err := p.Set(ctx, []byte("k"), []byte("two"), SetOptions{Mode: IfVersion, Version: v1})
	if err != nil || v2 <= v1 {
		t.Fatalf("cas: %d %v", v2, err)
	}
	seen := ""
	if ok, err := p.View(ctx, []byte("k"), func(v []byte, _ Info) { seen = string(v) }); !ok || err != nil || seen != "two" {
		t.Fatalf("view: %v %v %q", ok, err, seen)
	}
	if ok, _ := p.Delete(ctx, []byte("k")); !ok {
		t.Fatal("delete found nothing")
	}
	if ok, _ := p.Delete(ctx, []byte("k")); ok {
		t.Fatal("deleted twice")
	}
	if _, err := p.Set(ctx, []byte("big"), make([]byte, 2<<20), SetOptions{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a 2 MiB value: %v", err)
	}
	if _, err := p.Set(ctx, []byte("empty"), nil, SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, _, err := p.Get(ctx, []byte("empty"), []byte("junk")); err != nil || len(v) != 0 {
		t.Fatalf("empty value: %q %v", v, err)
	}
	st := p.Stats()
	if st.Items != 1 || st.Hits < 3 || st.Misses < 1 || st.Sets != 3 || st.Deletes != 1 {
		t.Errorf("stats %+v", st)
	}
	if err := p.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTTLAndTouch(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20})
	p.Set(ctx, []byte("short"), []byte("v"), SetOptions{TTL: 30 * time.Millisecond})
	p.Set(ctx, []byte("kept"), []byte("v"), SetOptions{TTL: 30 * time.Millisecond})
	if err := p.Touch(ctx, []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	if _, in, err := p.Get(ctx, []byte("short"), nil); err != nil || in.Expires.IsZero() {
		t.Fatalf("before expiry: %+v %v", in, err)
	}
	// Polling: an entry expires with the clock, and nothing tells when.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		_, _, err := p.Get(ctx, []byte("short"), nil)
		if errors.Is(err, ErrNotFound) {
			break
		}
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("an entry with a TTL of 30 ms, 10 s later: %v", err)
		}
	}
	if _, _, err := p.Get(ctx, []byte("kept"), nil); err != nil {
		t.Fatalf("touched entry: %v", err)
	}
	if err := p.Touch(ctx, []byte("short"), time.Hour); !errors.Is(err, ErrNotFound) {
		t.Fatalf("touch of an expired entry: %v", err)
	}
	// An expired entry makes room for an add.
	if _, err := p.Set(ctx, []byte("short"), []byte("w"), SetOptions{Mode: IfAbsent}); err != nil {
		t.Fatal(err)
	}
}

// TestEvictionKeepsTheLimit: far more data than the limit; the pool stays
// under it, recently read keys survive better than the rest, and every
// value read is whole.
func TestEvictionKeepsTheLimit(t *testing.T) {
	const limit = 1 << 20
	p, _ := newStore(t, Config{MaxBytes: limit, Buckets: 64})
	hot := []byte("hot")
	p.Set(ctx, hot, value(1, 100), SetOptions{})
	for i := range 20000 {
		if _, err := p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 200+i%700), SetOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%10 == 0 {
			p.Get(ctx, hot, nil)
		}
		if st := p.Stats(); st.Bytes > limit {
			t.Fatalf("%d bytes in use, limit %d", st.Bytes, limit)
		}
	}
	if v, _, err := p.Get(ctx, hot, nil); err != nil || !intact(v) {
		t.Errorf("the hot key was evicted: %v", err)
	}
	st := p.Stats()
	if st.Evictions == 0 || st.Items == 0 {
		t.Errorf("stats %+v", st)
	}
	for i := range 20000 {
		if v, _, err := p.Get(ctx, []byte(strconv.Itoa(i)), nil); err == nil && !intact(v) {
			t.Fatalf("key %d: torn value", i)
		}
	}
	if err := p.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	if st2 := p.Stats(); st2.Bytes != st.Bytes || st2.Items != st.Items {
		t.Errorf("counters drifted: %+v, Verify counted %+v", st, st2)
	}
}

// TestConcurrent: goroutines writing and reading the same keys never see a
// torn value.
func TestConcurrent(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 4 << 20})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var torn atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := []byte(strconv.Itoa(r.IntN(200)))
				p.Set(ctx, k, value(r.Uint64(), r.IntN(3000)), SetOptions{})
				if i%7 == 0 {
					p.Delete(ctx, k)
				}
			}
		})
	}
	var readers sync.WaitGroup
	for range 3 {
		readers.Go(func() {
			buf := make([]byte, 0, 4096)
			for i := range 100000 {
				v, _, err := p.Get(ctx, []byte(strconv.Itoa(i%200)), buf)
				if err == nil && !intact(v) {
					torn.Add(1)
				}
			}
		})
	}
	readers.Wait()
	close(stop)
	wg.Wait()
	if n := torn.Load(); n > 0 {
		t.Fatalf("%d torn reads", n)
	}
	if err := p.Verify(ctx); err != nil {
		t.Fatal(err)
	}
}

// child runs a writer process for the crash tests.
func child(mode string) int {
	p, err := Open(os.Getenv("CACHE_TEST_POOL"), Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	switch mode {
	case "writer", "stall":
		// Pause inside some writes, so that kills land there too; a
		// "stall" writer stops inside its 300th write and says so.
		n := 0
		testHookMidWrite = func() {
			n++
			if mode == "stall" && n == 300 {
				fmt.Println("stalled")
				os.Stdout.Sync()
				time.Sleep(time.Hour) // until the test kills it
			}
			if n%50 == 0 {
				time.Sleep(200 * time.Microsecond) // a pause for kills to land in
			}
		}
		r := rand.New(rand.NewPCG(uint64(os.Getpid()), 2))
		for i := 0; ; i++ {
			k := []byte(strconv.Itoa(r.IntN(500)))
			p.Set(ctx, k, value(r.Uint64(), r.IntN(2000)), SetOptions{})
			if i == 0 {
				fmt.Println("writing")
			}
			if r.IntN(10) == 0 {
				p.Delete(ctx, k)
			}
		}
	case "reader":
		// Counts hits in another process: reads need no lock.
		hits := 0
		for i := range 100000 {
			v, _, err := p.Get(ctx, []byte(strconv.Itoa(i%500)), nil)
			if err == nil {
				if !intact(v) {
					fmt.Println("torn")
					return 1
				}
				hits++
			}
		}
		fmt.Println("hits", hits)
		return 0
	}
	return 2
}

// lockedBuffer is a child's stdout, read while the child writes.
type lockedBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	wrote chan struct{} // signalled after each Write
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	n, err := l.b.Write(p)
	l.mu.Unlock()
	select {
	case l.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// waitFor waits until the output holds s, woken by each write, and
// fails the test if it does not within 10 s.
func (l *lockedBuffer) waitFor(t *testing.T, s string) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for !strings.Contains(l.String(), s) {
		select {
		case <-l.wrote:
		case <-timeout.C:
			t.Fatalf("a child process never printed %q", s)
		}
	}
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startChild(t *testing.T, name, mode string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cmd := testenv.Child(t, mode, "CACHE_TEST_POOL="+name)
	out := lockedBuffer{wrote: make(chan struct{}, 1)}
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &out
}

// TestWriterKilled kills writer processes with SIGKILL at random moments,
// many of them inside a write, while this process reads: no read ever sees
// a torn value, no lock stays stuck (writes go on), and Verify passes after
// every kill.
func TestWriterKilled(t *testing.T) {
	p, name := newStore(t, Config{MaxBytes: 8 << 20})
	var torn, reads atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v, _, err := p.Get(ctx, []byte(strconv.Itoa(i%500)), nil)
			if err == nil {
				reads.Add(1)
				if !intact(v) {
					torn.Add(1)
				}
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 12 {
		a, aout := startChild(t, name, "writer")
		mode := "writer"
		if round%2 == 0 {
			mode = "stall" // killed for certain while it holds a lock
		}
		b, bout := startChild(t, name, mode)
		aout.waitFor(t, "writing")
		// Not a synchronisation: a random moment of a's writes.
		time.Sleep(time.Duration(r.IntN(60)) * time.Millisecond)
		if mode == "stall" {
			bout.waitFor(t, "stalled")
		}
		a.Process.Kill()
		b.Process.Kill()
		a.Wait()
		b.Wait()
		// Writes go on: a lock a dead writer held is taken over.
		for i := range 500 {
			if _, err := p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 10), SetOptions{}); err != nil {
				t.Fatalf("round %d: set after the kill: %v", round, err)
			}
		}
		if err := p.Verify(ctx); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	if n := torn.Load(); n > 0 {
		t.Fatalf("%d torn reads of %d", n, reads.Load())
	}
	st := p.Stats()
	if st.Repairs == 0 {
		t.Fatal("no kill landed while a writer held a lock: the test proved nothing")
	}
	t.Logf("%d reads, none torn; %d buckets repaired after a writer died holding them", reads.Load(), st.Repairs)
}

// TestReaderInAnotherProcess: another process reads what this one wrote.
func TestReaderInAnotherProcess(t *testing.T) {
	p, name := newStore(t, Config{MaxBytes: 8 << 20})
	for i := range 500 {
		p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 100), SetOptions{})
	}
	cmd, out := startChild(t, name, "reader")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("reader: %v (%s)", err, out)
	}
	if out.String() != "hits 100000\n" {
		t.Fatalf("reader said %q", out)
	}
}

// TestScribbledSlots: garbage written over the table makes entries miss or
// get dropped, never crash a reader or hand out bytes of another key.
func TestScribbledSlots(t *testing.T) {
	p, _ := newStore(t, Config{MaxBytes: 1 << 20, Buckets: 16})
	for i := range 100 {
		p.Set(ctx, []byte(strconv.Itoa(i)), value(uint64(i), 50), SetOptions{})
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		off := headerSize + r.IntN(int(p.nbuckets)*bucketSize)
		if (off-headerSize)%bucketSize < bOffSlots {
			continue // locks and sequences: other tests cover those
		}
		p.mem[off] = byte(r.Uint32())
	}
	for i := range 100 {
		v, _, err := p.Get(ctx, []byte(strconv.Itoa(i)), nil)
		if err == nil && (!intact(v) || binary.LittleEndian.Uint64(v) != uint64(i)) {
			t.Fatalf("key %d: a value that is not its own", i)
		}
	}
	if err := p.Verify(ctx); err == nil {
		t.Fatal("Verify found nothing wrong in a scribbled table")
	}
}

// A pool of another layout (another ubkit's) is refused with an error that
// names both layouts, and is not taken for corruption.
func TestOpenOtherLayout(t *testing.T) {
	p, name := newStore(t, Config{MaxBytes: 1 << 20})
	binary.LittleEndian.PutUint32(p.mem[hOffVersion:], layoutVer+1)
	_, err := Open(name, Config{})
	if err == nil || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("layout %d", layoutVer+1)) {
		t.Fatalf("open of a pool of layout %d: %v; want an error naming the layout, not ErrCorrupt", layoutVer+1, err)
	}
}

func TestOpenBadSegment(t *testing.T) {
	p, name := newStore(t, Config{MaxBytes: 1 << 20})
	binary.LittleEndian.PutUint64(p.mem[hOffBuckets:], 3)
	if _, err := Open(name, Config{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open of a pool with 3 buckets: %v", err)
	}
}

// FuzzAttach: a segment whose header holds anything is refused or opened,
// never a panic.
func FuzzAttach(f *testing.F) {
	f.Add(make([]byte, 64))
	f.Add(binary.LittleEndian.AppendUint64(nil, magic))
	p, name := newStore(f, Config{MaxBytes: 1 << 20})
	orig := append([]byte(nil), p.mem[:headerSize]...)
	f.Fuzz(func(t *testing.T, hdr []byte) {
		copy(p.mem[:headerSize], orig)
		copy(p.mem[:min(len(hdr), hOffVerCtr)], hdr)
		ready, _ := p.seg.Uint32At(hOffReady)
		ready.Store(1)
		if q, err := Open(name, Config{}); err == nil {
			q.Get(ctx, []byte("k"), nil)
			q.Close()
		}
	})
}

// TestCreatorCloseKeepsName: when the process that created a pool closes
// it, the others still share one pool with whoever opens the name next
// (the name used to go with the creator, and the pool split in two).
func TestCreatorCloseKeepsName(t *testing.T) {
	creator, name := newStore(t, Config{MaxBytes: 1 << 20})
	user, err := Open(name, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	if _, err := creator.Set(ctx, []byte("before"), []byte("1"), SetOptions{}); err != nil {
		t.Fatal(err)
	}
	creator.Close()
	if _, err := user.Set(ctx, []byte("after"), []byte("2"), SetOptions{}); err != nil {
		t.Fatal(err)
	}
	next, err := Open(name, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	for _, k := range []string{"before", "after"} {
		if _, _, err := next.Get(ctx, []byte(k), nil); err != nil {
			t.Errorf("%s, written before the creator closed or after, is not in the pool a new process opens: %v", k, err)
		}
	}
	if _, err := next.Set(ctx, []byte("later"), []byte("3"), SetOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := user.Get(ctx, []byte("later"), nil); err != nil {
		t.Errorf("a write through the new opener is not seen by the old user: %v", err)
	}
}
