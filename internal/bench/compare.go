package bench

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Role says how a baseline stands to ubkit's contender, and so how the
// report compares the two.
type Role int

const (
	// Alternative is another implementation of the same work, measured in
	// the case's unit: ubkit's value is compared with it ("211x faster",
	// "0.8x the throughput", "adds 59 µs less"). It is the zero value.
	Alternative Role = iota
	// Limit is a bound ubkit's value must stay within: at most it for a
	// lower-is-better unit, at least it for a higher-is-better one.
	Limit
	// Reference is a figure of another kind, shown for scale and never
	// divided by or subtracted from: under an added latency, the latency
	// of the path without what is added. The contender's About says what
	// it is.
	Reference
)

// kind is what a case's values are, which decides how two of them compare.
type kind int

const (
	// rate is a higher-is-better rate: msg/s, GB/s, ops/s. Compared by
	// ratio.
	rate kind = iota
	// duration is a lower-is-better time: ns/op, ns, ms. Compared by ratio,
	// as faster or slower.
	duration
	// amount is a lower-is-better quantity that is not a time (MiB).
	// Compared by ratio, as less or more.
	amount
	// addedDuration is the time something adds over a reference path
	// ("ns added"). Noise can make it come out below zero, so it is
	// compared by difference.
	addedDuration
	// addedAmount is what a run leaves behind or adds ("fds added", "MiB
	// added"), with a target of 0. Compared by difference.
	addedAmount
)

