package shm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h). The shared, not FUTEX_PRIVATE, forms.
const (
	futexOpWait = 0
	futexOpWake = 1
)

// futexWait sleeps while *addr == val, for at most d. The futex is shared
// (not FUTEX_PRIVATE) because the word lives in memory mapped by several
// processes. Spurious wake-ups are possible; callers re-check their condition.
func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait,
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes up to n waiters sleeping on addr and returns how many it
// woke, or -1 if the call failed.
func futexWake(addr *atomic.Uint32, n int) int {
	woken, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake,
		uintptr(n), 0, 0, 0)
	if errno != 0 {
		return -1
	}
	return int(woken)
}

// Yield gives the calling thread's CPU to another runnable thread, if any
// (sched_yield), for a polling loop that waits on another process. It is a
// raw system call: it returns at once when nothing else is runnable, and
// going through the runtime's system call entry would make it hand the
// goroutine's P to another thread.
func Yield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// futexWaiter is struct futex_waitv (linux/futex.h): one word of a
// futex_waitv call.
type futexWaiter struct {
	val      uint64
	uaddr    uint64
	flags    uint32
	reserved uint32
}

// futex2SizeU32 is FUTEX2_SIZE_U32: a 32-bit word. Without FUTEX2_PRIVATE,
// the futex is shared between processes.
const futex2SizeU32 = 0x02

// sleepAny is SleepAny's futex_waitv (Linux 5.16): it sleeps until one
// of words is woken, or no longer holds its value in vals, or d passes.
func sleepAny(words []*atomic.Uint32, vals []uint32, d time.Duration) error {
	ws := make([]futexWaiter, len(words))
	for i, w := range words {
		ws[i] = futexWaiter{val: uint64(vals[i]), uaddr: uint64(uintptr(unsafe.Pointer(w))), flags: futex2SizeU32}
	}
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		return fmt.Errorf("shm: futex_waitv: %w", err)
	}
	until := unix.NsecToTimespec(now.Nano() + int64(d)) // futex_waitv's timeout is absolute
	_, _, errno := unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&ws[0])), uintptr(len(ws)), 0,
		uintptr(unsafe.Pointer(&until)), unix.CLOCK_MONOTONIC, 0)
	runtime.KeepAlive(words)
	switch errno {
	case 0, unix.EAGAIN, unix.ETIMEDOUT, unix.EINTR:
		return nil // woken, a value differed, time's up, a signal
	case unix.ENOSYS, unix.EPERM: // no futex_waitv, or a seccomp filter's refusal
		return fmt.Errorf("%w: %w", ErrSleepAnyUnsupported, errno)
	}
	return fmt.Errorf("shm: futex_waitv: %w", errno) // EFAULT, EINVAL: a word not mapped, or misaligned
}
