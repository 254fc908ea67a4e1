package transport

import (
	"errors"
	"sync"
)

// Flow control on the ub and tcp paths (PROTOCOL.md): each side gives its
// peer credit, separately for stream bytes and for messages, and a peer
// may send no more than it was given. This file is the arithmetic; it does
// no I/O.

// Flow-control constants of the packet protocol.
const (
	// initialCredit is the credit each side has, for stream bytes and for
	// messages each, before the peer says more: it is not drawn from the
	// endpoint's ReceiveMemory, and it is the smallest window.
	initialCredit = 256 << 10
	// msgOverhead is the credit a message costs beyond its bytes, so that
	// empty messages are not free to queue.
	msgOverhead = 64
)

// Defaults of Config's flow-control fields.
const (
	// DefaultStreamWindow is the default of Config.StreamWindow.
	DefaultStreamWindow = 4 << 20
	// DefaultMessageWindow is the default of Config.MessageWindow.
	DefaultMessageWindow = 4 << 20
	// DefaultReceiveMemory is the default of Config.ReceiveMemory.
	DefaultReceiveMemory = 256 << 20
)

// ErrFlowControl reports a peer that sent more than the credit it was
// given: a correct peer never does, so the connection is ended. The error
// a connection fails with wraps it and syscall.ECONNRESET.
var ErrFlowControl = errors.New("transport: the peer sent more than its credit allows")

// flowConfig is an endpoint's flow control: the window of each kind and
// the budget every connection's receive windows draw on.
type flowConfig struct {
	streamWindow, messageWindow int64
	budget                      *budget
}

// newFlowConfig applies the defaults and the floor (initialCredit) to
// what a Config says.
func newFlowConfig(stream, message, total int64) *flowConfig {
	or := func(v, def int64) int64 {
		if v <= 0 {
			return def
		}
		return v
	}
	return &flowConfig{
		streamWindow:  max(or(stream, DefaultStreamWindow), initialCredit),
		messageWindow: max(or(message, DefaultMessageWindow), initialCredit-msgOverhead) + msgOverhead,
		budget:        &budget{limit: or(total, DefaultReceiveMemory)},
	}
}

// defaultFlow is the flow control of connections made without an
// endpoint's (tests of the packet decoder).
var defaultFlow = sync.OnceValue(func() *flowConfig { return newFlowConfig(0, 0, 0) })

// budget bounds the receive memory of an endpoint's connections beyond
// their initial credit: a window grows only by what it reserves here.
type budget struct {
	mu      sync.Mutex
	limit   int64
	used    int64
	waiters map[chan struct{}]struct{} // windows that want to grow
}

// reserve takes up to most bytes and returns how many it got; with less
// than least, kick is signalled at the next release.
func (b *budget) reserve(least, most int64, kick chan struct{}) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := max(min(most, b.limit-b.used), 0)
	b.used += n
	if n < least {
		if b.waiters == nil {
			b.waiters = map[chan struct{}]struct{}{}
		}
		b.waiters[kick] = struct{}{}
	}
	return n
}

// release gives n bytes back and wakes the windows waiting to grow.
func (b *budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	for w := range b.waiters {
		select {
		case w <- struct{}{}:
		default:
		}
		delete(b.waiters, w)
	}
}

// forget stops signalling kick.
func (b *budget) forget(kick chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.waiters, kick)
}

// pressed says whether a window waits to grow.
func (b *budget) pressed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiters) > 0
}

// inUse is how much is reserved.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// recvWindow is the receiving side of one kind of credit. Counts are
// cumulative: the peer may send until got reaches granted; what arrived
// and was not consumed is buffered, and what was consumed since the last
// grant is pending, given back in batches.
type recvWindow struct {
	max     int64 // the largest the window grows to
	size    int64 // the window now: initialCredit + what it reserved
	granted int64 // credit given to the peer
	got     int64 // bytes (credit) the peer used
	used    int64 // bytes the application consumed
	need    int64 // the peer waits for this much credit (0: it does not wait)
}

func newRecvWindow(max int64) recvWindow {
	return recvWindow{max: max, size: initialCredit, granted: initialCredit}
}

// admit takes n bytes from the peer; more than its credit is an error.
func (w *recvWindow) admit(n int64) bool {
	if n < 0 || n > w.granted-w.got {
		return false
	}
	w.got += n
	return true
}

// consume notes n bytes the application took and says whether a grant is
// due.
func (w *recvWindow) consume(n int64) bool {
	w.used += n
	return w.due()
}

// due says whether to grant now: a quarter of the window is pending (the
// batch), or the peer waits and either the window can grow or the peer
// can go on only with what is pending. That last case is a message of
// more than three quarters of the window: once everything that arrived is
// consumed, less than a quarter may be pending. Granting what is pending
// early in any other case would only make small grants, and small packets.
func (w *recvWindow) due() bool {
	pending := w.used + w.size - w.granted
	if pending >= w.size/4 {
		return true
	}
	return w.need > 0 && (w.size < w.max || (pending > 0 && w.got == w.used && w.granted-w.got < w.need))
}

// grant returns the credit to give the peer now. A peer that waits for
// credit gets the window grown from b (doubled, or more if a message
// needs it), up to max; kick is signalled when b has more if it had too
// little. When other windows wait for b, a window whose peer does not
// wait shrinks back towards initialCredit as its bytes are consumed.
func (w *recvWindow) grant(b *budget, kick chan struct{}) int64 {
	held := w.got - w.used // buffered, and the message being assembled
	if w.need > 0 && w.size < w.max {
		target := min(w.max, max(2*w.size, held+w.need))
		w.size += b.reserve(held+w.need-w.size, target-w.size, kick)
	} else if w.need == 0 && w.size > initialCredit && b.pressed() {
		give := min(w.used+w.size-w.granted, w.size-initialCredit)
		w.size -= give
		b.release(give)
	}
	credit := w.used + w.size - w.granted
	if credit > 0 {
		// The peer asks again if this is not enough.
		w.need = 0
		w.granted += credit
	}
	return credit
}

// close gives the window's reservation back.
func (w *recvWindow) close(b *budget) {
	b.release(w.size - initialCredit)
	w.size = initialCredit
}

// sendWindow is the sending side: credit the peer gave, in packets and
// in memory (the ub path's words), and what was sent of it (cumulative).
type sendWindow struct {
	granted, mem, sent int64
	max                int64 // the peer's window (0: not yet known)
	asked              int64 // the credit when this side last said it waits
}

func newSendWindow() sendWindow { return sendWindow{granted: initialCredit, asked: -1} }

func (w *sendWindow) total() int64 { return w.granted + w.mem }

func (w *sendWindow) avail() int64 { return w.total() - w.sent }

// inMemory takes what the peer's words say it gave in all; they only
// grow (a peer that makes them shrink only holds its own data back).
func (w *sendWindow) inMemory(n int64) { w.mem = max(w.mem, n) }

// add takes a grant from the peer; one that overflows is an error.
func (w *sendWindow) add(n int64) bool {
	if n < 0 || w.granted+n < w.granted {
		return false
	}
	w.granted += n
	return true
}
