package bench

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestKindOf(t *testing.T) {
	for _, c := range []struct {
		unit, better string
		want         kind
	}{
		{"msg/s", "higher", rate},
		{"GB/s", "higher", rate},
		{"queries/s", "higher", rate},
		{"ns/op", "lower", duration},
		{"ns", "lower", duration},
		{"ms", "lower", duration},
		{"MiB", "lower", amount},
		{"ns added", "lower", addedDuration},
		{"fds added", "lower", addedAmount},
		{"MiB added", "lower", addedAmount},
	} {
		if got := kindOf(c.unit, c.better); got != c.want {
			t.Errorf("kindOf(%q, %q) = %v, want %v", c.unit, c.better, got, c.want)
		}
	}
}

// TestCompare: every kind of case, worded against its baselines, including
// zero, negative, NaN, infinite and tiny values.
func TestCompare(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, c := range []struct {
		unit, better string
		role         Role
		u, b         figure
		want         string
	}{
		// Latency and other times: ratio, as faster or slower.
		{"ns/op", "lower", Alternative, figure{241, 10}, figure{47800, 100}, "198x faster"},
		{"ns/op", "lower", Alternative, figure{24000, 0}, figure{47800, 0}, "2.0x faster"},
		{"ns/op", "lower", Alternative, figure{130, 0}, figure{100, 0}, "1.3x slower"},
		{"ns/op", "lower", Alternative, figure{101, 0}, figure{100, 0}, "about as fast"},
		{"ns", "lower", Alternative, figure{1, 0}, figure{1e9, 0}, "over 10000x faster"},
		{"ns/op", "lower", Alternative, figure{100, 0}, figure{1e-300, 0}, "over 10000x slower"},
		{"ns/op", "lower", Alternative, figure{0, 0}, figure{100, 0}, "no ratio: ubkit's value is 0"},
		{"ns/op", "lower", Alternative, figure{100, 0}, figure{0, 0}, "no ratio: the baseline is 0"},
		{"ns/op", "lower", Alternative, figure{100, 0}, figure{-3, 0}, "no ratio: the baseline is below 0 (-3 ns)"},
		{"ms", "lower", Alternative, figure{-2, 0}, figure{3, 0}, "no ratio: ubkit's value is below 0 (-2 ms)"},
		{"ns/op", "lower", Alternative, figure{nan, 0}, figure{100, 0}, "not comparable: ubkit's value is NaN"},
		{"ns/op", "lower", Alternative, figure{100, 0}, figure{inf, 0}, "not comparable: the baseline's value is +Inf"},
		// Throughput: ratio.
		{"msg/s", "higher", Alternative, figure{153.7e6, 0}, figure{24.5e6, 0}, "6.3x the throughput"},
		{"GB/s", "higher", Alternative, figure{2, 0}, figure{2.5, 0}, "0.8x the throughput"},
		{"ops/s", "higher", Alternative, figure{1.99, 0}, figure{2, 0}, "0.99x the throughput"},
		{"ops/s", "higher", Alternative, figure{1.999, 0}, figure{2, 0}, "1.0x the throughput"},
		{"GB/s", "higher", Alternative, figure{2, 0}, figure{1e-300, 0}, "over 10000x the throughput"},
		{"GB/s", "higher", Alternative, figure{1e-300, 0}, figure{2, 0}, "under 0.001x the throughput"},
		{"GB/s", "higher", Alternative, figure{0, 0}, figure{2, 0}, "0x the throughput"},
		{"GB/s", "higher", Alternative, figure{2, 0}, figure{0, 0}, "no ratio: the baseline is 0"},
		{"GB/s", "higher", Alternative, figure{2, 0}, figure{-inf, 0}, "not comparable: the baseline's value is -Inf"},
		// Amounts that are not times: ratio, as less or more.
		{"MiB", "lower", Alternative, figure{20, 0}, figure{400, 0}, "20x less"},
		{"MiB", "lower", Alternative, figure{500, 0}, figure{400, 0}, "1.2x more"},
		{"MiB", "lower", Alternative, figure{0, 0}, figure{400, 0}, "none, against 400 MiB"},
		// Limits.
		{"ms", "lower", Limit, figure{45, 0}, figure{1000, 0}, "22x under the limit"},
		{"ms", "lower", Limit, figure{1000, 0}, figure{1000, 0}, "at the limit"},
		{"ms", "lower", Limit, figure{1300, 0}, figure{1000, 0}, "over the limit: 1.3x it"},
		{"ms", "lower", Limit, figure{0, 0}, figure{1000, 0}, "within the limit"},
		{"ms", "lower", Limit, figure{5, 0}, figure{0, 0}, "over the limit"},
		{"MiB", "lower", Limit, figure{200, 0}, figure{1024, 0}, "5.1x under the limit"},
		{"queries/s", "higher", Limit, figure{3.2e6, 0}, figure{1e6, 0}, "3.2x the minimum"},
		{"queries/s", "higher", Limit, figure{0.8e6, 0}, figure{1e6, 0}, "below the minimum: 0.8x it"},
		{"fds added", "lower", Limit, figure{3, 0}, figure{10, 0}, "within the limit (7 fds under it)"},
		{"fds added", "lower", Limit, figure{12, 0}, figure{10, 0}, "over the limit by 2 fds"},
		// Added latency: never divided by the reference, compared with
		// another added latency by difference.
		{"ns added", "lower", Reference, figure{1000, 0}, figure{123700, 0}, "reference, not compared"},
		{"ns added", "lower", Alternative, figure{1000, 500}, figure{60000, 2000}, "adds 59 µs less (60x less)"},
		{"ns added", "lower", Alternative, figure{20000, 1000}, figure{60000, 2000}, "adds 40 µs less (3.0x less)"},
		{"ns added", "lower", Alternative, figure{70000, 3000}, figure{60000, 2000}, "adds 10 µs more (1.2x more)"},
		{"ns added", "lower", Alternative, figure{62000, 3000}, figure{60000, 2000}, "the same within noise (±5 µs)"},
		{"ns added", "lower", Alternative, figure{-3000, 12000}, figure{60000, 2000}, "adds 63 µs less"},
		{"ns added", "lower", Alternative, figure{70000, 0}, figure{-5000, 0}, "adds 75 µs more"},
		{"ns added", "lower", Alternative, figure{1.5e6, 0}, figure{300, 0}, "adds 1.5 ms more (5000x more)"},
		{"ns added", "lower", Alternative, figure{0, 0}, figure{0, 0}, "the same"},
		{"ns added", "lower", Alternative, figure{nan, 0}, figure{0, 0}, "not comparable: ubkit's value is NaN"},
		// Counts and amounts left behind: difference.
		{"fds added", "lower", Alternative, figure{0, 0}, figure{0, 0}, "the same"},
		{"fds added", "lower", Alternative, figure{2000, 0}, figure{0, 0}, "2000 fds more"},
		{"fds added", "lower", Alternative, figure{0, 0}, figure{2, 0}, "2 fds fewer"},
		{"MiB added", "lower", Alternative, figure{0.12, 0.3}, figure{-0.05, 0.1}, "the same within noise (±0.4 MiB)"},
		{"MiB added", "lower", Alternative, figure{4.5, 0.3}, figure{0.05, 0.1}, "4.45 MiB more"},
		{"MiB added", "lower", Alternative, figure{0.05, 0}, figure{4.5, 0}, "4.45 MiB less"},
		{"MiB added", "lower", Alternative, figure{1e-9, 0}, figure{0, 0}, "1e-09 MiB more"},
	} {
		k := kindOf(c.unit, c.better)
		if got := compare(k, c.unit, c.role, "", c.u, c.b); got != c.want {
			t.Errorf("%s %s role %d, ubkit %v against %v: %q, want %q", c.unit, c.better, c.role, c.u, c.b, got, c.want)
		}
	}
}

