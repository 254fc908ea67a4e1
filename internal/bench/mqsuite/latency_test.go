package mqsuite

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// TestBuckets: every latency lies in its bucket, within 3.2% of its upper
// edge, and the buckets are in order.
func TestBuckets(t *testing.T) {
	check := func(ns uint64) {
		i := bucket(ns)
		hi := upper(i)
		lo := uint64(0)
		if i > 0 {
			lo = upper(i - 1)
		}
		if ns < lo || ns >= hi {
			t.Fatalf("%d ns in bucket %d, [%d, %d)", ns, i, lo, hi)
		}
		if ns >= 1<<histShift && float64(hi-ns) > 0.032*float64(ns) {
			t.Fatalf("%d ns: bucket edge %d is more than 3.2%% above", ns, hi)
		}
	}
	for ns := range uint64(1 << 16) {
		check(ns)
	}
	for range 100000 {
		check(rand.Uint64N(1 << 62))
	}
	check(1<<63 - 1)
}

// TestQuantile compares the histogram's quantiles with sorted samples.
func TestQuantile(t *testing.T) {
	var h histogram
	var all []int64
	for range 100000 {
		ns := int64(rand.ExpFloat64() * 2000)
		if rand.IntN(100) == 0 {
			ns = 1e6 + rand.Int64N(1e7)
		}
		h.add(ns)
		all = append(all, ns)
	}
	slices.Sort(all)
	for _, q := range []float64{0.5, 0.99, 0.999, 1} {
		want := float64(all[int(q*float64(len(all)-1))])
		got := h.quantile(q)
		if got < want || got > want*1.033+8 {
			t.Errorf("quantile %v: %v, the samples say %v", q, got, want)
		}
	}
}

// TestWarmUpNotTimed: the consumer takes the latency of stamped records
// only; the warm-up's records, stamped 0, would otherwise count as
// decades late.
func TestWarmUpNotTimed(t *testing.T) {
	const now = int64(1_800_000_000_000_000_000)
	var h histogram
	b := make([]byte, size)
	for i := range 1000 {
		bench.Fill(b, uint64(i))
		binary.LittleEndian.PutUint64(b, 0)
		if err := h.record(b, now); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		bench.Fill(b, uint64(1000+i))
		binary.LittleEndian.PutUint64(b, uint64(now-500))
		if err := h.record(b, now); err != nil {
			t.Fatal(err)
		}
	}
	if h.n != 100 {
		t.Errorf("%d latencies taken of 100 stamped records (1000 more of the warm-up)", h.n)
	}
	if p := h.quantile(1); p != 500 {
		t.Errorf("largest latency %v ns, want 500", p)
	}
	if err := h.record(b[:7], now); err == nil {
		t.Error("a 7-byte record has no stamp, and no error")
	}
}
