package tcpprov

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"time"
)

// What one source host can make a context do. A request that fails
// authorization (an unknown segment or jetty, or a wrong token) costs its
// source a unit of a bucket that holds failBurst units and gains failRate a
// second; with the bucket empty, the answer to the failing request waits for
// a unit. The burst covers a peer's honest mistakes (descriptors of objects
// closed meanwhile) without delay; the rate makes a 31-bit token take 2^30
// guesses, about 124 days, on average. Requests that pass cost nothing. At
// most maxSources sources have a bucket of their own (see failLimiter). A
// source is served at most maxConnsPerSource connections at once and the
// context maxConns; a connection beyond either is closed at once.
const (
	failBurst         = 64
	failRate          = 100 // a second
	maxSources        = 4096
	maxConnsPerSource = 256
	maxConns          = 4096
)

// sourceOf is the source a connection counts against: its remote host, with
// every loopback address one source (any local user may bind any of 127/8)
// and an IPv6 address by its /64, what one host is usually given (but a
// link-local one whole: every host on a link shares fe80::/64).
func sourceOf(a net.Addr) netip.Prefix {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}
	}
	ip := ta.AddrPort().Addr().Unmap().WithZone("")
	switch {
	case ip.IsLoopback():
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 0, 0, 0}), 8)
	case ip.Is6() && !ip.IsLinkLocalUnicast():
		p, _ := ip.Prefix(64)
		return p
	}
	return netip.PrefixFrom(ip, ip.BitLen())
}

// bucket is a source's failure budget at a moment. units below zero are owed
// to connections waiting for them; a connection waits for one unit at a
// time, so a wait lasts at most the source's connections over failRate.
// The zero bucket is full.
type bucket struct {
	src   netip.Prefix
	units float64
	at    time.Time
	elem  *list.Element // in failLimiter.lru
}

// level is the bucket's units at now.
func (b *bucket) level(now time.Time) float64 {
	return min(failBurst, b.units+now.Sub(b.at).Seconds()*failRate)
}

// failLimiter holds the buckets of the sources that failed lately, at most
// maxSources of them. A bucket that filled up again is dropped, since a
// fresh one is the same. At the cap, sources without a bucket share one:
// evicting a bucket still refilling would hand its source fresh units.
// The zero failLimiter is ready to use.
type failLimiter struct {
	mu       sync.Mutex
	buckets  map[netip.Prefix]*bucket
	lru      list.List // of *bucket, the latest failure at the front
	overflow bucket    // shared by the sources beyond maxSources
}

// fail takes a unit from src's bucket at now and returns how long its answer
// waits for the unit.
func (l *failLimiter) fail(src netip.Prefix, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Drop the least recently failed buckets while they are full again.
	for e := l.lru.Back(); e != nil && e.Value.(*bucket).level(now) >= failBurst; e = l.lru.Back() {
		delete(l.buckets, e.Value.(*bucket).src)
		l.lru.Remove(e)
	}
	b := l.buckets[src]
	switch {
	case b != nil:
		l.lru.MoveToFront(b.elem)
	case len(l.buckets) < maxSources:
		if l.buckets == nil {
			l.buckets = map[netip.Prefix]*bucket{}
		}
		b = &bucket{src: src}
		b.elem = l.lru.PushFront(b)
		l.buckets[src] = b
	default:
		b = &l.overflow
	}
	b.units, b.at = b.level(now)-1, now
	if b.units >= 0 {
		return 0
	}
	return time.Duration(-b.units / failRate * float64(time.Second))
}
