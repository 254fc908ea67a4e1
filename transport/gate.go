package transport

import (
	"maps"
	"net"
	"slices"
	"sync"
	"time"
)

// gate bounds the handshakes a listener has in progress, in total and per
// source (a process on this host, an address elsewhere), so that silent
// dialers cannot hold every slot: when a bound is reached, a newcomer
// cuts short the oldest handshake that is evictable, one whose dialer has
// said nothing for silentFor or has taken longer than slowFor, of its own
// source when that source is at its bound, else of the source with the
// most in progress. A well-behaved dialer finishes in well under a
// millisecond. When nothing is evictable yet, enter waits, and the
// newcomers wait in the kernel's accept queue: a flood of silent dialers
// delays the others by at most slowFor, and never locks them out.
type gate struct {
	total, perSource   int
	silentFor, slowFor time.Duration

	mu       sync.Mutex
	bySource map[string][]*handshakeSlot // oldest first
	n        int
	evicted  uint64
	changed  chan struct{} // a slot was freed
}

// handshakeSlot is one handshake in progress.
type handshakeSlot struct {
	src   string
	nc    net.Conn
	start time.Time
	// Under the gate's mutex:
	spoke   bool // the dialer sent its first byte
	trusted bool // the dialer proved who it is: never evicted
	gone    bool // evicted or left
}

func newGate(total, perSource int) *gate {
	return &gate{total: total, perSource: perSource, silentFor: 100 * time.Millisecond, slowFor: time.Second,
		bySource: map[string][]*handshakeSlot{}, changed: make(chan struct{}, 1)}
}

// enter admits a handshake from src on nc, evicting another or waiting
// for room if a bound is reached. It returns nil if done closes first.
func (g *gate) enter(src string, nc net.Conn, done <-chan struct{}) *handshakeSlot {
	for {
		g.mu.Lock()
		full := len(g.bySource[src]) >= g.perSource
		if !full && g.n < g.total {
			h := &handshakeSlot{src: src, nc: nc, start: time.Now()}
			g.bySource[src] = append(g.bySource[src], h)
			g.n++
			g.mu.Unlock()
			return h
		}
		// At its own bound, a source gives up one of its own; else the
		// sources with the most in progress give first.
		pools := [][]*handshakeSlot{g.bySource[src]}
		if !full {
			pools = slices.SortedFunc(maps.Values(g.bySource), func(a, b []*handshakeSlot) int { return len(b) - len(a) })
		}
		var victim *handshakeSlot
		wait := g.slowFor
		for _, pool := range pools {
			v, w := g.victim(pool, time.Now())
			if v != nil {
				victim = v
				break
			}
			wait = min(wait, w)
		}
		if victim != nil {
			g.removeLocked(victim)
			g.evicted++
		}
		g.mu.Unlock()
		if victim != nil {
			victim.nc.Close() // its handshake fails and returns
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-g.changed:
		case <-t.C:
		case <-done:
			t.Stop()
			return nil
		}
		t.Stop()
	}
}

// victim is the oldest evictable handshake of pool, else how long until
// one may become evictable.
func (g *gate) victim(pool []*handshakeSlot, now time.Time) (*handshakeSlot, time.Duration) {
	wait := g.slowFor
	for _, h := range pool {
		if h.trusted {
			continue
		}
		age := now.Sub(h.start)
		if age >= g.slowFor || (!h.spoke && age >= g.silentFor) {
			return h, 0
		}
		limit := g.slowFor
		if !h.spoke {
			limit = g.silentFor
		}
		wait = min(wait, limit-age)
	}
	return nil, max(wait, time.Millisecond)
}

// spoke records that the dialer sent its first byte.
func (g *gate) spoke(h *handshakeSlot) {
	g.mu.Lock()
	h.spoke = true
	g.mu.Unlock()
}

// trust records that the dialer proved who it is.
func (g *gate) trust(h *handshakeSlot) {
	g.mu.Lock()
	h.trusted = true
	g.mu.Unlock()
}

// leave ends a handshake and reports whether it was still in the gate:
// false means it was evicted, and its connection is closed (or being
// closed) under it.
func (g *gate) leave(h *handshakeSlot) bool {
	g.mu.Lock()
	ok := !h.gone
	g.removeLocked(h)
	g.mu.Unlock()
	select {
	case g.changed <- struct{}{}:
	default:
	}
	return ok
}

func (g *gate) removeLocked(h *handshakeSlot) {
	if h.gone {
		return
	}
	h.gone = true
	l := g.bySource[h.src]
	for i, x := range l {
		if x == h {
			l = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	g.n--
	if len(l) == 0 {
		delete(g.bySource, h.src)
	} else {
		g.bySource[h.src] = l
	}
}

// counts returns the handshakes in progress and how many were evicted.
func (g *gate) counts() (inProgress int, evicted uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n, g.evicted
}
