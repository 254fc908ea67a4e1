package ubsuite

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// The sim cases measure what a simulated link delivers against what the
// topology configures, on dev4 (20 µs, 5 GB/s links, slower than this
// host's shared memory so the simulator can honour them): this process plays
// n0, the peer n1.

func simCases() []bench.Case {
	configured := func(bytes int64, bandwidth bool) bench.Contender {
		return bench.Contender{Name: "configured", Run: func(time.Duration) (bench.Measurement, error) {
			t, err := topology.Example("dev4")
			if err != nil {
				return bench.Measurement{}, err
			}
			c, err := t.PathCost("n0", "n1", bytes)
			if err != nil {
				return bench.Measurement{}, err
			}
			if bandwidth {
				return bench.Measurement{Value: c.Bandwidth / 1e9}, nil
			}
			return bench.Measurement{Value: float64(c.Transfer), Samples: []float64{float64(c.Transfer)}}, nil
		}}
	}
	return []bench.Case{
		{Name: "sim-latency", Unit: "ns", Better: "lower", Latency: true, Contenders: []bench.Contender{
			{Name: "ubkit", Run: simLatency}, configured(64, false)}},
		{Name: "sim-bandwidth-1MiB", Unit: "GB/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: simBandwidth}, configured(mib, true)}},
	}
}

func simSession() (*session, error) {
	opts := func(node string) map[string]string {
		return map[string]string{simprov.OptTopology: "dev4", simprov.OptNode: node}
	}
	return startSessionWith(peerArgs{Provider: simprov.Name, Options: opts("n1")}, opts("n0"))
}

// simLatency times 64-byte writes from n0 to n1, one at a time, from post to
// completion.
func simLatency(d time.Duration) (bench.Measurement, error) {
	s, err := simSession()
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	wr := []ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: s.seg, Len: 64}, Remote: ub.Remote{Seg: s.remote}}}
	comp := make([]ub.Completion, 1)
	var samples []float64
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		bench.Fill(s.seg.Bytes()[:64], uint64(len(samples)))
		if _, err := s.j.PostSend(wr); err != nil {
			return bench.Measurement{}, err
		}
		if err := waitOne(s.cq, comp); err != nil {
			return bench.Measurement{}, err
		}
		samples = append(samples, float64(time.Since(t0)))
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return bench.Measurement{Value: sorted[len(sorted)/2], Samples: samples}, nil
}

// simBandwidth streams 1 MiB writes from n0 to n1 with four in flight.
func simBandwidth(d time.Duration) (bench.Measurement, error) {
	s, err := simSession()
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	const inflight = segSize / mib
	comp := make([]ub.Completion, inflight)
	posted, done := 0, 0
	start := time.Now()
	for time.Since(start) < d || done < posted {
		for posted-done < inflight && time.Since(start) < d {
			off := (posted % inflight) * mib
			bench.Fill(s.seg.Bytes()[off:off+mib], uint64(posted))
			wr := []ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: s.seg, Offset: off, Len: mib}, Remote: ub.Remote{Seg: s.remote, Offset: off}}}
			if _, err := s.j.PostSend(wr); err != nil {
				return bench.Measurement{}, err
			}
			posted++
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := s.cq.Wait(ctx)
		cancel()
		if err != nil {
			return bench.Measurement{}, err
		}
		n, err := s.cq.Poll(comp)
		if err != nil {
			return bench.Measurement{}, err
		}
		for _, c := range comp[:n] {
			if c.Status != ub.StatusSuccess {
				return bench.Measurement{}, c.Err()
			}
		}
		done += n
	}
	el := time.Since(start)
	return bench.Measurement{Value: float64(done) * mib / el.Seconds() / 1e9}, nil
}

// waitOne waits for exactly one completion and checks it succeeded.
func waitOne(cq ub.CQ, out []ub.Completion) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if err := cq.Wait(ctx); err != nil {
			return err
		}
		n, err := cq.Poll(out[:1])
		if err != nil {
			return err
		}
		if n == 1 {
			if out[0].Status != ub.StatusSuccess {
				return fmt.Errorf("completion: %w", out[0].Err())
			}
			return nil
		}
	}
}
