package mqsuite

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
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
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	interval := time.Second / time.Duration(rate)
	var n, sum uint64
	start := time.Now()
	epoch := start.UnixNano()
	for {
		elapsed := time.Since(start)
		if elapsed >= d {
			break
		}
		for due := uint64(elapsed / interval); n <= due; n++ {
			r, err := l.Loan(ctx, 0, size)
			if err != nil {
				return bench.Measurement{}, err
			}
			b := r.Bytes()
			bench.Fill(b, n)
			binary.LittleEndian.PutUint64(b, uint64(epoch+int64(n)*int64(interval)))
			sum += bench.Sum(b)
			if err := r.Commit(); err != nil {
				return bench.Measurement{}, err
			}
		}
	}
	sent := float64(n) / time.Since(start).Seconds()
	if _, err := l.Send(ctx, 0, nil); err != nil {
		return bench.Measurement{}, err
	}
	var res latencyResult
	if err := peer.report(&res, n, sum); err != nil {
		return bench.Measurement{}, err
	}
	if err := peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: res.P99 / 1e3, Extra: map[string]float64{extraP50: res.P50, extraP999: res.P999, extraRate: sent}}, nil
}

// latencyConsumer reads the log from offset 0 until an empty record and
// reports the latency percentiles of what it read.
func latencyConsumer(a peerArgs) error {
	var h histogram
	return readLog(a, tally{
		add: func(payload []byte) error { return h.record(payload, time.Now().UnixNano()) },
		report: func(res result) any {
			return latencyResult{result: res, P50: h.quantile(0.5), P99: h.quantile(0.99), P999: h.quantile(0.999)}
		},
	})
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
// to h: the time since the stamp in its first 8 bytes.
func (h *histogram) record(payload []byte, now int64) error {
	if len(payload) < 8 {
		return fmt.Errorf("mq consumer: a %d B record has no time stamp", len(payload))
	}
	h.add(now - int64(binary.LittleEndian.Uint64(payload)))
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
