package transport

import (
	"runtime"
	"syscall"
	"time"
)

// A reader with nothing to read (an empty ring on the shm path, an empty
// receive queue on the ub path) may poll before it blocks (in Go's
// netpoller on the shm path's notification pipe, in the provider's
// completion wait on the ub path): waking a thread that sleeps on another
// CPU costs tens of microseconds on virtual machines, often more than the
// wait itself. It polls for at most readSpinMax. After the first
// readSpinBusy it yields its processor to other goroutines between polls
// (a gRPC reader has usually just readied the goroutine that will answer,
// and must not keep it off the CPU), and after readSpinShare it also
// yields its thread's CPU (the peer process may be waiting for it).
//
// Polling pays only when the record comes soon: a request/response
// connection whose round trip fits in the poll never needs a wake-up. So a
// same-host reader polls only when its side wrote since it last waited (an
// answer is due; a stream's reader, which does not write, parks at once). When
// it does not pay (an idle connection, a stream whose reader outruns its
// writer, or a machine too busy for both ends to run at once, where the
// poll only keeps the peer off the CPU) it costs CPU and latency. So each
// connection learns: a poll that catches its record within readSpinPays
// keeps polling on; any other poll makes the reader park at once for the
// next 1, 2, 4, ... up to readSpinBackoffMax waits, then try again.
const (
	readSpinMax        = 200 * time.Microsecond
	readSpinBusy       = 2 * time.Microsecond
	readSpinShare      = 50 * time.Microsecond
	readSpinPays       = 120 * time.Microsecond
	readSpinBackoffMax = 64
)

// poller is one reader's polling state: waits left to park without
// polling, and how many to skip after the next poll that does not pay.
type poller struct {
	skip, backoff int
}

// start says whether a wait that just began polls.
func (p *poller) start() bool {
	if p.skip > 0 {
		p.skip--
		return false
	}
	return true
}

// ended learns from a polled wait that ended with data after waited
// (parked or not).
func (p *poller) ended(waited time.Duration) {
	if waited <= readSpinPays {
		p.backoff = 0
		return
	}
	p.backoff = min(max(1, 2*p.backoff), readSpinBackoffMax)
	p.skip = p.backoff
}

// pollAgain says whether a polling wait that has lasted waited should look
// again, after letting other goroutines, and past readSpinShare other
// threads, run.
func pollAgain(waited time.Duration) bool {
	if waited >= readSpinMax {
		return false
	}
	if waited >= readSpinBusy {
		runtime.Gosched()
	}
	if waited >= readSpinShare {
		osYield()
	}
	return true
}

// osYield gives the thread's CPU to another runnable thread, if any.
func osYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