// timeUnits are the time units a case's unit may start with, in ns.
var timeUnits = map[string]float64{"ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}

// kindOf tells a case's kind from its unit and its better direction: a unit
// ending in " added" is a difference from a reference, and a unit whose
// first word (before any "/") is a time unit is a time.
func kindOf(unit, better string) kind {
	base, added := strings.CutSuffix(unit, " added")
	_, isTime := timeUnits[strings.SplitN(base, "/", 2)[0]]
	switch {
	case better == "higher":
		return rate
	case added && isTime:
		return addedDuration
	case added:
		return addedAmount
	case isTime:
		return duration
	}
	return amount
}

// figure is one contender's value with its noise (Stats.Noise; 0 after one
// round, when the noise is unknown).
type figure struct {
	value, noise float64
}

// compare says in words how ubkit's figure u compares with the baseline's
// figure b, for a case of kind k in unit. about is what a Reference is.
func compare(k kind, unit string, role Role, about string, u, b figure) string {
	if role == Reference {
		if about == "" {
			return "reference, not compared"
		}
		return about
	}
	if !finite(u.value) {
		return fmt.Sprintf("not comparable: ubkit's value is %v", u.value)
	}
	if !finite(b.value) {
		return fmt.Sprintf("not comparable: the baseline's value is %v", b.value)
	}
	if k == addedDuration || k == addedAmount {
		return compareDifference(k, unit, role, u, b)
	}
	if role == Limit {
		return compareLimit(k, u.value, b.value)
	}
	switch {
	case b.value == 0:
		return "no ratio: the baseline is 0"
	case b.value < 0:
		return "no ratio: the baseline is below 0 (" + quantity(k, unit, b.value) + ")"
	case u.value < 0:
		return "no ratio: ubkit's value is below 0 (" + quantity(k, unit, u.value) + ")"
	}
	r := u.value / b.value
	switch k {
	case rate:
		return factor(r) + "x the throughput"
	case duration:
		if u.value == 0 {
			return "no ratio: ubkit's value is 0"
		}
		return lessOrMore(r, "faster", "slower", "about as fast")
	}
	if u.value == 0 {
		return "none, against " + quantity(k, unit, b.value)
	}
	return lessOrMore(r, "less", "more", "about the same")
}

// lessOrMore words a ratio r of lower-is-better values: below 1 as
// "<1/r>x <less>", above 1 as "<r>x <more>", and same when the factor
// rounds to 1.0.
func lessOrMore(r float64, less, more, same string) string {
	f, word := r, more
	if r < 1 {
		f, word = 1/r, less
	}
	if s := factor(f); s != "1.0" {
		return s + "x " + word
	}
	return same
}

// compareLimit words a value against a bound it must stay within.
func compareLimit(k kind, u, limit float64) string {
	if k == rate {
		if u >= limit {
			return within(factor(u/limit) + "x the minimum")
		}
		return "below the minimum: " + factor(u/limit) + "x it"
	}
	if u <= limit {
		if u <= 0 || limit <= 0 {
			return "within the limit"
		}
		return within(factor(limit/u) + "x under the limit")
	}
	if limit <= 0 {
		return "over the limit"
	}
	return "over the limit: " + factor(u/limit) + "x it"
}

// within words a value that meets its bound by a factor that may round to
// 1.0.
func within(s string) string {
	if strings.HasPrefix(s, "1.0x ") {
		return "at the limit"
	}
	return s
}

// compareDifference words two differences from a reference (added latency,
// descriptors left behind) by their difference, which, unlike their ratio,
// means something when either is near or below zero.
func compareDifference(k kind, unit string, role Role, u, b figure) string {
	d := u.value - b.value
	if role == Limit {
		if d <= 0 {
			return "within the limit (" + quantity(k, unit, -d) + " under it)"
		}
		return "over the limit by " + quantity(k, unit, d)
	}
	noise := u.noise + b.noise
	switch {
	case d == 0:
		return "the same"
	case math.Abs(d) <= noise:
		return "the same within noise (±" + quantity(k, unit, noise) + ")"
	}
	if k == addedDuration {
		s := "adds " + quantity(k, unit, math.Abs(d)) + " less"
		if d > 0 {
			s = "adds " + quantity(k, unit, d) + " more"
		}
		// The ratio of two additions means something only when both
		// stand clear of their noise.
		if u.value > u.noise && b.value > b.noise {
			s += " (" + lessOrMore(u.value/b.value, "less", "more", "about as much") + ")"
		}
		return s
	}
	fewer := "less"
	if whole(u.value) && whole(b.value) {
		fewer = "fewer" // a count, such as descriptors
	}
	if d > 0 {
		return quantity(k, unit, d) + " more"
	}
	return quantity(k, unit, -d) + " " + fewer
}

// note explains ubkit's own value where a reader needs it: an added
// latency or amount below zero, which cannot be what the case adds.
func note(k kind, unit string, u figure) string {
	if (k != addedDuration && k != addedAmount) || !(u.value < 0) {
		return ""
	}
	q := quantity(k, unit, u.value)
	if -u.value <= u.noise {
		return "within noise: " + q + " (±" + quantity(k, unit, u.noise) + ")"
	}
	if k == addedDuration {
		return q + ": the path measured quicker with it than without"
	}
	return q + ": less held after the run than before"
}

// spread words how far a contender's rounds ranged, for the table's
// spread column: half their range as a percentage of a positive value, or
// for differences from a reference (which hover near zero) in the case's
// unit.
func spread(k kind, st Stats) string {
	half := (st.Max - st.Min) / 2
	if st.Rounds < 2 || !finite(half) || !finite(st.value()) {
		return ""
	}
	if k == addedDuration || k == addedAmount || st.value() <= 0 {
		return "±" + human(half)
	}
	return fmt.Sprintf("±%.0f%%", 100*half/st.value())
}

// factor formats a ratio with the precision it deserves: 211, 6.3, 0.43.
func factor(x float64) string {
	switch {
	case x >= 1e4:
		return "over 10000"
	case x >= 10:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case x >= 1:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case x == 0:
		return "0"
	case x < 0.001:
		return "under 0.001"
	}
	if s := strconv.FormatFloat(x, 'g', 2, 64); s != "1" {
		return s
	}
	return "1.0"
}

// quantity formats v in the case's unit, without its " added": a time in
// ns, µs, ms or s as suits it, anything else in its own unit ("1998 fds",
// "0.4 MiB").
func quantity(k kind, unit string, v float64) string {
	base := strings.TrimSuffix(unit, " added")
	if k != duration && k != addedDuration {
		return significant(v) + " " + base
	}
	ns := v * timeUnits[strings.SplitN(base, "/", 2)[0]]
	a := math.Abs(ns)
	switch {
	case a < 1e3:
		return significant(ns) + " ns"
	case a < 1e6:
		return significant(ns/1e3) + " µs"
	case a < 1e9:
		return significant(ns/1e6) + " ms"
	}
	return significant(ns/1e9) + " s"
}

// significant formats v to three significant digits, without trailing
// zeros: 3.1, 59, 124, 1998, 0.04.
func significant(v float64) string {
	a := math.Abs(v)
	var s string
	switch {
	case a >= 100 || a == 0:
		s = strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 2, 64)
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func whole(v float64) bool { return v == math.Trunc(v) }
