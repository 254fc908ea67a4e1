package mqsuite

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/mq"
)

// offered is log-100B-p99's offered load, in records per second.
const offered = 1_000_000

// Percentiles of log-100B-p99 besides its value (the p99), in ns.
const (
	extraP50  = "p50-ns"
	extraP999 = "p99.9-ns"
	extraRate = "sent-msg/s"
)

// latencyResult is what the latency consumer reports: records read, the
// sum of their bytes and percentiles of their latency in ns.
type latencyResult struct {
	result
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
}

func init() {
	registerPeer("mq-log-latency", latencyConsumer)
}

// logLatency offers rate records of size bytes a second to a one-partition
// log for d, each stamped with the wall-clock time it was due (not the time
// the producer got to it: a producer that falls behind adds its delay to
// the latency, so the figure does not omit the records a stall held
// back). The consumer process reads each in place, checksums it and takes
// the time from its stamp to its arrival; the value is the p99 in µs.
// Both ends read CLOCK_REALTIME through Go's time.Now, one clock for the
// host.
//
// The log is measured in its steady state: before anything is timed the
// producer fills it, unpaced, until it has made every segment of its
// cycle of files once more (Stats.Reused, under Config.Recycle): a new
// log's first pass through its segments is a one-time cost (fresh pages,
// the kernel allocating and zeroing each on its first touch, and every
// process mapping each file for the first time) that a log running for
// hours does not pay again, and that took a third of a one-second run.
// These records are stamped 0 too (below).
//
// The measured phase follows a warm-up at the same rate (warmUpFor):
// the first records of a run wait for the consumer to map and fault in
// its first segment and for the producer's first segment, multi-ms
// latencies that would make a short run's p99. The warm-up's records are
// stamped 0: the consumer counts and sums them (the checks cover every
// record) but does not time them. The measured phase's schedule starts
// at its own start, so a warm-up that fell behind does not charge its
// lag to the first measured records.
func logLatency(d time.Duration, size, rate int) (bench.Measurement, error) {
	l, remove, err := newLog()
	if err != nil {
		return bench.Measurement{}, err
	}
	defer remove()
	peer, err := startConsumer("mq consumer", "mq-log-latency", peerArgs{Log: l.Name()})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer peer.Kill()
	if err := peer.expect("ready"); err != nil {
		return bench.Measurement{}, err
	}
	warm := warmUpFor(d)
	ctx, cancel := context.WithTimeout(context.Background(), warm+d+30*time.Second)
	defer cancel()
	interval := time.Second / time.Duration(rate)
	n, sum, err := prime(ctx, l, size)
	if err != nil {
		return bench.Measurement{}, err
	}
	wn, wsum, err := offer(ctx, l, size, interval, warm, n, false)
	if err != nil {
		return bench.Measurement{}, err
	}
	n, sum = n+wn, sum+wsum
	start := time.Now()
	timed, timedSum, err := offer(ctx, l, size, interval, d, n, true)
	if err != nil {
		return bench.Measurement{}, err
	}
	sent := float64(timed) / time.Since(start).Seconds()
	n, sum = n+timed, sum+timedSum
	if _, err := l.Send(ctx, 0, nil); err != nil {
		return bench.Measurement{}, err
	}
	return latencyReport(peer, n, sum, sent)
}

// primeCycle is how many segments prime has the log make of spares: its
// Segments, its two spares and the one made ahead, each file of the
// cycle once more.
func primeCycle(c mq.Config) uint64 { return uint64(c.Segments) + 3 }

// prime sends records of size bytes, stamped 0 and seeded 0, 1, ..., to
// partition 0 of l as fast as it takes them, until l has made primeCycle
// segments of spares. It returns how many it sent and the sum of their
// bytes. A log that has made four times as many segments and still not
// so many of spares is an error (recycling off, or spares held).
func prime(ctx context.Context, l *mq.Log, size int) (n, sum uint64, err error) {
	c := l.Config()
	want := primeCycle(c)
	for {
		st, err := l.Stats(0)
		if err != nil {
			return n, sum, err
		}
		if st.Reused >= want {
			return n, sum, nil
		}
		if made := st.Tail / uint64(c.SegmentSize); made > 4*want {
			return n, sum, fmt.Errorf("mq bench: priming the log: %d segments made, %d of spares (want %d): is Recycle off?", made, st.Reused, want)
		}
		for range 1024 {
			s, err := sendOne(ctx, l, size, n, 0)
			if err != nil {
				return n, sum, err
			}
			sum += s
			n++
		}
	}
}

// latencyReport takes a latency consumer's report, checks it against the
// n records summing to sum that were sent, and makes the measurement: the
// p99 in µs, with the p50, the p99.9 and the rate sent (msg/s).
func latencyReport(peer *consumerPeer, n, sum uint64, sent float64) (bench.Measurement, error) {
	var res latencyResult
	if err := peer.report(&res, n, sum); err != nil {
		return bench.Measurement{}, err
	}
	if err := peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: res.P99 / 1e3, Extra: map[string]float64{extraP50: res.P50, extraP999: res.P999, extraRate: sent}}, nil
}

