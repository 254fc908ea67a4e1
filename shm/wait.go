package shm

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// WaitMode selects how a blocked ring call waits for its peer.
type WaitMode uint8

const (
	// WaitBlock spins for Wait.Spin, then sleeps on a futex until the peer
	// wakes it. Each sleep is bounded (FUTEX_WAIT always has a timeout) so a
	// dead peer is noticed. The default.
	WaitBlock WaitMode = iota
	// WaitSpin busy-spins until the call can proceed. Lowest latency; burns a
	// core while waiting.
	WaitSpin
	// WaitYield spins for Wait.Spin, then spins while yielding the CPU to other
	// threads between checks.
	WaitYield
)

// Wait says how a blocked call waits. The zero value is WaitBlock with
// DefaultSpin.
type Wait struct {
	Mode WaitMode
	// Spin is how long to spin (climbing the Backoff ladder) before
	// yielding or sleeping. Zero means DefaultSpin; a negative value means
	// park at the ladder's first checkpoint (64 looks).
	Spin time.Duration
	// Room applies to an SPSC producer waiting for room: once it sleeps,
	// the consumer wakes it only when at least Room bytes are free (or
	// the claim's, if more), not at every release. A stream whose
	// consumer is the slower side then refills in large pieces, with a
	// wake-up each, instead of one per record. Zero: at every release.
	Room int
}

// The ladder a waiting goroutine climbs (see Backoff).
const (
	// DefaultSpin is how long a wait looks before it parks (Backoff.Spin,
	// Wait.Spin) when none is given. Waking a thread that sleeps on
	// another CPU costs tens of microseconds on a virtual machine (a futex
	// ping-pong between two vCPUs: about 70 µs a round trip, so 35 µs a
	// wake-up), so a wait that ends within 50 µs costs less spent looking
	// than asleep; one that lasts longer is better off giving the CPU away.
	DefaultSpin = 50 * time.Microsecond
	// DefaultYield is from when on a wait also gives its thread's CPU to
	// other threads (Backoff.Yield) when none is given. A peer that runs
	// answers within a few microseconds (a cache line crosses between
	// vCPUs in about 150 ns), so a wait that lasts longer probably waits
	// for a peer that does not run, perhaps because it shares this CPU
	// (an oversubscribed machine), and spinning would burn the time it
	// needs. With nothing else runnable, sched_yield returns at once.
	DefaultYield = 10 * time.Microsecond
	// backoffEvery is how many looks a Backoff lets pass between two
	// checkpoints, where it reads the clock and yields: a look costs a few
	// nanoseconds (a load of a line the peer will write), a clock read
	// about 25 ns and a yield more, so at every look they would slow the
	// looking down several times; every 64 looks (about 1 µs) they cost
	// a few percent, and a checkpoint still comes within a microsecond.
	backoffEvery = 64
)

// Backoff paces a goroutine that waits for another thread or process by
// looking at a condition again and again: it is ubkit's one waiting
// ladder, the spin phase of every Wait and of SeqLock, for callers that
// park in a place of their own (Go's netpoller, a timer) as well. The
// caller looks, and calls Pause each time the look found nothing; Pause
// reports false once the caller should stop looking and block. The rungs,
// counted from the first Pause:
//
//  1. Every look but each 64th: look again at once (see backoffEvery).
//  2. Every 64th look, a checkpoint: with GOMAXPROCS 1, runtime.Gosched,
//     because a peer goroutine of this process runs only when the one P
//     is handed over (else it waits up to 10 ms for the scheduler to
//     preempt the looker). From Gosched on (if set), runtime.Gosched with
//     more Ps too, for a caller whose peer may need goroutines of its own
//     process to run first (a reader whose write readied the goroutine
//     that answers).
//  3. From Yield (DefaultYield) on, each checkpoint also calls sched_yield
//     (except with GOMAXPROCS 1, where runtime.Gosched already hands the P
//     over and yielding the thread would not run the peer goroutine).
//  4. From Spin (DefaultSpin) on, Pause reports false, and goes on
//     reporting false until Reset: the caller parks, and parks again if
//     it wakes without what it waited for.
//     ubkit's parked waits (the futex sleeps of Wait and SeqLock) sleep at
//     most 20 ms at a time and look at their peer's liveness between
//     sleeps, so a dead peer is noticed within about two sleeps (the
//     package promises 100 ms) and no wait hangs on one.
//
// The zero value is the default ladder. A Backoff is not safe for
// concurrent use: each waiting goroutine has its own.
type Backoff struct {
	// Spin is how long to look before parking. Zero means DefaultSpin; a
	// negative value parks at the first checkpoint.
	Spin time.Duration
	// Gosched, if positive, is from when on every checkpoint runs
	// runtime.Gosched even with more than one P. Zero: only with
	// GOMAXPROCS 1 (then from the start).
	Gosched time.Duration
	// Yield is from when on every checkpoint calls sched_yield. Zero means
	// DefaultYield; a negative value never yields.
	Yield time.Duration

	looks  int
	start  time.Time
	now    time.Time // the clock at the latest checkpoint
	onlyP  bool
	parked bool // the spin is over: Pause reports false until Reset
}

