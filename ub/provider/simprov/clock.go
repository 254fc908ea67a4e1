package simprov

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Simulated links are timed to the microsecond, and Go's timers are not:
// on Linux an idle process sleeps in epoll with millisecond resolution, so
// a timer there fires up to about 1.1 ms late (a process busy scheduling
// goroutines, whose processors look at their timers as they do, often sees
// them within a few microseconds). A delayed operation therefore sleeps on a timer only
// until timerMargin before its time, and yields (checking the clock) for
// the rest: the yield lets every other goroutine run, so a waiter never
// starves its own peer, even with GOMAXPROCS=1, and the spin lasts at most
// the margin.

// Bounds of the margin, and how far above the latest lateness seen it stays.
const (
	minTimerMargin   = 100 * time.Microsecond
	maxTimerMargin   = 5 * time.Millisecond
	timerMarginGuard = 50 * time.Microsecond
	// startTimerMargin is the margin before any timer was seen: what a busy
	// process needs. Starting at what an idle one needs (1.1 ms) made every
	// wait under it a spin, which took a processor from the rest (the
	// 1 MiB bandwidth case fell by a tenth); an idle process's first late
	// timer raises it instead, and Stats show what that one cost.
	startTimerMargin = 200 * time.Microsecond
)

// timerMargin is how long before a deadline a wait stops sleeping on a
// timer: the latest lateness of this process's timers plus a guard. It
// rises at once to a later timer and falls slowly (1/32 of the gap per
// timer) when they come on time.
var timerMargin atomic.Int64

func init() { timerMargin.Store(int64(startTimerMargin)) }

// learnTimer records that a timer meant to fire at want fired at got.
func learnTimer(want, got time.Time) {
	need := min(max(got.Sub(want)+timerMarginGuard, minTimerMargin), maxTimerMargin)
	for {
		cur := time.Duration(timerMargin.Load())
		next := need
		if need < cur {
			next = cur - (cur-need)/32
		}
		if timerMargin.CompareAndSwap(int64(cur), int64(next)) {
			return
		}
	}
}

// sleepUntil sleeps on a timer until the margin before deadline, or until
// wake is ready (a nil wake never is). It reports false if woken, and does
// nothing when the deadline is within the margin already.
func sleepUntil(deadline time.Time, wake <-chan struct{}) bool {
	want := deadline.Add(-time.Duration(timerMargin.Load()))
	d := time.Until(want)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
		learnTimer(want, time.Now())
		return true
	case <-wake:
		t.Stop()
		return false
	}
}

// spinFinal is the last stretch before a deadline that a wait spins on the
// clock without yielding: a yield costs 0.2-0.5 µs here, and the stretch is
// too short to matter to anyone waiting for the processor.
const spinFinal = 2 * time.Microsecond

// yieldUntil yields the processor until spinFinal before deadline, and
// spins on the clock for the rest, unless stop reports true first (checked
// between yields; a nil stop never does). It returns the time it saw the
// deadline pass (a post made at once can use it rather than read the clock
// again), or zero if it stopped first. It is not shm.Backoff, the ladder
// of waits for a peer: what it waits for is a time it knows, which no
// peer brings sooner, so it has no spin to give up and nowhere to park
// (the timer before it did the parking).
func yieldUntil(deadline time.Time, stop func() bool) time.Time {
	for {
		now := time.Now()
		left := deadline.Sub(now)
		if left <= 0 {
			return now
		}
		if left <= spinFinal {
			continue
		}
		if stop != nil && stop() {
			return time.Time{}
		}
		runtime.Gosched()
	}
}