// TestCompareReferenceAbout: a reference shows what it is instead of a
// comparison.
func TestCompareReferenceAbout(t *testing.T) {
	if got := compare(addedDuration, "ns added", Reference, "the direct call's p50", figure{-5000, 0}, figure{0, 0}); got != "the direct call's p50" {
		t.Errorf("got %q", got)
	}
}

// TestNote: ubkit's own value gets a note only where it is an added
// latency or amount below zero.
func TestNote(t *testing.T) {
	for _, c := range []struct {
		unit string
		u    figure
		want string
	}{
		{"ns added", figure{-3000, 12000}, "within noise: -3 µs (±12 µs)"},
		{"ns added", figure{-3000, 3000}, "within noise: -3 µs (±3 µs)"},
		{"ns added", figure{-7400, 1000}, "-7.4 µs: the path measured quicker with it than without"},
		{"ns added", figure{-7400, 0}, "-7.4 µs: the path measured quicker with it than without"},
		{"ns added", figure{3000, 12000}, ""},
		{"ns added", figure{0, 0}, ""},
		{"ns added", figure{math.NaN(), 0}, ""},
		{"MiB added", figure{-0.3, 1}, "within noise: -0.3 MiB (±1 MiB)"},
		{"MiB added", figure{-3, 1}, "-3 MiB: less held after the run than before"},
		{"ns/op", figure{-5, 0}, ""},
		{"msg/s", figure{0, 0}, ""},
	} {
		if got := note(kindOf(c.unit, "lower"), c.unit, c.u); got != c.want {
			t.Errorf("note(%s, %v) = %q, want %q", c.unit, c.u, got, c.want)
		}
	}
}

func TestSpread(t *testing.T) {
	for _, c := range []struct {
		unit string
		st   Stats
		want string
	}{
		{"ns/op", Stats{Median: 1000, Min: 950, Max: 1050, Rounds: 3}, "±5%"},
		{"ns/op", Stats{Median: 1000, P50: 2000, Min: 950, Max: 1050, Rounds: 3}, "±2%"},
		{"ns/op", Stats{Median: 1000, Min: 1000, Max: 1000, Rounds: 1}, ""},
		{"ns/op", Stats{Median: 0, Min: 0, Max: 100, Rounds: 3}, "±50"},
		{"ns/op", Stats{Median: math.NaN(), Min: 0, Max: 100, Rounds: 3}, ""},
		{"ns added", Stats{Median: -2100, Min: -30000, Max: 27264, Rounds: 3}, "±28.6k"},
		{"ns added", Stats{Median: 1000, Min: 500, Max: 1500, Rounds: 5}, "±500"},
		{"fds added", Stats{Rounds: 3}, "±0"},
	} {
		if got := spread(kindOf(c.unit, "lower"), c.st); got != c.want {
			t.Errorf("spread(%s, %+v) = %q, want %q", c.unit, c.st, got, c.want)
		}
	}
}