// Pause paces the look that just found nothing and reports whether to look
// again (true) or to park (false).
func (b *Backoff) Pause() bool {
	if b.parked {
		return false
	}
	b.looks++
	if b.looks&(backoffEvery-1) != 0 && b.looks != 1 {
		return true
	}
	return b.rung()
}

// Reset starts the ladder again from its first rung at the next Pause.
func (b *Backoff) Reset() { b.looks, b.parked = 0, false }

// rung is Pause's first look (the ladder's start) or a checkpoint.
func (b *Backoff) rung() bool {
	if b.looks == 1 {
		b.start = time.Now()
		b.now = b.start
		b.onlyP = runtime.GOMAXPROCS(0) == 1
		return true
	}
	return b.checkpoint()
}

// atCheckpoint reports whether the latest Pause was a checkpoint (b.now
// is then fresh).
func (b *Backoff) atCheckpoint() bool { return b.looks&(backoffEvery-1) == 0 }

func (b *Backoff) checkpoint() bool {
	b.now = time.Now()
	waited := b.now.Sub(b.start)
	if b.onlyP || (b.Gosched > 0 && waited >= b.Gosched) {
		runtime.Gosched()
	}
	yield := b.Yield
	if yield == 0 {
		yield = DefaultYield
	}
	if !b.onlyP && yield > 0 && waited >= yield {
		Yield()
	}
	spin := b.Spin
	if spin == 0 {
		spin = DefaultSpin
	}
	b.parked = waited >= spin
	return !b.parked
}

// backoff is the ladder of w's spin phase.
func (s Wait) backoff() Backoff {
	if s.Mode == WaitSpin {
		return Backoff{Spin: math.MaxInt64, Yield: -1}
	}
	return Backoff{Spin: s.Spin}
}

// waiter is the shared state a blocked call needs: the condition, the futex
// word its peer bumps when it makes progress, the count of sleepers the peer
// checks before waking, and a check for a dead or departed peer.
//
// A sleeper that is killed never takes itself off the count, and wakers
// would then make a system call at every wake-up for good. Where that
// matters (many wakers, such as a pool's returns), fruitless is set: the
// count's word is then sleepers (low 16 bits) plus a generation (high 16
// bits) that every registration advances, and a waker whose FUTEX_WAKE
// woke nobody notes the word in fruitless. While the word stays so, no
// sleeper came or went since, so every sleeper it counts is dead: a live
// one loads the sequence before it registers, so that wake-up made its
// FUTEX_WAIT return at once, and it registers anew (a new word) before it
// sleeps again. Wakers skip the system call then.
//
// peerEarly makes the wait check its peer at its first checkpoint (64
// looks) and again when its spin ends, before its first sleep, besides
// every livenessInterval: for waiters whose peer may well be dead (a lock
// holder, which holds for a microsecond when alive) and whose patience may
// be shorter than livenessInterval.
// deadline, if set, ends the wait with errPatience (after a last look at
// the peer). gosched is the ladder's Backoff.Gosched.
//
// parkHere, if set, says before each sleep whether the peer to wait for is
// a goroutine of this process; the sleep is then on a channel that the
// peer's wake-up closes (localWake), in Go's scheduler, and not on the
// futex. A goroutine asleep on a futex holds its thread, and its P until
// the runtime's monitor takes the P back, while a peer goroutine that the
// scheduler preempted needs a P to go on: the in-process waiters of a
// lock whose holder had been preempted slept for milliseconds each on the
// futex (about 5 ms on average, in cache's BenchmarkPoolMixed).
type waiter struct {
	ready     func() (bool, error)
	seq       *atomic.Uint32
	waiters   *atomic.Uint32
	fruitless *atomic.Uint32
	peer      func() error
	peerEarly bool
	deadline  time.Time
	gosched   time.Duration
	parkHere  func() bool
}

