package cachesuite

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBuckets(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<40; v = v*17/16 + 1 {
		b := bucket(v)
		if b < prev {
			t.Fatalf("bucket(%d) = %d < %d", v, b, prev)
		}
		prev = b
		if mid := bucketMid(b); math.Abs(mid-float64(v)) > float64(v)/60+1 {
			t.Fatalf("value %d in bucket %d with middle %v", v, b, mid)
		}
	}
	if b := bucket(math.MaxUint64); b >= len(hist{}.counts) {
		t.Fatalf("bucket(max) = %d", b)
	}
}

func TestQuantile(t *testing.T) {
	var h hist
	var s []float64
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		v := int64(r.ExpFloat64() * 5000)
		h.add(v)
		s = append(s, float64(v))
	}
	slices.Sort(s)
	for _, q := range []float64{0.5, 0.99, 0.999} {
		exact := s[int(math.Ceil(q*float64(len(s))))-1]
		if got := h.quantile(q); math.Abs(got-exact) > exact/50+1 {
			t.Errorf("q%v = %v, exact %v", q, got, exact)
		}
	}
}
