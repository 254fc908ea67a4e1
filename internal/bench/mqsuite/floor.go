package mqsuite

import (
	"context"
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/shm"
)

// The floor of log-100B-p99 (contender "spin-floor"): the same schedule
// and histogram through the least two processes can do. The producer
// writes each record's stamp into a ring of 8-byte words in a shared
// segment and publishes its count; the consumer spins on the count, reads
// the stamp and takes the time (waiting as mq's readers wait, without
// ever parking). No log, no headers, no payload, no
// checksum: what it measures is the time either process spends off its
// CPU (the kernel's tick, the hypervisor, any third thread) while both
// spin on a machine's CPUs, which no queue between them can do better
// than.
const (
	floorRing  = 1 << 16    // stamps
	floorPub   = 0          // word: stamps published
	floorCons  = 16         // word (its own cache line): stamps read
	floorFirst = 32         // word: the ring
	floorEnd   = ^uint64(0) // the stamp that ends the stream
	floorSize  = (floorFirst + floorRing) * 8
)

func init() {
	registerPeer("mq-floor-latency", floorConsumer)
}

// floorArgs name the floor's segment.
type floorArgs struct {
	Segment string `json:"segment"`
}

var floorCounter atomic.Uint64

// floorLatency runs the floor for d after logLatency's warm-up, offering
// rate stamps a second, and reports the p99 in µs.
func floorLatency(d time.Duration, rate int) (bench.Measurement, error) {
	name := fmt.Sprintf("bench-floor-%d-%d", os.Getpid(), floorCounter.Add(1))
	seg, err := shm.CreateSegment(name, floorSize, nil)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer seg.Close()
	w, err := seg.Uint64s(0, floorFirst+floorRing)
	if err != nil {
		return bench.Measurement{}, err
	}
	peer, err := startConsumer("floor consumer", "mq-floor-latency", floorArgs{Segment: name})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer peer.Kill()
	if err := peer.expect("ready"); err != nil {
		return bench.Measurement{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), warmUpFor(d)+d+30*time.Second)
	defer cancel()
	interval := time.Second / time.Duration(rate)
	var n, sum uint64
	publish := func(stamp uint64) error {
		for n-w[floorCons].Load() >= floorRing { // full: the consumer is behind
			select {
			case <-peer.Done():
				return fmt.Errorf("floor consumer: gone with %d stamps unread: %v", floorRing, peer.Err())
			case <-ctx.Done():
				return fmt.Errorf("floor consumer: %d stamps behind: %w", floorRing, ctx.Err())
			default:
			}
		}
		w[floorFirst+n%floorRing].Store(stamp)
		n++
		w[floorPub].Store(n)
		return nil
	}
	send := func(_, stamp uint64) error {
		sum += stamp
		return publish(stamp)
	}
	if _, err := paced(warmUpFor(d), interval, false, send); err != nil {
		return bench.Measurement{}, err
	}
	start := time.Now()
	timed, err := paced(d, interval, true, send)
	if err != nil {
		return bench.Measurement{}, err
	}
	sent := float64(timed) / time.Since(start).Seconds()
	count := n
	if err := publish(floorEnd); err != nil {
		return bench.Measurement{}, err
	}
	return latencyReport(peer, count, sum, sent)
}

// floorConsumer reads the floor's stamps until the end one and reports
// their latency percentiles, the count and the sum of the stamps.
func floorConsumer(a floorArgs) error {
	seg, err := shm.OpenSegment(a.Segment)
	if err != nil {
		return err
	}
	defer seg.Close()
	w, err := seg.Uint64s(0, floorFirst+floorRing)
	if err != nil {
		return err
	}
	fmt.Println("ready")
	var h histogram
	var res result
	deadline := time.Now().Add(10 * time.Minute)
	// The wait of mq's readers before they park (shm.Backoff: spin,
	// then sched_yield at every checkpoint), without the park.
	bo := shm.Backoff{Spin: math.MaxInt64}
	for got, spins := uint64(0), 0; ; spins++ {
		pub := w[floorPub].Load()
		if pub == got {
			if spins&(1<<20-1) == 0 && time.Now().After(deadline) {
				return fmt.Errorf("floor consumer: no end after %d stamps", got)
			}
			bo.Pause()
			continue
		}
		bo.Reset()
		if pub-got > floorRing {
			return fmt.Errorf("floor consumer: %d stamps published, %d read: overrun", pub, got)
		}
		for ; got < pub; got++ {
			stamp := w[floorFirst+got%floorRing].Load()
			w[floorCons].Store(got + 1)
			if stamp == floorEnd {
				bench.PeerFinished()
				return tally{report: h.report}.print(res)
			}
			if stamp != 0 { // 0: a warm-up stamp
				h.add(time.Now().UnixNano() - int64(stamp))
			}
			res.N++
			res.Sum += stamp
		}
	}
}
