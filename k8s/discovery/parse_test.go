package discovery

import (
	"slices"
	"strings"
	"testing"
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
		{"3-1", nil, false},
		{"0-x", nil, false},
		{"-1", nil, false},
		{"0-4294967295", nil, false},
		{"1,,2", nil, false},
	} {
		got, err := parseCPUList(tc.in)
		if (err == nil) != tc.ok || !slices.Equal(got, tc.want) {
			t.Errorf("parseCPUList(%q) = %v, %v", tc.in, got, err)
		}
	}
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
	kv := parseKeyValues("Version=24.1.rc2\n\nbad line\n=x\nVersion=other\n", '=')
	if len(kv) != 1 || kv["Version"] != "24.1.rc2" {
		t.Errorf("parseKeyValues: %v", kv)
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
	for _, s := range []string{"0-31,64-95\n", "", "7", "3-1", "0-4294967295", "1,,2"} {
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
		for _, c := range cpus {
			if c < 0 {
				t.Errorf("CPU %d", c)
			}
		}
	})
}

func FuzzParseNodeMeminfo(f *testing.F) {
	f.Add("Node 0 MemTotal:       263740540 kB\nNode 0 MemFree:        1012345678 kB\n")
	f.Add("Node 1 MemTotal: 99999999999999999999 kB\n")
	f.Fuzz(func(t *testing.T, in string) {
		total, free, err := parseNodeMeminfo(in)
		if err == nil && (total < 0 || free < 0) {
			t.Errorf("total %d free %d", total, free)
		}
	})
}

func FuzzParseSysfsValues(f *testing.F) {
	for _, s := range []string{"0x10de\n", "1024\n", "-3", "hugepages-2048kB", "hisi_sec2-3", "rsa\ndh\necdh\n", "550.54.15\n", ""} {
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
		_ = compareVersions(in, "24.1.0")
	})
}
