package simprov

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Stats says how closely this node's simulated links kept their configured
// figures: how late the simulator was, by its own clock, against the times
// the topology gave its operations. A link that runs late looks slower than
// configured to everything measured through it.
type Stats struct {
	// Posts are the operations handed to the provider underneath, late by
	// the time from their simulated start to the hand-off: a send reaches
	// its receiver then, and a one-sided operation begins to land.
	Posts Lateness
	// Completions are the completions of delayed operations that a Wait
	// was waiting for, late by the time from their simulated arrival to
	// the Wait's return: what the poster saw of the link.
	Completions Lateness
}

// Lateness is the distribution of how late a kind of event came.
type Lateness struct {
	// Count is how many events were measured, early ones included.
	Count uint64
	// Early counts events that came before their simulated time. The
	// simulator never lets that happen; a count above zero is a bug.
	Early uint64
	// P50 and P99 are percentiles of the lateness of the events that were
	// not early, rounded up to their histogram bucket (at most 1/16 of the
	// value over, and never over Max; beyond 18 minutes, 18 minutes). Max
	// is exact.
	P50, P99, Max time.Duration
}

// The lateness histogram has latenessSub buckets per power of two: exact
// below latenessSub ns, then each bucket 1/latenessSub of its octave wide,
// up to about 2^latenessOctaves ns (18 minutes); longer times fall into the
// last bucket.
const (
	latenessSubBits  = 4
	latenessSub      = 1 << latenessSubBits
	latenessOctaves  = 40
	latenessBuckets  = (latenessOctaves - latenessSubBits + 1) * latenessSub
	latenessMaxValue = 1<<latenessOctaves - 1
)

// lateness counts how late events came, without locks: the scheduler and
// every waiter record into it at once.
type lateness struct {
	early   atomic.Uint64
	max     atomic.Int64
	buckets [latenessBuckets]atomic.Uint64
}

// record counts an event due at due that came at at.
func (l *lateness) record(due, at time.Time) {
	late := at.Sub(due)
	if late < 0 {
		l.early.Add(1)
		return
	}
	for m := l.max.Load(); int64(late) > m && !l.max.CompareAndSwap(m, int64(late)); m = l.max.Load() {
	}
	l.buckets[latenessBucket(late)].Add(1)
}

// latenessBucket returns the bucket of a lateness of d (not negative).
func latenessBucket(d time.Duration) int {
	v := uint64(min(d, latenessMaxValue))
	if v < latenessSub {
		return int(v)
	}
	shift := bits.Len64(v) - latenessSubBits - 1
	return (shift+1)*latenessSub + int(v>>shift) - latenessSub
}

// latenessBucketTop returns the largest lateness bucket b holds.
func latenessBucketTop(b int) time.Duration {
	if b < latenessSub {
		return time.Duration(b)
	}
	shift := b/latenessSub - 1
	low := uint64(latenessSub+b%latenessSub) << shift
	return time.Duration(low + 1<<shift - 1)
}

// snapshot reads the distribution. Events recorded meanwhile may be counted
// in some figures and not others.
func (l *lateness) snapshot() Lateness {
	var counts [latenessBuckets]uint64
	var onTime uint64
	for i := range l.buckets {
		counts[i] = l.buckets[i].Load()
		onTime += counts[i]
	}
	s := Lateness{Early: l.early.Load(), Max: time.Duration(l.max.Load())}
	s.Count = onTime + s.Early
	s.P50, s.P99 = min(quantile(&counts, onTime, 0.5), s.Max), min(quantile(&counts, onTime, 0.99), s.Max)
	return s
}

// quantile returns the top of the bucket that holds the q-th of n events
// (the smallest bucket with at least ceil(q*n) events at or below it).
func quantile(counts *[latenessBuckets]uint64, n uint64, q float64) time.Duration {
	if n == 0 {
		return 0
	}
	rank := max(1, uint64(math.Ceil(q*float64(n))))
	var seen uint64
	for b, c := range counts {
		if seen += c; seen >= rank {
			return latenessBucketTop(b)
		}
	}
	return latenessBucketTop(latenessBuckets - 1)
}

// stats holds a context's lateness figures.
type stats struct {
	posts, completions lateness
}

// Stats returns how late this node's simulated operations came so far (see
// [Stats]), since the context was opened.
func (c *Context) Stats() Stats {
	return Stats{Posts: c.stats.posts.snapshot(), Completions: c.stats.completions.snapshot()}
}
