package topology

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{"0", 0, ""},
		{"1048576", 1 << 20, ""},
		{"64GiB", 64 << 30, ""},
		{"64 GiB", 64 << 30, ""},
		{"1.5TiB", 3 << 39, ""},
		{"64Gi", 64 << 30, ""},
		{"512MB", 512e6, ""},
		{"128GB", 128e9, ""},
		{"4kB", 4000, ""},
		{"4KB", 4000, ""},
		{"4KiB", 4096, ""},
		{"2G", 2e9, ""},
		{"1e3B", 1000, ""},
		{"1.1kB", 1100, ""},
		{"8EiB", 0, "too large"},
		{"7EiB", 7 << 60, ""},
		{"-5GiB", -5 << 30, ""},
		{"0.5B", 0, "not a whole number of bytes"},
		{"GiB", 0, "want a number and a unit"},
		{"", 0, "want a number and a unit"},
		{"64XB", 0, `unknown unit "XB"`},
		{"64gib", 0, `unknown unit "gib"`},
		{"64 bytes", 0, `unknown unit "bytes"`},
		{"1.2.3GB", 0, "is not a number"},
		{"1e999999999B", 0, "exponent out of range"},
		{"1e-99999B", 0, "exponent out of range"},
	} {
		got, err := ParseBytes(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseBytes(%q) = %d, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0B"},
		{1023, "1023B"},
		{1024, "1KiB"},
		{64 << 30, "64GiB"},
		{3 << 39, "1.5TiB"},
		{128e9, "128GB"},
		{-5 << 30, "-5GiB"},
		{1<<30 + 1, "1GiB"},
		{math.MaxInt64, "7.99EiB"}, // truncated, never rounded up past the value
		{math.MinInt64, "-8EiB"},
	} {
		if got := FormatBytes(tc.in); got != tc.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// What FormatBytes writes exactly, ParseBytes reads back.
	for _, n := range []int64{0, 1, 1000, 1536, 64 << 30, 3 << 39, 128e9, -7 << 20} {
		if got, err := ParseBytes(FormatBytes(n)); err != nil || got != n {
			t.Errorf("ParseBytes(FormatBytes(%d)) = %d, %v", n, got, err)
		}
	}
}

func TestParseBandwidth(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		err  string
	}{
		{"392GB/s", 392e9, ""},
		{"5GB/s", 5e9, ""},
		{"5 GB/s", 5e9, ""},
		{"1.5GiB/s", 1.5 * (1 << 30), ""},
		{"100Gbit/s", 12.5e9, ""},
		{"100Gbps", 12.5e9, ""},
		{"800Mbit/s", 100e6, ""},
		{"1kB/s", 1000, ""},
		{"1B/s", 1, ""},
		{"1Bps", 1, ""},
		{"5000000000", 5e9, ""},
		{"5e9", 5e9, ""},
		{"2EB/s", 2e18, ""},
		{"-5GB/s", -5e9, ""},
		{"100Gb/s", 0, `ambiguous unit "Gb/s": write GB/s for bytes or Gbit/s for bits`},
		{"5GB", 0, "needs a per-second unit"},
		{"5XB/s", 0, `unknown unit "XB/s"`},
		{"5 furlongs/s", 0, `unknown unit "furlongs/s"`},
		{"fast", 0, "want a number and a unit"},
		{"1e308GB/s", 0, "too large"},
		{".inf", 0, "want a number"},
	} {
		got, err := ParseBandwidth(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseBandwidth(%q) = %g, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || math.Abs(got-tc.want) > 1e-9*math.Abs(tc.want) {
			t.Errorf("ParseBandwidth(%q) = %g, %v; want %g", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatBandwidth(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{392e9, "392GB/s"},
		{5e9, "5GB/s"},
		{1.25e6, "1.25MB/s"},
		{999.999e9, "1TB/s"},
		{12, "12B/s"},
		{0, "0B/s"},
		{-5e9, "-5GB/s"},
		{math.Inf(1), "unlimited"},
		{math.NaN(), "NaN"},
	} {
		if got := FormatBandwidth(tc.in); got != tc.want {
			t.Errorf("FormatBandwidth(%g) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseLatency(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"1us", time.Microsecond, ""},
		{"20µs", 20 * time.Microsecond, ""},
		{"20μs", 20 * time.Microsecond, ""}, // Greek mu
		{"20 us", 20 * time.Microsecond, ""},
		{"500ns", 500, ""},
		{"1.5ms", 1500 * time.Microsecond, ""},
		{"1ms", time.Millisecond, ""},
		{"0", 0, ""},
		{"0.0", 0, ""},
		{"-1us", -time.Microsecond, ""},
		{"5", 0, "missing unit"},
		{"5 parsecs", 0, "use a number and a unit"},
		{"soon", 0, "want a number and a unit"},
		{"", 0, "want a number and a unit"},
	} {
		got, err := ParseLatency(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseLatency(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseLatency(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
