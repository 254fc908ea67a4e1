package simprov

import (
	"sync"
	"testing"
	"time"
)

// TestLatenessBuckets: every lateness falls into a bucket whose top is at
// or above it and at most 1/16 over, and buckets follow the values' order,
// so percentiles read from them never understate a lateness.
func TestLatenessBuckets(t *testing.T) {
	prev := -1
	for _, d := range []time.Duration{0, 1, 15, 16, 17, 31, 32, 33, 100, 999, 1000, 1023, 1024, 12345, time.Millisecond, time.Second, time.Minute, latenessMaxValue} {
		b := latenessBucket(d)
		if b < prev {
			t.Errorf("%v is in bucket %d, below the bucket of a smaller lateness (%d)", d, b, prev)
		}
		prev = b
		top := latenessBucketTop(b)
		if top < d || float64(top-d) > float64(d)/latenessSub {
			t.Errorf("%v is in bucket %d, whose top %v is below it or more than 1/%d over", d, b, top, latenessSub)
		}
	}
	// Beyond the histogram (18 minutes), a lateness counts in the last
	// bucket: percentiles say 18 minutes, Max the truth.
	if b := latenessBucket(time.Hour); b != latenessBuckets-1 {
		t.Errorf("a lateness beyond the histogram is in bucket %d, want the last (%d)", b, latenessBuckets-1)
	}
	for b := range latenessBuckets - 1 {
		if latenessBucket(latenessBucketTop(b)) != b || latenessBucket(latenessBucketTop(b)+1) != b+1 {
			t.Fatalf("bucket %d's top %v does not end it", b, latenessBucketTop(b))
		}
	}
}

// TestLatenessAccounting records known lateness and reads it back: counts,
// early events kept apart, percentiles within a bucket of the truth, the
// exact maximum, and nothing lost to concurrent recording.
func TestLatenessAccounting(t *testing.T) {
	var l lateness
	if s := l.snapshot(); s != (Lateness{}) {
		t.Fatalf("nothing recorded, yet %+v", s)
	}
	due := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 245 {
				l.record(due, due.Add(time.Microsecond))
			}
			l.record(due, due.Add(50*time.Microsecond))
			for range 4 {
				l.record(due, due.Add(20*time.Microsecond))
			}
		})
	}
	wg.Wait()
	l.record(due, due.Add(3*time.Millisecond+7))
	l.record(due, due.Add(-time.Nanosecond))
	l.record(due, due.Add(-time.Second))
	s := l.snapshot()
	// 980 at 1 µs, 16 at 20 µs, 4 at 50 µs and 1 at 3 ms: the 99th
	// percentile of the 1001 on time is the 991st, at 20 µs.
	if s.Count != 1003 || s.Early != 2 {
		t.Errorf("count %d, early %d; want 1003 and 2", s.Count, s.Early)
	}
	near := func(got, want time.Duration) bool { return got >= want && got <= want+want/latenessSub }
	// Rounded up to its bucket, a percentile still never passes the
	// maximum.
	var one lateness
	one.record(due, due.Add(1000))
	if s := one.snapshot(); s.P50 != 1000 || s.P99 != 1000 || s.Max != 1000 {
		t.Errorf("one event 1 µs late: %+v", s)
	}
	if !near(s.P50, time.Microsecond) || !near(s.P99, 20*time.Microsecond) {
		t.Errorf("p50 %v, p99 %v; want 1 µs and 20 µs (to 1/%d over)", s.P50, s.P99, latenessSub)
	}
	if s.Max != 3*time.Millisecond+7 {
		t.Errorf("max %v, want 3.000007ms", s.Max)
	}
}
