package transport

import (
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// A reader with nothing to read (an empty ring on the shm path, an empty
// receive queue on the ub path) may poll before it blocks (in Go's
// netpoller on the shm path's notification pipe, in the provider's
// completion wait on the ub path): waking a thread that sleeps on another
// CPU costs tens of microseconds on virtual machines, often more than the
// wait itself. It polls for at most readSpinMax, and after the first
// readSpinBusy it lets other goroutines run between looks (a gRPC reader
// has usually just readied the goroutine that will answer, and must not
// keep it off the CPU).
//
// Polling pays only when the record comes soon: a request/response
// connection whose round trip fits in the poll never needs a wake-up. So a
// same-host reader polls only when its side wrote since it last waited.
// How it polls depends on what it wrote:
//   - an answer or a request (answerDue) keeps its thread's CPU for the
//     whole poll. Giving it up (sched_yield) past some point made gRPC
//     unary calls 3-4 times slower on a 2-vCPU VM whenever waits outlasted
//     that point, on an idle and on a busy machine alike
//     (docs/PERFORMANCE.md, "polling").
//   - a trickle beside what it read (a stream's receiver writes its
//     flow-control updates) also yields its thread's CPU past
//     readSpinShare: the sender it waits for may need that CPU.
//
// When a poll does not pay (an idle connection, or a machine too busy for
// both ends to run at once) it costs CPU and latency. So each connection
// learns: a poll that catches its record within readSpinPays keeps
// polling on; any other poll makes the reader park at once for the next
// 1, 2, 4, ... up to readSpinBackoffMax waits, then try again. A poll
// that caught its record after readSpinPays, but within the poll, when
// this side's write had to wake the peer's parked reader, says nothing
// about polling and changes nothing: counting it left two backed-off ends
// waking each other on every call.
const (
	readSpinMax        = 200 * time.Microsecond
	readSpinBusy       = 2 * time.Microsecond
	readSpinShare      = 50 * time.Microsecond
	readSpinPays       = 120 * time.Microsecond
	readSpinBackoffMax = 64
	// readSpinExtend bounds how long after a poll began a send of the
	// polling side may restart its clock (the ub path's receiver polls
	// for the answer to its side's latest send).
	readSpinExtend = 2 * readSpinMax
	// answerShare: an answer is due when this side wrote at least
	// 1/answerShare of what it read since its last wait.
	answerShare = 8
)

// answerDue says whether a reader about to wait, which has read read bytes
// and written wrote bytes since it last waited, expects an answer.
func answerDue(read int, wrote int64) bool {
	return wrote > 0 && wrote*answerShare >= int64(read)
}

// poller is one reader's polling state: waits left to park without
// polling, and how many to skip after the next poll that does not pay.
// A poll pays when it catches its record within pays (readSpinPays when
// zero). On the ub path a receiver polls from its side's first send of an
// exchange and an answer crosses other nodes, so there a catch anywhere
// within readSpinMax pays.
type poller struct {
	skip, backoff int
	pays          time.Duration
}

// decide is a reader's choice as a wait begins, having read read bytes
// and written wrote since its last wait: whether to poll (only when its
// side wrote: an answer may be due), and whether to share its thread's CPU
// while it does (when what it wrote is no answer, see answerDue).
func (p *poller) decide(read int, wrote int64) (polling, share bool) {
	return wrote > 0 && p.start(), !answerDue(read, wrote)
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
// (parked or not); excused says this side's write woke the peer's reader.
// An excused wait that the poll still caught (within readSpinMax) changes
// nothing; one that outlasted the poll counts as usual: the peer was slow
// to answer, not only slow to wake (a connection whose calls come further
// apart than a poll, where every request finds the peer parked).
func (p *poller) ended(waited time.Duration, excused bool) {
	pays := p.pays
	if pays == 0 {
		pays = readSpinPays
	}
	if waited <= pays {
		p.backoff = 0
		return
	}
	if excused && waited < readSpinMax {
		return
	}
	p.missed()
}

// missed learns from a polled wait that did not pay.
func (p *poller) missed() {
	p.backoff = min(max(1, 2*p.backoff), readSpinBackoffMax)
	p.skip = p.backoff
}

// pollLadder is the shm.Backoff a polling reader climbs: it looks for
// readSpinMax, lets other goroutines run from readSpinBusy on (at every
// checkpoint of the ladder, about each microsecond), and, if share, yields
// its thread's CPU from readSpinShare on.
func pollLadder(share bool) shm.Backoff {
	b := shm.Backoff{Spin: readSpinMax, Gosched: readSpinBusy, Yield: -1}
	if share {
		b.Yield = readSpinShare
	}
	return b
}
