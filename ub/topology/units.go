package topology

import (
	"fmt"
	"math"
	"math/big"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Units accepted by ParseBytes and ParseBandwidth, for error messages.
const (
	bytesUnits     = "B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB (or Ki, Mi, Gi, k, M, G, ...)"
	bandwidthUnits = "B/s, kB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s, TiB/s, Mbit/s, Gbit/s, Gbps, ..."
)

// ParseBytes parses a size such as "64GiB", "1.5TiB", "512MB", "64Gi" or
// "1048576" (a plain number is bytes). Binary prefixes (Ki, Mi, Gi, Ti, Pi,
// Ei, with or without a trailing B) are powers of 1024, decimal ones (k, M, G,
// T, P, E) powers of 1000; the prefix letter may be either case. The result
// must be a whole number of bytes that fits in an int64; it may be negative
// (validation rejects negative sizes with a clearer message).
func ParseBytes(s string) (int64, error) {
	num, unit := splitQuantity(s)
	if num == "" {
		return 0, fmt.Errorf("invalid size %q: want a number and a unit such as 64GiB", s)
	}
	mult, ok := byteMultiplier(strings.TrimSuffix(unit, "B"), unit == "" || strings.HasSuffix(unit, "B"))
	if !ok {
		return 0, fmt.Errorf("invalid size %q: unknown unit %q (use %s)", s, unit, bytesUnits)
	}
	r, err := parseExact(num)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %v", s, err)
	}
	r.Mul(r, new(big.Rat).SetInt64(mult))
	if !r.IsInt() {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	if !r.Num().IsInt64() {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return r.Num().Int64(), nil
}

// byteMultiplier returns the multiplier of a unit prefix ("", "k", "Gi",
// ...). A bare decimal prefix without B ("64G") is accepted, as Kubernetes
// quantities write it; hasB reports whether the unit ended in B.
func byteMultiplier(prefix string, hasB bool) (int64, bool) {
	if prefix == "" {
		return 1, hasB
	}
	binary := false
	if len(prefix) == 2 && prefix[1] == 'i' {
		binary = true
		prefix = prefix[:1]
	}
	if len(prefix) != 1 {
		return 0, false
	}
	exp := strings.IndexByte("kmgtpe", lower(prefix[0])) + 1
	if exp == 0 {
		return 0, false
	}
	base := int64(1000)
	if binary {
		base = 1024
	}
	m := int64(1)
	for range exp {
		m *= base
	}
	return m, true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// parseExact parses a decimal number exactly. The exponent is bounded so
// that a hostile "1e999999999" cannot make big.Rat allocate gigabytes.
func parseExact(num string) (*big.Rat, error) {
	mant, exp, hasExp := strings.Cut(strings.ToLower(num), "e")
	if hasExp {
		e, err := strconv.Atoi(exp)
		if err != nil || e < -60 || e > 60 {
			return nil, fmt.Errorf("exponent out of range")
		}
	}
	if len(mant) > 40 {
		return nil, fmt.Errorf("too many digits")
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return nil, fmt.Errorf("%q is not a number", num)
	}
	return r, nil
}

// splitQuantity splits "1.5 GiB" into "1.5" and "GiB". The number is an
// optional sign, digits with at most one '.', and an exponent only if 'e' is
// followed by a digit (so "5EB/s" is 5 exabytes per second, not 5e...).
func splitQuantity(s string) (num, unit string) {
	s = strings.TrimSpace(s)
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	digits := 0
	for i < len(s) && (isDigit(s[i]) || s[i] == '.') {
		if isDigit(s[i]) {
			digits++
		}
		i++
	}
	if digits == 0 {
		return "", s
	}
	if i+1 < len(s) && (s[i] == 'e' || s[i] == 'E') {
		j := i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && isDigit(s[j]) {
			for j < len(s) && isDigit(s[j]) {
				j++
			}
			i = j
		}
	}
	return s[:i], strings.TrimSpace(s[i:])
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// FormatBytes formats a size the way ParseBytes reads it: with a binary
// unit when that is exact to two decimals ("64GiB", "1.5TiB"), else a decimal
// one ("128GB"), else a binary one rounded to two decimals.
func FormatBytes(n int64) string {
	if n == 0 {
		return "0B"
	}
	sign := ""
	u := uint64(n)
	if n < 0 {
		sign = "-"
		u = uint64(-n) // MinInt64 stays MinInt64, whose uint64 is right
	}
	fallback := ""
	for _, base := range []uint64{1024, 1000} {
		prefixes := []string{"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}
		if base == 1000 {
			prefixes = []string{"", "k", "M", "G", "T", "P", "E"}
		}
		k, div := 0, uint64(1)
		for k+1 < len(prefixes) && u/div >= base {
			div *= base
			k++
		}
		hi, lo := bits.Mul64(u%div, 100)
		hundredths, rem := bits.Div64(hi, lo, div)
		exact := rem == 0
		s := sign + trimDecimals(strconv.FormatUint(u/div, 10)+"."+fmt.Sprintf("%02d", hundredths)) + prefixes[k] + "B"
		if exact {
			return s
		}
		if fallback == "" {
			fallback = s
		}
	}
	return fallback
}

func trimDecimals(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimRight(s, "0")
		s = strings.TrimSuffix(s, ".")
	}
	return s
}

// ParseBandwidth parses a bandwidth in bytes per second such as "392GB/s",
// "5 GB/s", "1.5GiB/s", "100Gbit/s", "100Gbps" or "5e9" (a plain number is
// bytes per second). Decimal prefixes are powers of 1000, binary ones powers
// of 1024. "Gb/s" is refused as ambiguous: write GB/s for bytes or Gbit/s for
// bits. The result is finite; it may be zero or negative (validation rejects
// those with a clearer message).
func ParseBandwidth(s string) (float64, error) {
	num, unit := splitQuantity(s)
	if num == "" {
		return 0, fmt.Errorf("invalid bandwidth %q: want a number and a unit such as 392GB/s", s)
	}
	mult, err := bandwidthMultiplier(unit)
	if err != nil {
		return 0, fmt.Errorf("invalid bandwidth %q: %v", s, err)
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid bandwidth %q: %q is not a number", s, num)
	}
	v *= mult
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, fmt.Errorf("invalid bandwidth %q: too large", s)
	}
	return v, nil
}

func bandwidthMultiplier(unit string) (float64, error) {
	if unit == "" {
		return 1, nil
	}
	var base string
	switch {
	case strings.HasSuffix(unit, "/s"):
		base = strings.TrimSuffix(unit, "/s")
	case strings.HasSuffix(unit, "ps"):
		base = strings.TrimSuffix(unit, "ps")
		if strings.HasSuffix(base, "b") && !strings.HasSuffix(base, "bit") {
			base += "it" // "Gbps" is gigabits per second by convention
		}
	default:
		return 0, fmt.Errorf("unknown unit %q: a bandwidth needs a per-second unit (use %s)", unit, bandwidthUnits)
	}
	bits := false
	switch {
	case strings.HasSuffix(base, "bit"):
		bits = true
		base = strings.TrimSuffix(base, "bit")
	case strings.HasSuffix(base, "B"):
		base = strings.TrimSuffix(base, "B")
	case strings.HasSuffix(base, "b"):
		return 0, fmt.Errorf("ambiguous unit %q: write %sB/s for bytes or %sbit/s for bits per second", unit, strings.TrimSuffix(base, "b"), strings.TrimSuffix(base, "b"))
	default:
		return 0, fmt.Errorf("unknown unit %q (use %s)", unit, bandwidthUnits)
	}
	m, ok := byteMultiplier(base, true)
	if !ok {
		return 0, fmt.Errorf("unknown unit %q (use %s)", unit, bandwidthUnits)
	}
	if bits {
		return float64(m) / 8, nil
	}
	return float64(m), nil
}

// FormatBandwidth formats bytes per second with a decimal unit and at most
// two decimals: "392GB/s", "5GB/s", "1.25MB/s".
func FormatBandwidth(bps float64) string {
	if math.IsInf(bps, 1) {
		return "unlimited"
	}
	if math.IsNaN(bps) || math.IsInf(bps, -1) {
		return strconv.FormatFloat(bps, 'g', -1, 64)
	}
	units := []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s", "EB/s"}
	v, k := math.Abs(bps), 0
	for k+1 < len(units) && math.Round(v*100)/100 >= 1000 {
		v /= 1000
		k++
	}
	s := trimDecimals(strconv.FormatFloat(v, 'f', 2, 64))
	if bps < 0 {
		s = "-" + s
	}
	return s + units[k]
}

// ParseLatency parses a latency such as "1us", "20µs", "500ns", "1.5ms" or
// "0": time.ParseDuration's syntax (which accepts "us" for microseconds),
// with optional spaces between number and unit. A number other than 0 needs
// a unit.
func ParseLatency(s string) (time.Duration, error) {
	num, unit := splitQuantity(s)
	if num == "" {
		return 0, fmt.Errorf("invalid latency %q: want a number and a unit such as 1us", s)
	}
	if unit == "" {
		if f, err := strconv.ParseFloat(num, 64); err == nil && f == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("invalid latency %q: missing unit (use ns, us, µs, ms or s)", s)
	}
	d, err := time.ParseDuration(num + unit)
	if err != nil {
		return 0, fmt.Errorf("invalid latency %q: use a number and a unit: ns, us, µs, ms or s", s)
	}
	return d, nil
}
