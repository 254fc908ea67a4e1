package shm

import (
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
