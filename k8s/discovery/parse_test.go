package discovery

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParseNvidiaVersion(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\nGCC version: gcc 12\n", "550.54.15", ""},
		{"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  535.161.08  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 2024\n", "535.161.08", ""},
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.256.02\n", "470.256.02", ""},
		{"NVRM: something\n", "", `no "NVRM version:" line`},
		{"NVRM version: NVIDIA UNIX Kernel Module  beta\n", "", "no version number"},
		{"", "", `no "NVRM version:" line`},
	} {
		got, err := parseNvidiaVersion(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("parseNvidiaVersion(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestParseCPUList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []int
		ok   bool
	}{
		{"0-3,8,10-11\n", []int{0, 1, 2, 3, 8, 10, 11}, true},
		{"\n", nil, true},
		{"5", []int{5}, true},
		{"65534-65535", []int{65534, 65535}, true},
	} {
		got, err := parseCPUList(tc.in)
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("parseCPUList(%q) = %v, %v", tc.in, got, err)
		}
	}
	if cpus, err := parseCPUList("0-65535"); len(cpus) != maxCPUs || cpus[maxCPUs-1] != maxCPUs-1 { // exactly maxCPUs
		t.Errorf("0-65535: %d CPUs, %v", len(cpus), err)
	}
	// Each of these is refused, promptly and without a large allocation:
	// a range whose size overflows (b-a+1 wraps to a negative number) or
	// whose end is the largest int (the loop's c++ would wrap) once looped
	// for ever, appending.
	for _, in := range hostileCPULists {
		if got, err := parseCPUList(in); err == nil {
			t.Errorf("parseCPUList(%.40q) = %d CPUs, want an error", in, len(got))
		}
	}
}

// hostileCPULists are CPU lists a corrupt or hostile sysfs could hold.
var hostileCPULists = []string{
	"3-1", "0-x", "x", "-1", "-", "--", "1-", "-3", "1--2", ",", ",,", "1,,2", "1,", ",1", "1 -2", "1-2 ,3", "+1", "1-+3", "0x10",
	"0-4294967295",
	"0-9223372036854775807",
	"1-9223372036854775807",
	"9223372036854775806-9223372036854775807",
	"9223372036854775807",
	"9223372036854775807-9223372036854775807",
	"0-99999999999999999999",
	"-9223372036854775808-0",
	"65536",
	"0-65536",
	"0-32767,32768-65536",
	"0-65535,0",
	"4,2", "0-3,2-5", "1,1", // the kernel writes CPUs once each, in order
	strings.Repeat("0-65535,", 1000),
	strings.Repeat("1,", maxCPUs),
	strings.Repeat("9", 1<<16),
}