// errPatience ends a wait whose waiter.deadline passed.
var errPatience = errors.New("shm: waited past the deadline")

const (
	// sleeperCount masks the sleepers in a waiters word with a generation.
	sleeperCount = 0xffff
	// sleeperGen registers a sleeper in such a word: one more sleeper, the
	// next generation.
	sleeperGen = 1<<16 | 1
)

// wait blocks until w.ready reports true or an error, ctx ends, the peer
// check fails or w.deadline passes. It spins on the Backoff ladder, then
// yields (WaitYield) or sleeps on the futex (WaitBlock), never longer than
// livenessInterval at a time.
func (s Wait) wait(ctx context.Context, w waiter) error {
	if err := s.waitLoop(ctx, w); err != errReadyNow {
		return err
	}
	return nil
}

// errReadyNow ends a waitLoop whose condition held at a look made while
// checking the peer.
var errReadyNow = errors.New("shm: ready")

func (s Wait) waitLoop(ctx context.Context, w waiter) error {
	b := s.backoff()
	b.Gosched = w.gosched
	var lastCheck time.Time
	done := ctx.Done()
	// peerGone is the peer check's error, unless the peer published what
	// the caller waits for before it died or closed: then the condition
	// holds, and the wait ends with errReadyNow (a ready that succeeded
	// may have taken something, a lock or a buffer: it must not run
	// again). A look that ends the wait with an error (the ring is closed
	// and empty) ends it with that error, as any other look does: the
	// callers return what wait returns, so errReadyNow would turn it into
	// success with nothing taken.
	peerGone := func() error {
		if err := w.peer(); err != nil {
			if ok, rerr := w.ready(); rerr != nil {
				return rerr
			} else if ok {
				return errReadyNow
			}
			return err
		}
		return nil
	}
	check := func(now time.Time) error {
		if done != nil {
			select {
			case <-done:
				return ctx.Err()
			default:
			}
		}
		if lastCheck.IsZero() {
			lastCheck = b.start
		}
		if now.Sub(lastCheck) >= livenessInterval {
			lastCheck = now
			if err := peerGone(); err != nil {
				return err
			}
		}
		if !w.deadline.IsZero() && !now.Before(w.deadline) {
			// Before giving up on a peer, make sure it still lives.
			if err := peerGone(); err != nil {
				return err
			}
			return errPatience
		}
		return nil
	}
	for {
		ok, err := w.ready()
		if ok || err != nil {
			return err
		}
		again := b.Pause()
		if b.atCheckpoint() {
			if w.peerEarly && b.looks == backoffEvery {
				lastCheck = b.now
				if err := peerGone(); err != nil {
					return err
				}
			}
			if err := check(b.now); err != nil {
				return err
			}
		}
		if !again {
			break
		}
	}
	if w.peerEarly {
		lastCheck = b.now
		if err := peerGone(); err != nil {
			return err
		}
	}
	if s.Mode == WaitYield {
		for {
			ok, err := w.ready()
			if ok || err != nil {
				return err
			}
			if b.onlyP {
				runtime.Gosched()
			} else {
				Yield()
			}
			if err := check(time.Now()); err != nil {
				return err
			}
		}
	}
	register := uint32(1)
	if w.fruitless != nil {
		register = sleeperGen
	}
	for {
		// The sequence before the registration: a wake-up that follows
		// the registration then always makes the FUTEX_WAIT return. A
		// sleeper in this process takes its channel before it registers,
		// so that a wake-up after the registration closes that channel.
		v := w.seq.Load()
		var here *localSleep
		if w.parkHere != nil && w.parkHere() {
			here = localChan()
		}
		w.waiters.Add(register)
		ok, err := w.ready()
		if ok || err != nil {
			w.waiters.Add(^uint32(0))
			if here != nil {
				here.done()
			}
			return err
		}
		if here != nil && !w.parkHere() {
			// The holder changed to another process since the channel
			// was taken (ours let go before we registered, and theirs
			// took over before the look): its wake-up goes to the futex,
			// so sleep there, on the sequence read before registering.
			here.done()
			here = nil
		}
		d := livenessInterval
		if dl, has := ctx.Deadline(); has {
			if r := time.Until(dl); r < d {
				d = max(r, time.Microsecond)
			}
		}
		if !w.deadline.IsZero() {
			if r := time.Until(w.deadline); r < d {
				d = max(r, time.Microsecond)
			}
		}
		if here != nil {
			t := time.NewTimer(d)
			select {
			case <-here.ch:
			case <-t.C:
			case <-done:
			}
			t.Stop()
			here.done()
		} else {
			futexWait(w.seq, v, d)
		}
		w.waiters.Add(^uint32(0))
		if err := check(time.Now()); err != nil {
			return err
		}
	}
}

