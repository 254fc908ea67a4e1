package ubsuite

import (
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// TestSimLatencyVerdict: the verdict holds sim-latency to 5% at p50 and 20%
// at p99 of the configured latency, says by how much a missed target was
// missed and what the simulator counted itself, and puts early completions
// first.
func TestSimLatencyVerdict(t *testing.T) {
	// Three rounds: the simulator's own figures are given for the middle
	// one, the others at half and twice them; early ones in the last.
	result := func(p50, p99, ownP50, ownP99, early float64) bench.Result {
		return bench.Result{Case: "sim-latency", Baselines: map[string]float64{"configured": 20000}, Detail: map[string]bench.Stats{
			"ubkit": {P50: p50, P99: p99, Extra: map[string][]float64{
				extraSimLateP50: {2 * ownP50, ownP50, ownP50 / 2},
				extraSimLateP99: {ownP99 / 2, 2 * ownP99, ownP99},
				extraSimEarly:   {0, 0, early},
			}},
		}}
	}
	for _, tc := range []struct {
		name string
		r    bench.Result
		want []string
	}{
		{"held", result(20900, 23900, 400, 3000, 0), []string{
			"held its targets", "p50 20.9 µs (+4.5%, target 5%)", "p99 23.9 µs (+19.5%, target 20%)", "configured 20.0 µs", "by its own count 0.4 µs at p50 and 3.0 µs at p99, the median of 3 rounds"}},
		{"p50 missed", result(21100, 23000, 900, 2000, 0), []string{
			"MISSED its targets", "p50 21.1 µs (+5.5%", "late by 1.1 µs at p50 and 3.0 µs at p99", "links look slower than configured"}},
		{"p99 missed", result(20500, 44000, 300, 20000, 0), []string{
			"MISSED its targets", "p99 44.0 µs (+120.0%", "late by 0.5 µs at p50 and 24.0 µs at p99", "by its own count 0.3 µs at p50 and 20.0 µs at p99"}},
		{"early", result(20100, 21000, 0, 100, 2), []string{"2 completions came EARLY (a simulator bug); held its targets"}},
		{"no samples", bench.Result{Detail: map[string]bench.Stats{"ubkit": {Error: "boom"}}}, []string{"no verdict"}},
	} {
		got := simLatencyVerdict(tc.r)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: verdict %q lacks %q", tc.name, got, w)
			}
		}
	}
}
