//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"
)

var testPoolConfig = PoolConfig{Classes: []PoolClass{{Size: 64, Count: 64}, {Size: 4096, Count: 16}, {Size: 1 << 16, Count: 4}}}

func newPool(t testing.TB, cfg PoolConfig) (*Segment, *Pool) {
	t.Helper()
	size, err := PoolSize(cfg)
	if err != nil {
		t.Fatal(err)
	}
	seg := newSegment(t, size)
	p, err := CreatePool(seg, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return seg, p
}

func TestPoolLoanReturn(t *testing.T) {
	seg, p := newPool(t, testPoolConfig)
	b, err := p.Loan(100)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Bytes()) != 4096 {
		t.Errorf("100-byte loan got %d bytes, want the 4096 class", len(b.Bytes()))
	}
	copy(b.Bytes(), "payload")
	h := b.Handle()
	enc, _ := h.MarshalBinary()
	var h2 Handle
	if err := h2.UnmarshalBinary(enc); err != nil || h2 != h {
		t.Fatalf("handle round trip: %v %v", h2, err)
	}
	// Another attachment of the same pool resolves the handle to the same bytes.
	q, err := OpenPool(seg, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := q.Resolve(h2)
	if err != nil || string(r.Bytes()[:7]) != "payload" {
		t.Fatalf("resolve: %q %v", r.Bytes()[:7], err)
	}
	if err := q.Return(h2); err != nil {
		t.Fatal(err)
	}
	if err := b.Return(); !errors.Is(err, ErrStaleHandle) {
		t.Errorf("double return: %v", err)
	}
	if _, err := p.Resolve(h); !errors.Is(err, ErrStaleHandle) {
		t.Errorf("resolve after return: %v", err)
	}
	bad := []Handle{
		{Segment: h.Segment + 1, Gen: h.Gen, Offset: h.Offset},
		{Segment: h.Segment, Gen: h.Gen, Offset: h.Offset + 8},
		{Segment: h.Segment, Gen: h.Gen, Offset: 1 << 60},
		{Segment: h.Segment, Gen: h.Gen, Offset: 0},
	}
	for _, h := range bad {
		if _, err := p.Resolve(h); !errors.Is(err, ErrInvalidHandle) {
			t.Errorf("resolve %v: %v", h, err)
		}
		if err := p.Return(h); !errors.Is(err, ErrInvalidHandle) {
			t.Errorf("return %v: %v", h, err)
		}
	}
	if _, err := p.Loan(1 << 20); !errors.Is(err, ErrTooLarge) {
		t.Errorf("loan larger than every class: %v", err)
	}
}

func TestPoolExhaustionAndFallback(t *testing.T) {
	_, p := newPool(t, testPoolConfig)
	var got []Buffer
	for {
		b, err := p.Loan(10)
		if errors.Is(err, ErrPoolExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b)
	}
	// Small loans fall back to larger classes when theirs is empty.
	if len(got) != 64+16+4 {
		t.Errorf("loaned %d buffers, want all %d", len(got), 64+16+4)
	}
	for _, s := range p.Stats() {
		if s.InUse != s.Count {
			t.Errorf("class %d: %d of %d in use", s.Size, s.InUse, s.Count)
		}
	}
	for _, b := range got {
		if err := b.Return(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range p.Stats() {
		if s.InUse != 0 {
			t.Errorf("class %d: %d in use after returning all", s.Size, s.InUse)
		}
	}
}

// TestPoolConcurrent hammers the free lists from many goroutines: a lost or
// doubly-loaned buffer (ABA) shows as two holders writing the same bytes.
func TestPoolConcurrent(t *testing.T) {
	_, p := newPool(t, PoolConfig{Classes: []PoolClass{{Size: 64, Count: 8}}})
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20000 {
				b, err := p.Loan(64)
				if errors.Is(err, ErrPoolExhausted) {
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				mark := uint64(g)<<32 | uint64(i)
				binary.LittleEndian.PutUint64(b.Bytes(), mark)
				if got := binary.LittleEndian.Uint64(b.Bytes()); got != mark {
					errc <- fmt.Errorf("buffer %v held twice", b.Handle())
					return
				}
				if err := b.Return(); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if s := p.Stats()[0]; s.InUse != 0 {
		t.Errorf("%d buffers in use at the end", s.InUse)
	}
}

func init() {
	// pool-loaner <segment> <ring offset> <n> <hold>: loans n buffers, writes
	// them, sends their handles on an SPSC ring at the offset; with hold it
	// then blocks forever (to be killed) holding its own loans.
	children["pool-loaner"] = func(args []string) error {
		seg, err := OpenSegment(args[0])
		if err != nil {
			return err
		}
		defer seg.Close()
		p, err := OpenPool(seg, 0)
		if err != nil {
			return err
		}
		off, _ := strconv.Atoi(args[1])
		r, err := OpenSPSC(seg, off)
		if err != nil {
			return err
		}
		prod, err := r.Producer(Wait{})
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(args[2])
		for i := range n {
			// The reader returns buffers as it goes, and each return
			// wakes the loan.
			b, err := p.LoanWait(context.Background(), 4000, Wait{})
			if err != nil {
				return err
			}
			fillRecord(b.Bytes()[:4000], uint64(i))
			h, _ := b.Handle().MarshalBinary()
			if err := prod.Send(context.Background(), h); err != nil {
				return err
			}
		}
		if args[3] == "hold" {
			for range 4 {
				if _, err := p.Loan(10); err != nil {
					return err
				}
			}
			prod.Send(context.Background(), []byte("held"))
			time.Sleep(time.Hour) // until the test kills it
		}
		return prod.Close()
	}
}

func poolWithRing(t *testing.T) (*Segment, *Pool, *SPSC, int) {
	size, _ := PoolSize(testPoolConfig)
	off := (size + cacheLine - 1) &^ (cacheLine - 1)
	seg := newSegment(t, off+SPSCSize(1024))
	p, err := CreatePool(seg, 0, testPoolConfig)
	if err != nil {
		t.Fatal(err)
	}
	r, err := CreateSPSC(seg, off, 1024)
	if err != nil {
		t.Fatal(err)
	}
	return seg, p, r, off
}

func TestPoolAcrossProcesses(t *testing.T) {
	seg, p, r, off := poolWithRing(t)
	cmd := startChild(t, "pool-loaner", seg.Name(), strconv.Itoa(off), "200", "")
	c, _ := r.Consumer(Wait{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; ; i++ {
		rec, err := c.NextWait(ctx)
		if errors.Is(err, ErrClosed) {
			if i != 200 {
				t.Fatalf("got %d handles, want 200", i)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var h Handle
		if err := h.UnmarshalBinary(rec); err != nil {
			t.Fatal(err)
		}
		c.Release()
		b, err := p.Adopt(h)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkRecord(b.Bytes()[:4000], uint64(i)); err != nil {
			t.Fatal(err)
		}
		if err := b.Return(); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, s := range p.Stats() {
		if s.InUse != 0 {
			t.Errorf("class %d: %d in use", s.Size, s.InUse)
		}
	}
}

// TestPoolReclaimDeadOwner kills a process holding loans: Reclaim returns its
// buffers, but not those it handed over and we adopted.
func TestPoolReclaimDeadOwner(t *testing.T) {
	for round := range 3 {
		seg, p, r, off := poolWithRing(t)
		cmd := startChild(t, "pool-loaner", seg.Name(), strconv.Itoa(off), "3", "hold")
		c, _ := r.Consumer(Wait{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var adopted []Buffer
		for {
			rec, err := c.NextWait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if string(rec) == "held" {
				break
			}
			var h Handle
			h.UnmarshalBinary(rec)
			b, err := p.Adopt(h)
			if err != nil {
				t.Fatal(err)
			}
			adopted = append(adopted, b)
		}
		cancel()
		c.Release()
		if n := p.Reclaim(); n != 0 {
			t.Fatalf("round %d: reclaimed %d buffers of a live process", round, n)
		}
		cmd.Process.Kill()
		cmd.Wait()
		if n := p.Reclaim(); n != 4 {
			t.Fatalf("round %d: reclaimed %d buffers, want the 4 the dead process held", round, n)
		}
		for _, b := range adopted {
			if err := b.Return(); err != nil {
				t.Fatalf("adopted buffer: %v", err)
			}
		}
		for _, s := range p.Stats() {
			if s.InUse != 0 {
				t.Errorf("class %d: %d in use", s.Size, s.InUse)
			}
		}
	}
}

func TestPoolCorrupt(t *testing.T) {
	t.Run("free list", func(t *testing.T) {
		_, p := newPool(t, testPoolConfig)
		p.freeHead(0).Store(1<<32 | 1000)
		if _, err := p.Loan(8); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("loan from a free list naming buffer 999 of 64: %v", err)
		}
		_, p = newPool(t, testPoolConfig)
		atomicU32(p.desc(0, 0), descOffNext).Store(5000)
		if _, err := p.Loan(8); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("loan through a link to buffer 4999: %v", err)
		}
		_, p = newPool(t, testPoolConfig)
		atomicU64(p.desc(0, 0), descOffState).Store(1<<32 | stateInUse)
		if _, err := p.Loan(8); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("loan of an in-use buffer on the free list: %v", err)
		}
	})
	t.Run("header on open", func(t *testing.T) {
		seg, p := newPool(t, testPoolConfig)
		binary.LittleEndian.PutUint64(p.mem[poolClassTable+classOffData:], 1<<40)
		if _, err := OpenPool(seg, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("OpenPool with a moved data area: %v", err)
		}
		binary.LittleEndian.PutUint32(p.mem[poolOffClasses:], 100)
		if _, err := OpenPool(seg, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("OpenPool with 100 classes: %v", err)
		}
	})
	t.Run("scribble while loaning", func(t *testing.T) {
		_, p := newPool(t, testPoolConfig)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go scribble(p.mem[:p.classes[0].data], stop, &wg)
		corrupt := 0
		rng := rand.New(rand.NewPCG(3, 4))
		var held []Buffer
		deadline := time.Now().Add(300 * time.Millisecond)
		for time.Now().Before(deadline) {
			callReturns(t, "pool operation", func() {
				if rng.IntN(2) == 0 || len(held) == 0 {
					b, err := p.Loan(rng.IntN(5000))
					if err == nil {
						clear(b.Bytes())
						held = append(held, b)
					} else if errors.Is(err, ErrCorrupt) {
						corrupt++
					}
					return
				}
				i := rng.IntN(len(held))
				if err := held[i].Return(); errors.Is(err, ErrCorrupt) {
					corrupt++
				}
				held = append(held[:i], held[i+1:]...)
				p.Reclaim()
			})
		}
		close(stop)
		wg.Wait()
		t.Logf("%d corruption errors", corrupt)
	})
}

// TestPoolLayoutOverflow: sizes and counts whose byte total wraps around 64
// bits must be refused, not laid out over a tiny region (review finding).
func TestPoolLayoutOverflow(t *testing.T) {
	cfg := PoolConfig{Classes: []PoolClass{{Size: 8192, Count: 1053896401}, {Size: 1<<32 - 4096, Count: 1<<31 - 1}, {Size: 1 << 32, Count: 1<<31 - 1}}}
	if _, err := PoolSize(cfg); err == nil {
		t.Fatal("a layout of more than 2^64 bytes was accepted")
	}
	if _, err := CreatePool(newSegment(t, 4096), 0, cfg); err == nil {
		t.Fatal("CreatePool accepted it")
	}
}

// TestPoolStaleReturnKeepsOwner: a stale Return by one process must not make
// it the owner of the buffer another process now holds; otherwise its death
// would let Reclaim free a live buffer (review finding).
func TestPoolStaleReturnKeepsOwner(t *testing.T) {
	seg, a := newPool(t, PoolConfig{Classes: []PoolClass{{Size: 64, Count: 1}}})
	attach := func(w uint64) *Pool {
		p, err := OpenPool(seg, 0)
		if err != nil {
			t.Fatal(err)
		}
		p.me = w // as if another process had attached
		return p
	}
	init, err := LookupProcess(1)
	if err != nil {
		t.Fatal(err)
	}
	dead := Process{PID: init.PID, Start: init.Start + 1}.word()
	b, c := attach(dead), attach(Self().word())
	stale, err := b.Loan(8)
	if err != nil {
		t.Fatal(err)
	}
	h := stale.Handle()
	if err := a.Return(h); err != nil {
		t.Fatal(err)
	}
	held, err := c.Loan(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Return(h); !errors.Is(err, ErrStaleHandle) {
		t.Fatalf("stale return: %v", err)
	}
	if _, err := b.Adopt(h); !errors.Is(err, ErrStaleHandle) {
		t.Fatalf("stale adopt: %v", err)
	}
	if n := a.Reclaim(); n != 0 {
		t.Fatalf("Reclaim freed %d buffers held by a live process", n)
	}
	if err := held.Return(); err != nil {
		t.Fatal(err)
	}
}

// TestPoolShare: a shared buffer belongs to no process: Reclaim leaves it,
// Shared lists it, and any attachment returns it by handle.
func TestPoolShare(t *testing.T) {
	seg, p := newPool(t, testPoolConfig)
	b, err := p.Loan(8)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Share(); err != nil {
		t.Fatal(err)
	}
	if err := b.Share(); err != nil {
		t.Fatalf("sharing twice: %v", err)
	}
	// As if the process that shared it had died: Reclaim must not care.
	if n := p.Reclaim(); n != 0 {
		t.Fatalf("reclaimed %d shared buffers", n)
	}
	var listed []Handle
	p.Shared(func(h Handle) { listed = append(listed, h) })
	if len(listed) != 1 || listed[0] != b.Handle() {
		t.Fatalf("Shared listed %v, want %v", listed, b.Handle())
	}
	other, err := OpenPool(seg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Return(b.Handle()); err != nil {
		t.Fatal(err)
	}
	if err := b.Share(); err == nil {
		t.Fatal("shared a returned buffer")
	}
	listed = nil
	p.Shared(func(h Handle) { listed = append(listed, h) })
	if len(listed) != 0 {
		t.Fatalf("Shared listed %v after the return", listed)
	}
	// Another process's buffer is not ours to share.
	c, _ := p.Loan(8)
	atomicU64(p.desc(c.class, c.idx), descOffOwner).Store(12345 << 32)
	if err := c.Share(); err == nil {
		t.Fatal("shared a buffer this process does not own")
	}
}