// Until waits, with w's strategy, until cond reports true for word's value
// or ctx ends (then it returns ctx.Err()). word is normally in a segment,
// where another process changes it and then calls Wake; asleep, Until
// also looks again at least every 20 ms, so a change made without Wake is
// seen too, only later. For rare events (a structure made ready): Wake
// makes a system call each time, where the rings and SeqLock count their
// sleepers and make one only when somebody sleeps.
func (s Wait) Until(ctx context.Context, word *atomic.Uint32, cond func(uint32) bool) error {
	var sleepers atomic.Uint32 // nobody else reads it: Wake always wakes
	return s.wait(ctx, waiter{
		ready:   func() (bool, error) { return cond(word.Load()), nil },
		seq:     word,
		waiters: &sleepers,
		peer:    func() error { return nil },
	})
}

// Wake wakes every goroutine, of any process, that sleeps in Wait.Until
// on word. Call it after changing word.
func Wake(word *atomic.Uint32) { futexWake(word, 1<<30) }

// localWaits is the channel that the next localWake closes, for the
// goroutines of this process asleep in Go's scheduler (waiter.parkHere).
// There is one for the process, not one per word: two mappings of a
// segment put one word at two addresses, and a waker must wake a sleeper
// that came through the other. Such sleeps are rare (a holder of this
// process that has not run for a whole spin), and a sleeper woken for
// another word looks again and sleeps again.
var localWaits struct {
	sync.Mutex
	cur *localSleep
}

// localSleep is one channel of localWaits and how many goroutines hold it
// to sleep on: a goroutine that took it and then did not sleep (its last
// look found what it waited for, or the holder moved to another process)
// lets it go, so that a wake-up then reports that it woke nobody.
type localSleep struct {
	ch      chan struct{}
	holders int
}

// localChan is the channel the next localWake closes. The caller sleeps
// on s.ch and then calls s.done, or calls s.done without sleeping.
func localChan() *localSleep {
	localWaits.Lock()
	defer localWaits.Unlock()
	if localWaits.cur == nil {
		localWaits.cur = &localSleep{ch: make(chan struct{})}
	}
	localWaits.cur.holders++
	return localWaits.cur
}

// done says that the caller no longer sleeps on s.
func (s *localSleep) done() {
	localWaits.Lock()
	s.holders--
	localWaits.Unlock()
}

// localWake wakes the goroutines of this process asleep in Go's scheduler,
// and reports whether there were any.
func localWake() bool {
	localWaits.Lock()
	defer localWaits.Unlock()
	s := localWaits.cur
	if s == nil {
		return false
	}
	close(s.ch)
	localWaits.cur = nil
	return s.holders > 0
}

// wake wakes sleepers on seq if there are any. Callers publish their progress
// before calling it. With fruitless (see waiter) it skips sleepers that are
// known dead.
func wake(seq, waiters, fruitless *atomic.Uint32, all bool) {
	w := waiters.Load()
	if fruitless == nil {
		if w == 0 {
			return
		}
	} else if w&sleeperCount == 0 || w == fruitless.Load() {
		return
	}
	seq.Add(1)
	n := 1
	if all {
		n = 1 << 30
	}
	if futexWake(seq, n) == 0 && fruitless != nil {
		fruitless.Store(w)
	}
}