func TestParseSmall(t *testing.T) {
	if v, err := parseHex("0x10de\n"); v != 0x10de || err != nil {
		t.Errorf("parseHex: %x, %v", v, err)
	}
	for _, bad := range []string{"", "10de", "0x", "0xzz", "0x1ffffffff"} {
		if _, err := parseHex(bad); err == nil {
			t.Errorf("parseHex(%q) accepted", bad)
		}
	}
	if v, err := parseHugePageSize("hugepages-1048576kB"); v != 1<<30 || err != nil {
		t.Errorf("parseHugePageSize: %d, %v", v, err)
	}
	for _, bad := range []string{"hugepages-2048", "hugepages-0kB", "huge-2048kB", "hugepages-xkB"} {
		if _, err := parseHugePageSize(bad); err == nil {
			t.Errorf("parseHugePageSize(%q) accepted", bad)
		}
	}
	for _, tc := range []struct {
		name, class string
		index       int
		ok          bool
	}{
		{"hisi_hpre-0", "hpre", 0, true}, {"hisi_sec2-12", "sec", 12, true}, {"hisi_zip-3", "zip", 3, true},
		{"hisi_rde-0", "", 0, false}, {"hisi_zip", "", 0, false}, {"hisi_zip-99999999999999999999", "", 0, false},
	} {
		class, index, ok := parseKAEName(tc.name)
		if class != tc.class || index != tc.index || ok != tc.ok {
			t.Errorf("parseKAEName(%q) = %q, %d, %v", tc.name, class, index, ok)
		}
	}
	if total, free, err := parseNodeMeminfo("Node 0 MemTotal: 10 kB\nNode 0 MemFree: 4 kB\nNode 0 Active: 1 kB\n"); total != 10<<10 || free != 4<<10 || err != nil {
		t.Errorf("parseNodeMeminfo: %d %d %v", total, free, err)
	}
	if _, _, err := parseNodeMeminfo("MemTotal: 10 kB\n"); err == nil {
		t.Error("parseNodeMeminfo accepted a system meminfo")
	}
	// A count of kB that overflows int64 once in bytes (2^53 kB is 2^63
	// bytes) is refused, not negative.
	for _, bad := range []string{"Node 0 MemTotal: 9007199254740992 kB\n", "Node 0 MemTotal: 10 kB\nNode 0 MemFree: 9007199254740991 kB\n", "Node 0 MemTotal: 9223372036854775807 kB\n"} {
		if total, free, err := parseNodeMeminfo(bad); err == nil {
			t.Errorf("parseNodeMeminfo(%q) = %d, %d", bad, total, free)
		}
	}
	kv := parseKeyValues("Version=24.1.rc2\n\nbad line\n=x\nVersion=other\n", '=')
	if len(kv) != 1 || kv["Version"] != "24.1.rc2" {
		t.Errorf("parseKeyValues: %v", kv)
	}
}

func TestParseVersionRanges(t *testing.T) {
	got, err := parseVersionRanges("[6.4.0,6.4.99],[7.0.0,7.7.99]\n")
	if want := []versionRange{{"6.4.0", "6.4.99"}, {"7.0.0", "7.7.99"}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("got %v, %v; want %v", got, err, want)
	}
	if !got[1].contains("7.5.0.1.129") || got[0].contains("7.5.0.1.129") || !got[0].contains("6.4.99") || got[0].contains("6.5") {
		t.Errorf("contains: %v", got)
	}
	for _, bad := range []string{"", "[]", "[7.0.0]", "[7.0.0,7.5.99", "7.0.0,7.5.99", "[7.0.0,7.5.99],", "[7.0.0,7.5.99];[8,9]",
		"[7.5.99,7.0.0]", "[a,b]", "[7 0,8]", strings.Repeat("[1,2],", maxVersionRanges) + "[1,2]"} {
		if r, err := parseVersionRanges(bad); err == nil {
			t.Errorf("parseVersionRanges(%.40q) = %v", bad, r)
		}
	}
}

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"550.54.15", "550.54.15", 0}, {"23.0.3", "23.0.10", -1}, {"24.1", "24.1.0", 0}, {"24.1", "23.9.9", 1},
		{"24.1.rc2", "24.1.rc1", 1}, {"535.161.08", "550", -1},
	} {
		if got := compareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := compareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("compareVersions(%q, %q) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}

func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"NVIDIA A100-SXM4-80GB": "NVIDIA_A100-SXM4-80GB", " 24.1.rc2\n": "24.1.rc2", "-x-": "x",
		strings.Repeat("a", 70): strings.Repeat("a", 63), "(v1)": "v1",
	} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

// The fuzz targets feed every parser of outside input arbitrary bytes: no
// panic, no unbounded allocation, and results that keep their promises.

func FuzzParseNvidiaVersion(f *testing.F) {
	f.Add("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n")
	f.Add("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  535.161.08  Release Build\n")
	f.Add("NVRM version:\n")
	f.Fuzz(func(t *testing.T, in string) {
		v, err := parseNvidiaVersion(in)
		if err == nil && !versionToken.MatchString(v) {
			t.Errorf("version %q", v)
		}
	})
}

func FuzzParseKeyValues(f *testing.F) {
	f.Add("Model: \t\t NVIDIA A100-SXM4-80GB\nBus Location: \t 0000:07:00.0\nDevice Minor: \t 0\n", true)
	f.Add("Version=24.1.rc2\nInnerversion=V100R001C18SPC001B220\n", false)
	f.Fuzz(func(t *testing.T, in string, colon bool) {
		sep := byte('=')
		if colon {
			sep = ':'
		}
		for k, v := range parseKeyValues(in, sep) {
			if k == "" || k != strings.TrimSpace(k) || v != strings.TrimSpace(v) {
				t.Errorf("key %q value %q", k, v)
			}
		}
	})
}

func FuzzParseCPUList(f *testing.F) {
	for _, s := range append([]string{"0-31,64-95\n", "", "7", "0-65535"}, hostileCPULists...) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		cpus, err := parseCPUList(in)
		if err != nil {
			return
		}
		if len(cpus) > maxCPUs {
			t.Errorf("%d CPUs", len(cpus))
		}
		for i, c := range cpus {
			if c < 0 || c >= maxCPUs || i > 0 && c <= cpus[i-1] {
				t.Errorf("CPU %d at %d", c, i)
			}
		}
	})
}

