package cachesuite

import (
	"math"
	"math/bits"
)

// hist is a log-linear histogram of durations in ns: exact below 128 ns,
// then 64 buckets per power of two (at most 1.6% wide), so a client can
// time millions of operations without keeping them.
type hist struct {
	counts [64 + 58*64]uint64
	n      uint64
}

func bucket(v uint64) int {
	if v < 128 {
		return int(v)
	}
	shift := bits.Len64(v) - 7 // keep the top 7 bits: 64 <= v>>shift < 128
	return 64 + shift*64 + int(v>>shift) - 64
}

// bucketMid is the middle of bucket i's range.
func bucketMid(i int) float64 {
	if i < 128 {
		return float64(i)
	}
	shift := (i - 64) / 64
	m := uint64(i-64-shift*64) + 64
	lo := m << shift
	return float64(lo) + float64(uint64(1)<<shift-1)/2
}

func (h *hist) add(ns int64) {
	h.counts[bucket(uint64(max(ns, 0)))]++
	h.n++
}

// quantile returns the q-quantile (0 < q <= 1), as percentile in the
// harness: the smallest value with at least ceil(q*n) samples at or below.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	want := max(uint64(math.Ceil(q*float64(h.n))), 1)
	var cum uint64
	for i, c := range h.counts {
		cum += c
		if cum >= want {
			return bucketMid(i)
		}
	}
	return bucketMid(len(h.counts) - 1)
}
