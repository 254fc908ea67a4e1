package testenv

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// ParkedGuard bounds WaitParked's wait: a goroutine that is not parked by
// then is hung, spinning, or was never started.
const ParkedGuard = 10 * time.Second

// WaitParked waits until n goroutines of this process are parked with
// every one of fns on their stack (functions as goroutine dumps name them,
// such as "shm.futexWait("; the runtime's own frames are not shown), so
// that a test acts on sleepers only once they sleep. A goroutine is parked
// in any state but running or runnable (a system call, the network
// poller, a channel, a lock); if state is not "", its state as goroutine
// dumps print it (such as "IO wait", "select", "syscall") must start with
// state. It fails the test after ParkedGuard.
func WaitParked(t testing.TB, n int, state string, fns ...string) {
	t.Helper()
	deadline := time.Now().Add(ParkedGuard)
	buf := make([]byte, 1<<16)
	for {
		size := runtime.Stack(buf, true)
		if size == len(buf) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		parked := 0
		for g := range strings.SplitSeq(string(buf[:size]), "\n\n") {
			if goroutineParked(g, state) && !slices.ContainsFunc(fns, func(fn string) bool { return !strings.Contains(g, fn) }) {
				parked++
			}
		}
		if parked >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %d goroutines parked (%q) in %s after %v, want %d", parked, state, strings.Join(fns, " and "), ParkedGuard, n)
		}
		// Polling: nothing tells when a goroutine has parked.
		time.Sleep(time.Millisecond)
	}
}

// goroutineParked reports whether the goroutine whose dump g is
// ("goroutine 7 [IO wait, 2 minutes]:" and its stack) is parked, in a
// state that starts with state unless that is "".
func goroutineParked(g, state string) bool {
	header, _, _ := strings.Cut(g, "\n")
	_, status, ok := strings.Cut(header, "[")
	if !ok {
		return false
	}
	status, _, _ = strings.Cut(status, "]")
	status, _, _ = strings.Cut(status, ",")
	return status != "running" && status != "runnable" && strings.HasPrefix(status, state)
}
