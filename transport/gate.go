package transport

import (
	"net"
	"sync"
	"sync/atomic"
)

// gate bounds a listener's handshakes in progress, in total and per
// source, without turning anyone away: a dialer beyond a bound cuts short
// the oldest handshake of the source with the most in progress (its own
// source's, when that one is over its bound). A well-behaved dialer
// finishes its handshake in well under a millisecond, so the handshakes
// that are old when room is needed are the silent ones, and a flood of
// them evicts itself: it cannot keep the listener from accepting others.
type gate struct {
	total, perSource int

	mu       sync.Mutex
	bySource map[string][]*handshakeSlot // oldest first
	n        int
	evicted  uint64
}

// handshakeSlot is one handshake in progress.
type handshakeSlot struct {
	src     string
	nc      net.Conn
	evicted atomic.Bool
}

func newGate(total, perSource int) *gate {
	return &gate{total: total, perSource: perSource, bySource: map[string][]*handshakeSlot{}}
}

// enter admits a handshake from src on nc, evicting another if a bound is
// reached.
func (g *gate) enter(src string, nc net.Conn) *handshakeSlot {
	h := &handshakeSlot{src: src, nc: nc}
	g.mu.Lock()
	var victim *handshakeSlot
	switch {
	case len(g.bySource[src]) >= g.perSource:
		victim = g.bySource[src][0]
	case g.n >= g.total:
		var most []*handshakeSlot
		for _, l := range g.bySource {
			if len(l) > len(most) {
				most = l
			}
		}
		victim = most[0]
	}
	if victim != nil {
		g.removeLocked(victim)
		victim.evicted.Store(true)
		g.evicted++
	}
	g.bySource[src] = append(g.bySource[src], h)
	g.n++
	g.mu.Unlock()
	if victim != nil {
		victim.nc.Close() // its handshake fails and returns
	}
	return h
}

// leave ends a handshake (a no-op for an evicted one).
func (g *gate) leave(h *handshakeSlot) {
	g.mu.Lock()
	g.removeLocked(h)
	g.mu.Unlock()
}

func (g *gate) removeLocked(h *handshakeSlot) {
	l := g.bySource[h.src]
	for i, x := range l {
		if x == h {
			l = append(l[:i:i], l[i+1:]...)
			g.n--
			if len(l) == 0 {
				delete(g.bySource, h.src)
			} else {
				g.bySource[h.src] = l
			}
			return
		}
	}
}

// counts returns the handshakes in progress and how many were evicted.
func (g *gate) counts() (inProgress int, evicted uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n, g.evicted
}
