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
		budget:        &budget{limit: or(total, DefaultReceiveMemory), perPeer: max(or(total, DefaultReceiveMemory)/peerShare, initialCredit)},
	}
}

// defaultFlow is the flow control of connections made without an
// endpoint's (tests of the packet decoder).
var defaultFlow = sync.OnceValue(func() *flowConfig { return newFlowConfig(0, 0, 0) })

// budget bounds the receive memory of an endpoint's connections beyond
// their initial credit: a window grows only by what it reserves here. A
// window's reservation is credit its peer holds, and granted credit is
// never taken back, so one peer node (the key: the node its certificate or
// its socket proves) may hold at most a share of it (peerShare): a hostile
// node that grows its windows and then goes quiet leaves the rest to the
// others.
type budget struct {
	mu      sync.Mutex
	limit   int64
	perPeer int64 // the most one peer may hold (0: limit)
	used    int64
	byPeer  map[string]int64
	waiters map[chan struct{}]string // windows that want to grow: "" if the limit stops them, else their peer, whose share does
}

// peerShare is the part of an endpoint's ReceiveMemory one peer node may
// hold (1/peerShare).
const peerShare = 4

// share is the most one peer may reserve.
func (b *budget) share() int64 {
	if b.perPeer == 0 {
		return b.limit
	}
	return b.perPeer
}

// reserve takes up to most bytes for peer and returns how many it got;
// with less than least, kick is signalled at the next release.
func (b *budget) reserve(peer string, least, most int64, kick chan struct{}) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	free, peerFree := b.limit-b.used, b.share()-b.byPeer[peer]
	n := max(min(most, free, peerFree), 0)
	b.used += n
	if n > 0 {
		if b.byPeer == nil {
			b.byPeer = map[string]int64{}
		}
		b.byPeer[peer] += n
	}
	if n < least {
		if b.waiters == nil {
			b.waiters = map[chan struct{}]string{}
		}
		if peerFree < free {
			b.waiters[kick] = peer
		} else {
			b.waiters[kick] = ""
		}
	}
	return n
}

// release gives n bytes of peer's back and wakes the windows waiting to
// grow.
func (b *budget) release(peer string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.byPeer[peer] -= n; b.byPeer[peer] == 0 {
		delete(b.byPeer, peer)
	}
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

// pressed says whether a window that peer's memory would help waits to
// grow: one the limit stops, or one of peer's own that its share stops.
func (b *budget) pressed(peer string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.waiters {
		if p == "" || p == peer {
			return true
		}
	}
	return false
}

// inUse is how much is reserved.
func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// peerInUse is how much peer has reserved.
func (b *budget) peerInUse(peer string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.byPeer[peer]
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
	return w.starved() && (w.size < w.max || (pending > 0 && w.got == w.used))
}

// starved says whether the peer waits for credit it does not have: what
// it was granted and has not used is less than it needs. A peer that says
// it waits while it has the credit (or bytes on their way make it seem
// so) does not grow the window: it must use its credit first.
func (w *recvWindow) starved() bool { return w.need > 0 && w.granted-w.got < w.need }

// grant returns the credit to give the peer now. A peer that waits for
// credit it does not have gets the window grown from b (doubled, or more
// if a message needs it), up to max and its share of b; kick is signalled
// when b has more if it had too little. When other windows wait for b, a
// window whose peer does not wait shrinks back towards initialCredit as
// its bytes are consumed.
func (w *recvWindow) grant(b *budget, peer string, kick chan struct{}) int64 {
	held := w.got - w.used // buffered, and the message being assembled
	if w.starved() && w.size < w.max {
		target := min(w.max, max(2*w.size, held+w.need))
		w.size += b.reserve(peer, held+w.need-w.size, target-w.size, kick)
	} else if w.need == 0 && w.size > initialCredit && b.pressed(peer) {
		give := min(w.used+w.size-w.granted, w.size-initialCredit)
		w.size -= give
		b.release(peer, give)
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
func (w *recvWindow) close(b *budget, peer string) {
	b.release(peer, w.size-initialCredit)
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