// warmUpFor is the warm-up of a log-100B-p99 run of d: 100 ms, or a
// fifth of a shorter run (-quick's 200 ms runs warm up for 40 ms, past
// the ~12 ms of slow first records and the backlog they leave).
func warmUpFor(d time.Duration) time.Duration { return min(100*time.Millisecond, d/5) }

// paced calls send for each record due every interval for d (the i-th
// of the call due at i intervals from its start), with the wall-clock
// time it was due in ns if timed (a record sent late carries its delay),
// and 0 otherwise (a warm-up record: counted and summed, not timed). It
// returns how many it sent.
func paced(d, interval time.Duration, timed bool, send func(i, stamp uint64) error) (n uint64, err error) {
	start := time.Now()
	epoch := start.UnixNano()
	for {
		elapsed := time.Since(start)
		if elapsed >= d {
			return n, nil
		}
		for due := uint64(elapsed / interval); n <= due; n++ {
			var stamp uint64
			if timed {
				stamp = uint64(epoch + int64(n)*int64(interval))
			}
			if err := send(n, stamp); err != nil {
				return n, err
			}
		}
	}
}

// offer loans, fills and commits one record of size bytes into partition
// 0 every interval for d (paced), seeded first, first+1, ..., with the
// stamp in its first 8 bytes. It returns how many records it committed
// and the sum of their bytes.
func offer(ctx context.Context, l *mq.Log, size int, interval, d time.Duration, first uint64, timed bool) (n, sum uint64, err error) {
	n, err = paced(d, interval, timed, func(i, stamp uint64) error {
		s, err := sendOne(ctx, l, size, first+i, stamp)
		sum += s
		return err
	})
	return n, sum, err
}

// sendOne loans, fills (seeded seed) and commits one record of size
// bytes into partition 0 of l, with stamp in its first 8 bytes, and
// returns the sum of its bytes.
func sendOne(ctx context.Context, l *mq.Log, size int, seed, stamp uint64) (uint64, error) {
	r, err := l.Loan(ctx, 0, size)
	if err != nil {
		return 0, err
	}
	b := r.Bytes()
	bench.Fill(b, seed)
	binary.LittleEndian.PutUint64(b, stamp)
	return bench.Sum(b), r.Commit()
}

// latencyConsumer reads the log from offset 0 until an empty record and
// reports the latency percentiles of what it read.
func latencyConsumer(a peerArgs) error {
	var h histogram
	return readLog(a, tally{
		add:    func(payload []byte) error { return h.record(payload, time.Now().UnixNano()) },
		report: h.report,
		spin:   true,
	})
}

// report is a latency consumer's report of res and of h's percentiles.
func (h *histogram) report(res result) any {
	return latencyResult{result: res, P50: h.quantile(0.5), P99: h.quantile(0.99), P999: h.quantile(0.999)}
}

// histogram counts latencies in buckets of 8 ns below 1 µs and, above, of
// 1/32 of their power of two (within 3.2%), up to 2^63 ns.
type histogram struct {
	counts [histLinear + (64-histShift)*32]uint64
	n      uint64
	max    int64
}

const (
	histShift  = 10                  // 1024 ns: where the buckets turn logarithmic
	histLinear = 1 << histShift >> 3 // buckets of 8 ns below that
)

// record adds the latency of a record read at now (ns since the epoch)
// to h: the time since the stamp in its first 8 bytes, unless the stamp
// is 0 (a warm-up record).
func (h *histogram) record(payload []byte, now int64) error {
	if len(payload) < 8 {
		return fmt.Errorf("mq consumer: a %d B record has no time stamp", len(payload))
	}
	stamp := binary.LittleEndian.Uint64(payload)
	if stamp == 0 {
		return nil // a warm-up record: counted and summed, not timed
	}
	h.add(now - int64(stamp))
	return nil
}

func (h *histogram) add(ns int64) {
	ns = max(ns, 0)
	h.max = max(h.max, ns)
	h.counts[bucket(uint64(ns))]++
	h.n++
}

// bucket is the index of the bucket holding ns.
func bucket(ns uint64) int {
	if ns < 1<<histShift {
		return int(ns >> 3)
	}
	e := bits.Len64(ns) // ns lies in [2^(e-1), 2^e)
	return histLinear + (e-1-histShift)*32 + int(ns>>(e-6)&31)
}

// upper is the upper edge of bucket i, in ns.
func upper(i int) uint64 {
	if i < histLinear {
		return uint64(i+1) << 3
	}
	i -= histLinear
	e := i/32 + histShift + 1
	return uint64(32+i%32+1) << (e - 6)
}

// quantile is the upper edge of the bucket holding quantile q, or the
// largest latency seen if that is lower.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return float64(min(upper(i), uint64(h.max)))
		}
	}
	return float64(h.max)
}
