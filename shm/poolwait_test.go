//go:build linux

package shm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPoolLoanWait: a loan on an exhausted pool waits, without spinning,
// until another mapping of the segment returns a buffer, and ends with
// its context otherwise; Loan still fails at once.
func TestPoolLoanWait(t *testing.T) {
	cfg := PoolConfig{Classes: []PoolClass{{Size: 64, Count: 4}}}
	seg, p := newPool(t, cfg)
	var held []Buffer
	for range 4 {
		b, err := p.Loan(64)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	if _, err := p.Loan(64); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("Loan of an exhausted pool: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.LoanWait(ctx, 64, Wait{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LoanWait past its deadline: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := p.LoanWait(ctx, 64, Wait{})
		done <- err
	}()
	waitForSleepers(t, p, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("LoanWait cancelled: %v", err)
	}

	// Another mapping (another virtual address, as in another process)
	// returns a buffer: the sleeping loan wakes and gets it.
	seg2, err := OpenSegment(seg.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer seg2.Close()
	other, err := OpenPool(seg2, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := sleepingLoan(t, p)
	// Asleep, it sleeps on the futex: it does not spin.
	waitParked(t, 1, "syscall", "shm.futexWait(")
	if err := other.Return(held[0].Handle()); err != nil {
		t.Fatal(err)
	}
	b := <-got
	if h, old := b.Handle(), held[0].Handle(); h.Offset != old.Offset || h.Gen == old.Gen {
		t.Errorf("the woken loan got %v, want the returned buffer %v in its next generation", h, old)
	}
	b.Return()
	for _, b := range held[1:] {
		b.Return()
	}
}

// sleepingLoan starts a LoanWait of 64 bytes and waits until it sleeps;
// the channel gets the buffer it loans.
func sleepingLoan(t *testing.T, p *Pool) <-chan Buffer {
	t.Helper()
	got := make(chan Buffer, 1)
	go func() {
		b, err := p.LoanWait(context.Background(), 64, Wait{})
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	waitForSleepers(t, p, 1)
	return got
}

// waitForSleepers waits until n loans sleep on p's futex.
func waitForSleepers(t *testing.T, p *Pool, n uint32) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); p.freeWaiters.Load()&sleeperCount < n; {
		if time.Now().After(end) {
			t.Fatalf("%d loans asleep, want %d", p.freeWaiters.Load()&sleeperCount, n)
		}
		// Polling: nothing tells when a loan has registered as a sleeper.
		time.Sleep(time.Millisecond)
	}
}

// TestPoolLoanWaitAllAtOnce: loans waiting in several goroutines while the
// holder returns every buffer at once all get one, none fails.
func TestPoolLoanWaitAllAtOnce(t *testing.T) {
	cfg := PoolConfig{Classes: []PoolClass{{Size: 64, Count: 8}}}
	_, p := newPool(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for round := range 20 {
		var held []Buffer
		for range 8 {
			b, err := p.LoanWait(ctx, 64, Wait{})
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			held = append(held, b)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				b, err := p.LoanWait(ctx, 64, Wait{})
				if err != nil {
					errs <- err
					return
				}
				b.Return()
			})
		}
		waitForSleepers(t, p, 8)
		for _, b := range held {
			b.Return()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

// TestPoolLoanWaitReclaimsDead: a loan waiting on buffers a dead process
// holds gets one: the wait reclaims them.
func TestPoolLoanWaitReclaimsDead(t *testing.T) {
	cfg := PoolConfig{Classes: []PoolClass{{Size: 64, Count: 1}}}
	seg, p := newPool(t, cfg)
	q, err := OpenPool(seg, 0)
	if err != nil {
		t.Fatal(err)
	}
	init, err := LookupProcess(1)
	if err != nil {
		t.Fatal(err)
	}
	q.me = Process{PID: init.PID, Start: init.Start + 1}.word() // as if it had died
	if _, err := q.Loan(64); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := p.LoanWait(ctx, 64, Wait{})
	if err != nil {
		t.Fatalf("LoanWait with the only buffer held by a dead process: %v", err)
	}
	b.Return()
}

// TestPoolReclaimInterrupted: a buffer a Reclaim left half taken back (its
// process died between the owner swap and the state swap: in use, owner 0)
// is taken back by the next Reclaim instead of staying in use for good.
func TestPoolReclaimInterrupted(t *testing.T) {
	_, p, b := oneBufferLoaned(t)
	atomicU64(p.desc(b.class, b.idx), descOffOwner).Store(0)
	if n := p.Reclaim(); n != 1 {
		t.Fatalf("Reclaim took back %d buffers, want the half reclaimed one", n)
	}
	if err := b.Return(); !errors.Is(err, ErrStaleHandle) {
		t.Errorf("the dead loan's handle: %v, want stale", err)
	}
	if _, err := p.Loan(64); err != nil {
		t.Fatalf("loan after the reclaim: %v", err)
	}
}

// TestPoolReturnAfterClose: a buffer returned through an attachment after
// its Close goes to the shared list, where other attachments find it,
// not to a local cache nobody will empty.
func TestPoolReturnAfterClose(t *testing.T) {
	seg, p, b := oneBufferLoaned(t)
	p.Close()
	if err := b.Return(); err != nil {
		t.Fatal(err)
	}
	other, err := OpenPool(seg, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Loan(64); err != nil {
		t.Fatalf("loan of the buffer returned after Close: %v", err)
	}
}

// TestPoolReturnWakesLoan: a return wakes a sleeping loan through the
// pool's futex word, rather than leaving it to its next timeout. (The
// sleeper leaves the count for an instant every 20 ms, when its futex wait
// times out; a return just then need not wake it, hence a few tries.)
func TestPoolReturnWakesLoan(t *testing.T) {
	_, p, held := oneBufferLoaned(t)
	for range 5 {
		got := sleepingLoan(t, p)
		seq := p.freeSeq.Load()
		if err := held.Return(); err != nil {
			t.Fatal(err)
		}
		held = <-got
		if p.freeSeq.Load() != seq {
			held.Return()
			return
		}
	}
	t.Fatal("no return moved the futex word a loan sleeps on")
}

// oneBufferLoaned makes a pool of one 64-byte buffer and loans it.
func oneBufferLoaned(t *testing.T) (*Segment, *Pool, Buffer) {
	t.Helper()
	seg, p := newPool(t, PoolConfig{Classes: []PoolClass{{Size: 64, Count: 1}}})
	b, err := p.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	return seg, p, b
}

// TestPoolCloseAfterUnmap: closing an attachment with nothing cached
// touches no shared memory, so a second Close after the segment was
// unmapped (a double Close of a structure built on the pool) is harmless.
func TestPoolCloseAfterUnmap(t *testing.T) {
	seg, p := newPool(t, testPoolConfig)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	seg.Close()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

func init() {
	// pool-waiter <segment>: a loan that waits on the pool at the start of
	// the segment (exhausted), to be killed asleep.
	children["pool-waiter"] = func(args []string) error {
		seg, err := OpenSegment(args[0])
		if err != nil {
			return err
		}
		defer seg.Close()
		p, err := OpenPool(seg, 0)
		if err != nil {
			return err
		}
		_, err = p.LoanWait(context.Background(), 64, Wait{})
		return err
	}
}

// TestPoolDeadSleeperCostsNoWakeups: a loan killed while it waits leaves
// itself counted among the sleepers; returns then make at most one
// fruitless wake-up (each bumps the free sequence), not one each, and a
// live loan that waits after it is still woken.
func TestPoolDeadSleeperCostsNoWakeups(t *testing.T) {
	cfg := PoolConfig{Classes: []PoolClass{{Size: 64, Count: 2}}}
	seg, p := newPool(t, cfg)
	var held []Buffer
	for range 2 {
		b, err := p.Loan(64)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
	}
	waiter := startChild(t, "pool-waiter", seg.Name())
	waitForSleepers(t, p, 1)
	waiter.Process.Kill()
	waiter.Wait()
	seq := p.freeSeq.Load()
	const returns = 100
	for i := range returns {
		if err := held[0].Return(); err != nil {
			t.Fatal(err)
		}
		b, err := p.Loan(64)
		if err != nil {
			t.Fatalf("return %d: %v", i, err)
		}
		held[0] = b
	}
	if n := p.freeSeq.Load() - seq; n > 1 {
		t.Errorf("%d returns with only a dead loan counted as waiting made %d wake-ups, want at most 1", returns, n)
	}
	// A live loan waits beside the dead one: a return wakes it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		b, err := p.LoanWait(ctx, 64, Wait{})
		if err == nil {
			err = b.Return()
		}
		got <- err
	}()
	waitForSleepers(t, p, 2)
	seq = p.freeSeq.Load()
	if err := held[0].Return(); err != nil {
		t.Fatal(err)
	}
	if p.freeSeq.Load() == seq {
		t.Error("a return with a live loan waiting woke nobody")
	}
	if err := <-got; err != nil {
		t.Fatalf("the live loan: %v", err)
	}
	held[1].Return()
}

// TestPoolLoanWaitReclaimsRarely: loans that wait long on a pool reclaim
// dead processes' buffers (which reads every descriptor) at most once a
// second per attachment, not every 20 ms each.
func TestPoolLoanWaitReclaimsRarely(t *testing.T) {
	cfg := PoolConfig{Classes: []PoolClass{{Size: 64, Count: 1}}}
	_, p := newPool(t, cfg)
	b, err := p.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Return()
	var reclaims atomic.Int64
	loanWaitReclaimHook = func() { reclaims.Add(1) }
	defer func() { loanWaitReclaimHook = nil }()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if _, err := p.LoanWait(ctx, 64, Wait{}); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("LoanWait on an exhausted pool: %v", err)
			}
		})
	}
	wg.Wait()
	if n := reclaims.Load(); n > 1 {
		t.Errorf("4 loans waiting 300 ms reclaimed %d times, want at most once", n)
	}
}