func FuzzParseNodeMeminfo(f *testing.F) {
	f.Add("Node 0 MemTotal:       263740540 kB\nNode 0 MemFree:        1012345678 kB\n")
	f.Add("Node 1 MemTotal: 99999999999999999999 kB\n")
	f.Add("Node 0 MemTotal: 9007199254740992 kB\n")
	f.Add("Node 0 MemTotal: 9007199254740991 kB\nNode 0 MemFree: -1 kB\n")
	f.Fuzz(func(t *testing.T, in string) {
		total, free, err := parseNodeMeminfo(in)
		if err == nil && (total < 0 || free < 0 || free > total || total > maxMemory) {
			t.Errorf("total %d free %d", total, free)
		}
	})
}

func FuzzParseSysfsValues(f *testing.F) {
	for _, s := range []string{"0x10de\n", "1024\n", "-3", "hugepages-2048kB", "hisi_sec2-3", "rsa\ndh\necdh\n", "550.54.15\n", "", "[7.0.0,7.5.99]", "[6.4.0,6.4.99],[7.0.0,7.7.99]", "[7.5.99,7.0.0]", "[,]", "CM384_Rack.A", "ÉÉ-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if v, err := parseCount(in); err == nil && v < 0 {
			t.Errorf("count %d", v)
		}
		if v, err := parseHugePageSize(in); err == nil && v <= 0 {
			t.Errorf("page size %d", v)
		}
		if _, err := parseHex(in); err != nil && !strings.Contains(err.Error(), "hexadecimal") {
			t.Errorf("hex error %v", err)
		}
		if class, _, ok := parseKAEName(in); ok && class != "hpre" && class != "sec" && class != "zip" {
			t.Errorf("class %q", class)
		}
		if algs, err := parseAlgorithms(in); err == nil && len(algs) == 0 {
			t.Error("no algorithms, no error")
		}
		if v, err := parseSingleVersion(in); err == nil && strings.ContainsAny(v, " \t\n") {
			t.Errorf("version %q", v)
		}
		if v := labelValue(in); len(v) > 63 {
			t.Errorf("label value %q", v)
		}
		if id := superNodeID(in); id != "" && len(validation.IsDNS1123Label(id)) > 0 {
			t.Errorf("super node id %q from %q", id, in)
		}
		_ = compareVersions(in, "24.1.0")
		if ranges, err := parseVersionRanges(in); err == nil {
			if len(ranges) == 0 || len(ranges) > maxVersionRanges {
				t.Errorf("%d ranges", len(ranges))
			}
			for _, r := range ranges {
				if compareVersions(r.Low, r.High) > 0 || !r.contains(r.Low) || !r.contains(r.High) {
					t.Errorf("range %v", r)
				}
			}
		}
	})
}
