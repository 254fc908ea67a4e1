package shm

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// MaxSleepAny is the most words one SleepAny sleeps on (the kernel's
// limit for futex_waitv).
const MaxSleepAny = 128

// ErrSleepAnyUnsupported: the kernel has no futex_waitv (Linux 5.16 and
// later have it), or SleepAny got more than MaxSleepAny words.
var ErrSleepAnyUnsupported = errors.New("shm: no futex_waitv to sleep on several words (Linux 5.16 or later)")

var noWaitv atomic.Bool

// SleepAny sleeps until one of words, each a futex word that other
// processes change and then Wake, is woken or no longer holds its value
// in vals (read before the caller's last look at its condition), or for
// at most d. It returns early also on a signal: callers look at their
// condition again and sleep again. It is one futex_waitv call: the
// sleeper of a set of words (a consumer of several partitions) is woken
// by any of them and by nothing else.
func SleepAny(words []*atomic.Uint32, vals []uint32, d time.Duration) error {
	if len(words) == 0 || len(words) != len(vals) {
		return errors.New("shm: SleepAny wants as many values as words, at least one")
	}
	if len(words) > MaxSleepAny || noWaitv.Load() {
		return ErrSleepAnyUnsupported
	}
	switch errno := futexWaitv(words, vals, max(d, time.Microsecond)); errno {
	case 0, unix.EAGAIN, unix.ETIMEDOUT, unix.EINTR:
		return nil
	case unix.ENOSYS:
		noWaitv.Store(true)
		return ErrSleepAnyUnsupported
	default: // EFAULT or EINVAL: a word not mapped, or misaligned
		return fmt.Errorf("shm: futex_waitv: %w", errno)
	}
}
