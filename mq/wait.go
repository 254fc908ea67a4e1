package mq

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// parkFor bounds every sleep: a wake-up that never comes (its waker died)
// costs at most this, and the sleeper then looks again (at a writer's
// liveness, at readers that died).
const parkFor = 20 * time.Millisecond

// park sleeps on word, one of the partition's futex words, until ready may
// hold, for at most parkFor or until ctx ends, and returns ctx.Err().
// sleepers is the count of sleepers on word that wakers look at (see
// wake).
func park(ctx context.Context, word, sleepers *atomic.Uint32, ready func() bool) error {
	sctx, cancel := context.WithTimeout(ctx, parkFor)
	defer cancel()
	sleepOn(sctx, word, sleepers, ready)
	return ctx.Err()
}

// sleepOn is park without its bound: the caller's ctx must end (a consumer
// group bounds its sleeps by its own deadlines).
func sleepOn(ctx context.Context, word, sleepers *atomic.Uint32, ready func() bool) {
	sleepers.Add(1) // the waker takes it
	v := word.Load()
	if ready() {
		return
	}
	shm.Wait{Spin: -1}.Until(ctx, word, func(x uint32) bool { return x != v })
}

// sleepAny is shm.SleepAny (tests: a kernel without futex_waitv).
var sleepAny = shm.SleepAny

// sleepOnAny is sleepOn on several words at once (shm.SleepAny: one
// futex_waitv), with sleepers[i] the count of sleepers on words[i]: it
// returns when one of them is woken or changes, ready holds or ctx ends.
// It reports false, having slept on nothing, if the kernel cannot
// (shm.ErrSleepAnyUnsupported): the caller sleeps on a word they all
// wake. A sleep it ends early leaves its other registrations counted:
// their next wake costs their waker one system call.
func sleepOnAny(ctx context.Context, words, sleepers []*atomic.Uint32, ready func() bool) bool {
	if len(words) > shm.MaxSleepAny || !shm.SleepAnyWorks() {
		return false
	}
	vals := make([]uint32, len(words))
	for i, w := range words {
		sleepers[i].Add(1) // the waker takes it
		vals[i] = w.Load()
	}
	if ready() {
		return true
	}
	for ctx.Err() == nil {
		d := parkFor
		if dl, ok := ctx.Deadline(); ok {
			d = min(d, time.Until(dl))
		}
		if err := sleepAny(words, vals, d); err != nil {
			return false
		}
		for i, w := range words {
			if w.Load() != vals[i] {
				return true
			}
		}
		if ready() {
			return true
		}
	}
	return true
}

// wake wakes the sleepers park put on word. The first waker takes the
// count (to 0), so the wakes that follow while the sleepers get up make no
// system call, and a sleeper that died asleep costs one wake-up, not one
// per call; a sleeper registers again before every sleep.
func wake(word, sleepers *atomic.Uint32) {
	if sleepers.Load() != 0 && sleepers.Swap(0) != 0 {
		word.Add(1)
		shm.Wake(word)
	}
}
