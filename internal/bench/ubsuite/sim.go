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
		{Name: "sim-latency", Unit: "ns", Better: "lower", Latency: true, Verdict: simLatencyVerdict, Contenders: []bench.Contender{
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

// The simulator's own lateness, as simLatency reports it each round: its
// Stats of the completions the writes waited for (in ns), and how many came
// early.
const (
	extraSimLateP50 = "sim-late-p50-ns"
	extraSimLateP99 = "sim-late-p99-ns"
	extraSimEarly   = "sim-early"
)

// simLatency times 64-byte writes from n0 to n1, one at a time, from post to
// completion, and reports what the simulator counted of its own lateness.
func simLatency(d time.Duration) (bench.Measurement, error) {
	s, err := simSession()
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	wr := []ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: s.seg, Len: 64}, Remote: ub.Remote{Seg: s.remote}}}
	comp := make([]ub.Completion, 1)
	// One deadline for the whole run: a timeout made and cancelled per
	// write (an allocation, a timer set and stopped) was timed with it.
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	var samples []float64
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		bench.Fill(s.seg.Bytes()[:64], uint64(len(samples)))
		if _, err := s.j.PostSend(wr); err != nil {
			return bench.Measurement{}, err
		}
		if err := waitOne(ctx, s.cq, comp); err != nil {
			return bench.Measurement{}, err
		}
		samples = append(samples, float64(time.Since(t0)))
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	st := s.c.(*simprov.Context).Stats().Completions
	return bench.Measurement{Value: sorted[len(sorted)/2], Samples: samples, Extra: map[string]float64{
		extraSimLateP50: float64(st.P50), extraSimLateP99: float64(st.P99), extraSimEarly: float64(st.Early),
	}}, nil
}

// The targets of sim-latency: the simulator holds the configured latency
// within these fractions at p50 and p99, on a loaded 2-vCPU machine.
const (
	simTargetP50 = 0.05
	simTargetP99 = 0.20
)

// simLatencyVerdict says whether sim-latency held the configured latency
// within the targets and, if not, by how much the simulator was late.
func simLatencyVerdict(r bench.Result) string {
	u, ok := r.Detail["ubkit"]
	want := r.Baselines["configured"]
	if !ok || u.P50 <= 0 || want <= 0 {
		return "no verdict: the run has no latency samples or no configured latency"
	}
	us := func(ns float64) string { return fmt.Sprintf("%.1f µs", ns/1e3) }
	over50, over99 := u.P50/want-1, u.P99/want-1
	figures := fmt.Sprintf("p50 %s (%+.1f%%, target %.0f%%), p99 %s (%+.1f%%, target %.0f%%) against the configured %s",
		us(u.P50), 100*over50, 100*simTargetP50, us(u.P99), 100*over99, 100*simTargetP99, us(want))
	median := func(name string) float64 {
		v := slices.Sorted(slices.Values(u.Extra[name]))
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	own := fmt.Sprintf("by its own count %s at p50 and %s at p99, the median of %d rounds", us(median(extraSimLateP50)), us(median(extraSimLateP99)), len(u.Extra[extraSimLateP99]))
	bug, early := "", 0.0
	for _, n := range u.Extra[extraSimEarly] {
		early += n
	}
	if early > 0 {
		// Never meant to happen: said first.
		bug = fmt.Sprintf("%.0f completions came EARLY (a simulator bug); ", early)
	}
	if over50 <= simTargetP50 && over99 <= simTargetP99 {
		return fmt.Sprintf("%sheld its targets: %s; the simulator was late %s", bug, figures, own)
	}
	return fmt.Sprintf("%sMISSED its targets: %s; the simulator was late by %s at p50 and %s at p99 (%s): links look slower than configured",
		bug, figures, us(max(0, u.P50-want)), us(max(0, u.P99-want)), own)
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
func waitOne(ctx context.Context, cq ub.CQ, out []ub.Completion) error {
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
