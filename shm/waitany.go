package shm

import (
	"errors"
	"sync/atomic"
	"time"
)

// MaxSleepAny is the most words one SleepAny sleeps on (the kernel's
// limit for futex_waitv).
const MaxSleepAny = 128

// ErrSleepAnyUnsupported: the kernel has no futex_waitv (Linux 5.16 and
// later have it) or forbids it, or SleepAny got more than MaxSleepAny
// words.
var ErrSleepAnyUnsupported = errors.New("shm: no futex_waitv to sleep on several words (Linux 5.16 or later)")

// noWaitv is set once futex_waitv proved missing or forbidden.
var noWaitv atomic.Bool

// SleepAnyWorks reports whether SleepAny may work: false once a call
// found futex_waitv missing or forbidden, so that callers need not
// prepare a sleep that cannot be had.
func SleepAnyWorks() bool { return !noWaitv.Load() }

// SleepAny sleeps until one of words, each a futex word that other
// processes change and then Wake, is woken or no longer holds its value
// in vals (read before the caller's last look at its condition), or for
// at most d (at most a day). It returns early also on a signal: callers
// look at their condition again and sleep again. It is one futex_waitv
// call: the sleeper on a set of words (a consumer of several partitions)
// is woken by any of them and by nothing else.
func SleepAny(words []*atomic.Uint32, vals []uint32, d time.Duration) error {
	if len(words) == 0 || len(words) != len(vals) {
		return errors.New("shm: SleepAny wants as many values as words, at least one")
	}
	if len(words) > MaxSleepAny || noWaitv.Load() {
		return ErrSleepAnyUnsupported
	}
	err := sleepAny(words, vals, min(max(d, time.Microsecond), 24*time.Hour))
	if errors.Is(err, ErrSleepAnyUnsupported) {
		noWaitv.Store(true)
	}
	return err
}
