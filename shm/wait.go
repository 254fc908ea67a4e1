package shm

import (
	"context"
	"runtime"
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

// DefaultSpin is how long WaitBlock and WaitYield spin before they sleep or
// yield when Wait.Spin is zero. Waking a thread sleeping on another CPU costs
// tens of microseconds on virtual machines, so a short spin catches a reply
// that is about to arrive far more cheaply.
const DefaultSpin = 50 * time.Microsecond

// Wait says how a blocked call waits. The zero value is WaitBlock with
// DefaultSpin.
type Wait struct {
	Mode WaitMode
	// Spin is how long to spin before yielding or sleeping. Zero means
	// DefaultSpin; a negative value means do not spin at all.
	Spin time.Duration
	// Room applies to an SPSC producer waiting for room: once it sleeps,
	// the consumer wakes it only when at least Room bytes are free (or
	// the claim's, if more), not at every release. A stream whose
	// consumer is the slower side then refills in large pieces, with a
	// wake-up each, instead of one per record. Zero: at every release.
	Room int
}

func (w Wait) spin() time.Duration {
	switch {
	case w.Spin == 0:
		return DefaultSpin
	case w.Spin < 0:
		return 0
	}
	return w.Spin
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
type waiter struct {
	ready     func() (bool, error)
	seq       *atomic.Uint32
	waiters   *atomic.Uint32
	fruitless *atomic.Uint32
	peer      func() error
}

const (
	// sleeperCount masks the sleepers in a waiters word with a generation.
	sleeperCount = 0xffff
	// sleeperGen registers a sleeper in such a word: one more sleeper, the
	// next generation.
	sleeperGen = 1<<16 | 1
)

// wait blocks until w.ready reports true or an error, ctx ends, or the peer
// check fails. It never sleeps longer than livenessInterval at a time.
func (s Wait) wait(ctx context.Context, w waiter) error {
	start := time.Now()
	spinFor := s.spin()
	onlyP := runtime.GOMAXPROCS(0) == 1
	lastCheck := start
	done := ctx.Done()
	check := func(now time.Time) error {
		if done != nil {
			select {
			case <-done:
				return ctx.Err()
			default:
			}
		}
		if now.Sub(lastCheck) >= livenessInterval {
			lastCheck = now
			if err := w.peer(); err != nil {
				// The peer may have published its last records before it
				// died or closed: report them first.
				if ok, rerr := w.ready(); ok || rerr != nil {
					return rerr
				}
				return err
			}
		}
		return nil
	}
	for i := 1; ; i++ {
		ok, err := w.ready()
		if ok || err != nil {
			return err
		}
		if i&63 != 0 {
			continue
		}
		if onlyP {
			// With one P (GOMAXPROCS=1, as in a pod with a 1-CPU limit) a
			// peer in this process runs only when we let it: every mode,
			// WaitSpin too, gives it the P now and then, or it would wait
			// for the scheduler to preempt us (10 ms).
			runtime.Gosched()
		} else if i >= 1024 && s.Mode != WaitSpin {
			// Past the first microseconds, give the CPU away now and then:
			// when the peer shares our CPU (an oversubscribed machine), a
			// pure spin would burn the time it needs to make progress.
			// With nothing else runnable, sched_yield returns at once.
			Yield()
		}
		now := time.Now()
		if err := check(now); err != nil {
			return err
		}
		if s.Mode != WaitSpin && now.Sub(start) >= spinFor {
			break
		}
	}
	if s.Mode == WaitYield {
		for {
			ok, err := w.ready()
			if ok || err != nil {
				return err
			}
			if onlyP {
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
		// the registration then always makes the FUTEX_WAIT return.
		v := w.seq.Load()
		w.waiters.Add(register)
		ok, err := w.ready()
		if ok || err != nil {
			w.waiters.Add(^uint32(0))
			return err
		}
		d := livenessInterval
		if dl, has := ctx.Deadline(); has {
			if r := time.Until(dl); r < d {
				d = max(r, time.Microsecond)
			}
		}
		futexWait(w.seq, v, d)
		w.waiters.Add(^uint32(0))
		if err := check(time.Now()); err != nil {
			return err
		}
	}
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