// TestNoise: a contender's noise is the median distance of its rounds
// from their median, which one spoiled round does not move.
func TestNoise(t *testing.T) {
	for _, c := range []struct {
		values []float64
		want   float64
	}{
		{[]float64{35e3, 36e3, 3.9e6}, 1e3},
		{[]float64{10, 20, 30, 40, 1e9}, 10},
		{[]float64{7}, 0},
		{[]float64{5, 5, 5}, 0},
	} {
		if got := summarize(c.values, nil, false).Noise; got != c.want {
			t.Errorf("noise of %v = %v, want %v", c.values, got, c.want)
		}
	}
}

func TestHuman(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 3.14159: "3.14", 241: "241", 9999: "9999", 123700: "123.7k", 1.2e6: "1.20M", 3.5e9: "3.50G",
		-2100: "-2100", -28632: "-28.6k", -0.5: "-0.5", math.Inf(1): "+Inf", math.Inf(-1): "-Inf",
	} {
		if got := human(v); got != want {
			t.Errorf("human(%v) = %q, want %q", v, got, want)
		}
	}
	if got := human(math.NaN()); got != "NaN" {
		t.Errorf("human(NaN) = %q", got)
	}
}

// TestTableEveryKind runs a report with a case of each kind and checks
// that each row of the table says what it means: words, not bare or
// negative ratios, and no percentage of a negative value.
func TestTableEveryKind(t *testing.T) {
	fixed := func(name string, role Role, values ...float64) Contender {
		i := 0
		return Contender{Name: name, Role: role, About: "the direct call, for scale", Run: func(time.Duration) (Measurement, error) {
			v := values[i%len(values)]
			i++
			return Measurement{Value: v}, nil
		}}
	}
	cases := []Case{
		{Name: "stream", Unit: "msg/s", Better: "higher", Contenders: []Contender{fixed("ubkit", 0, 150e6), fixed("uds", 0, 25e6)}},
		{Name: "op", Unit: "ns/op", Better: "lower", Contenders: []Contender{fixed("ubkit", 0, 240), fixed("uds", 0, 47800)}},
		{Name: "load", Unit: "ms", Better: "lower", Contenders: []Contender{fixed("ubkit", 0, 45), fixed("limit", Limit, 1000)}},
		{Name: "proxy-added", Unit: "ns added", Better: "lower", Contenders: []Contender{
			fixed("ubkit", 0, -30000, -2100, 20000), fixed("direct-tcp", Reference, 123700), fixed("haproxy-mtls", 0, 60000, 61000, 59000)}},
		{Name: "connect-close/fds", Unit: "fds added", Better: "lower", Contenders: []Contender{fixed("ubkit", 0, 0), fixed("uds", 0, 0)}},
	}
	rep, err := Run("s", cases, Options{Rounds: 3})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	table := b.String()
	for _, want := range [][]string{
		{"stream", "ubkit", "150.00M"},
		{"uds", "25.00M", "6.0x the throughput"},
		{"uds", "47.8k", "199x faster"},
		{"limit", "1000", "22x under the limit"},
		{"proxy-added", "ubkit", "-2100", "±25.0k", "within noise: -2.1 µs (±22.1 µs)"},
		{"direct-tcp", "123.7k", "ns ", "±0%", "the direct call, for scale"},
		{"haproxy-mtls", "60.0k", "ns added", "adds 62.1 µs less"},
		{"connect-close/fds", "ubkit", "0", "fds added"},
		{"uds", "0", "the same"},
	} {
		if !hasRow(table, want) {
			t.Errorf("no row with %q in:\n%s", want, table)
		}
	}
	for _, bad := range []string{"0.00x", "-0.0", "±-", "NaN"} {
		if strings.Contains(table, bad) {
			t.Errorf("table has %q:\n%s", bad, table)
		}
	}
	added := rep.Results[3]
	if added.Note != "within noise: -2.1 µs (±22.1 µs)" || added.Compare["direct-tcp"] != "the direct call, for scale" || added.Roles["direct-tcp"] != "reference" || added.Compare["haproxy-mtls"] != "adds 62.1 µs less" {
		t.Errorf("JSON words: note %q, compare %v", added.Note, added.Compare)
	}
}

// hasRow says whether a line of table holds each of cells, in order.
func hasRow(table string, cells []string) bool {
	for line := range strings.Lines(table) {
		rest, ok := line, true
		for _, c := range cells {
			i := strings.Index(rest, c)
			if i < 0 {
				ok = false
				break
			}
			rest = rest[i+len(c):]
		}
		if ok {
			return true
		}
	}
	return false
}
