package discovery

import (
	"bufio"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The parsers below read outside input (procfs and sysfs files, vendor
// version files). Each returns an error that names what it could not
// understand, and each has a fuzz target in parse_test.go.

// maxFileSize bounds what is read of a single proc or sys file: they are
// small, and a fixture or a broken driver must not make the agent read
// without end.
const maxFileSize = 1 << 20

// parseKeyValues parses "Key: value" lines (sep ':') or "key=value" lines
// (sep '='), as NVIDIA's per-GPU information file and Ascend's version.info
// have them. Blank lines and lines without sep are skipped; a key given
// twice keeps its first value.
func parseKeyValues(data string, sep byte) map[string]string {
	out := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxFileSize)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), string(sep))
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if k == "" {
			continue
		}
		if _, dup := out[k]; !dup {
			out[k] = v
		}
	}
	return out
}

var versionToken = regexp.MustCompile(`^[0-9]+(\.[0-9]+)+$`)

// parseNvidiaVersion returns the driver version in /proc/driver/nvidia/version,
// whose first line reads
//
//	NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024
//
// (or "... Open Kernel Module for aarch64  550.54.15  Release Build ...").
func parseNvidiaVersion(data string) (string, error) {
	line, _, _ := strings.Cut(data, "\n")
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "NVRM version:")
	if !ok {
		return "", fmt.Errorf("no \"NVRM version:\" line: %q", clip(line))
	}
	_, after, ok := strings.Cut(rest, "Kernel Module")
	if !ok {
		after = rest
	}
	for f := range strings.FieldsSeq(after) {
		if versionToken.MatchString(f) {
			return f, nil
		}
	}
	return "", fmt.Errorf("no version number in %q", clip(line))
}

// parseSingleVersion reads a file holding only a version, such as
// /sys/module/nvidia/version ("550.54.15\n").
func parseSingleVersion(data string) (string, error) {
	v := strings.TrimSpace(data)
	if v == "" || strings.ContainsAny(v, " \t\n") || !strings.ContainsAny(v, "0123456789") {
		return "", fmt.Errorf("not a version: %q", clip(data))
	}
	return v, nil
}

// maxVersionRanges bounds a list of version ranges.
const maxVersionRanges = 64

// parseVersionRanges parses a list of inclusive version ranges, as the
// Ascend driver's version.info gives the firmware it works with:
//
//	compatible_version_fw=[6.4.0,6.4.99],[7.0.0,7.7.99]
//
// Each range is "[low,high]", both versions (parseSingleVersion) with low
// not above high; ranges are separated by commas.
func parseVersionRanges(data string) ([]versionRange, error) {
	s := strings.TrimSpace(data)
	var ranges []versionRange
	for s != "" {
		if len(ranges) == maxVersionRanges {
			return nil, fmt.Errorf("more than %d version ranges in %q", maxVersionRanges, clip(data))
		}
		rest, ok := strings.CutPrefix(s, "[")
		inner, after, closed := strings.Cut(rest, "]")
		low, high, pair := strings.Cut(inner, ",")
		if !ok || !closed || !pair {
			return nil, fmt.Errorf("not a list of [low,high] version ranges: %q", clip(data))
		}
		lo, err := parseSingleVersion(low)
		if err != nil {
			return nil, err
		}
		hi, err := parseSingleVersion(high)
		if err != nil {
			return nil, err
		}
		if compareVersions(lo, hi) > 0 {
			return nil, fmt.Errorf("version range [%s,%s] is reversed", clip(lo), clip(hi))
		}
		ranges = append(ranges, versionRange{lo, hi})
		if s, ok = strings.CutPrefix(after, ","); !ok && after != "" {
			return nil, fmt.Errorf("not a list of [low,high] version ranges: %q", clip(data))
		}
		if ok && s == "" {
			return nil, fmt.Errorf("a comma ends the version ranges %q", clip(data))
		}
	}
	if len(ranges) == 0 {
		return nil, errors.New("no version ranges")
	}
	return ranges, nil
}

// parseHex parses a sysfs hexadecimal attribute such as a PCI vendor
// ("0x10de\n") or class ("0x030200\n").
func parseHex(data string) (uint64, error) {
	s := strings.TrimSpace(data)
	digits, ok := strings.CutPrefix(s, "0x")
	if !ok || digits == "" {
		return 0, fmt.Errorf("not a 0x-prefixed hexadecimal number: %q", clip(data))
	}
	v, err := strconv.ParseUint(digits, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("not a hexadecimal number: %q", clip(data))
	}
	return v, nil
}

// parseCount parses a sysfs attribute holding one non-negative decimal
// number (nr_hugepages, available_instances, flags).
func parseCount(data string) (int64, error) {
	s := strings.TrimSpace(data)
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("not a non-negative number: %q", clip(data))
	}
	return v, nil
}

// maxCPUs bounds a CPU list, so that a corrupt "0-4294967295" cannot make
// the agent allocate without end: a list has at most maxCPUs CPUs, each
// numbered below maxCPUs (the kernel's NR_CPUS is at most 8192 on the
// architectures ubkit runs on).
const maxCPUs = 1 << 16

// parseCPUList parses a kernel CPU list ("0-23,48-71", "" for none) into
// its CPUs in order. As the kernel writes them, the CPUs are decimal
// numbers without a sign, in ascending order, each once; anything else is
// an error.
func parseCPUList(data string) ([]int, error) {
	s := strings.TrimSpace(data)
	if s == "" {
		return nil, nil
	}
	var cpus []int
	next := 0 // the lowest CPU the next part may start at
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, ok := cpuNumber(lo)
		if !ok {
			return nil, fmt.Errorf("bad CPU list %q: %q is not a CPU", clip(data), clip(part))
		}
		b := a
		if isRange {
			if b, ok = cpuNumber(hi); !ok || b < a {
				return nil, fmt.Errorf("bad CPU list %q: %q is not a range", clip(data), clip(part))
			}
		}
		if a < next {
			return nil, fmt.Errorf("bad CPU list %q: %q is out of order", clip(data), clip(part))
		}
		// Both ends are below maxCPUs, so neither b-a nor b+1 overflows,
		// and the range fits only if it leaves the total within bounds.
		if b-a >= maxCPUs-len(cpus) {
			return nil, fmt.Errorf("bad CPU list %q: more than %d CPUs", clip(data), maxCPUs)
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
		next = b + 1
	}
	return cpus, nil
}

// cpuNumber parses a CPU's number: decimal digits only (no sign, no
// space), below maxCPUs.
func cpuNumber(s string) (int, bool) {
	if s == "" || len(s) > 5 || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n < maxCPUs
}

// maxMemory bounds a NUMA node's memory in bytes (8 PiB).
const maxMemory = 1 << 53

// parseNodeMeminfo returns MemTotal and MemFree, in bytes, of a NUMA node's
// meminfo, whose lines read "Node 0 MemTotal:       263740540 kB". Neither
// is more than maxMemory, and MemFree is not more than MemTotal.
func parseNodeMeminfo(data string) (total, free int64, err error) {
	found := 0
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), maxFileSize)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != "Node" {
			continue
		}
		var dst *int64
		switch f[2] {
		case "MemTotal:":
			dst = &total
		case "MemFree:":
			dst = &free
		default:
			continue
		}
		unit := int64(1)
		if len(f) > 4 && f[4] == "kB" {
			unit = 1024
		}
		// The bound applies to bytes, after the unit: 2^53 kB would
		// overflow int64.
		v, perr := strconv.ParseInt(f[3], 10, 64)
		if perr != nil || v < 0 || v > maxMemory/unit {
			return 0, 0, fmt.Errorf("bad %s %q", strings.TrimSuffix(f[2], ":"), clip(f[3]))
		}
		*dst = v * unit
		found++
	}
	if total == 0 && found == 0 {
		return 0, 0, errors.New("no \"Node N MemTotal:\" line")
	}
	if free > total {
		return 0, 0, fmt.Errorf("MemFree %d is more than MemTotal %d", free, total)
	}
	return total, free, nil
}

// parseHugePageSize parses the name of a huge page directory,
// "hugepages-2048kB", into its page size in bytes.
func parseHugePageSize(name string) (int64, error) {
	s, ok := strings.CutPrefix(name, "hugepages-")
	if !ok {
		return 0, fmt.Errorf("not a huge page directory: %q", name)
	}
	s, ok = strings.CutSuffix(s, "kB")
	if !ok {
		return 0, fmt.Errorf("huge page size %q is not in kB", name)
	}
	kb, err := strconv.ParseInt(s, 10, 64)
	if err != nil || kb <= 0 || kb > 1<<40 {
		return 0, fmt.Errorf("bad huge page size %q", name)
	}
	return kb * 1024, nil
}

// kaeName matches a uacce device of a Kunpeng accelerator engine:
// hisi_hpre-0, hisi_sec2-1, hisi_zip-2 (the number is the device's index).
var kaeName = regexp.MustCompile(`^hisi_(hpre|sec2|zip)-([0-9]+)$`)

// parseKAEName returns the engine class ("hpre", "sec", "zip") and index of
// a uacce device name, or false if it is not a KAE engine.
func parseKAEName(name string) (class string, index int, ok bool) {
	m := kaeName.FindStringSubmatch(name)
	if m == nil {
		return "", 0, false
	}
	index, err := strconv.Atoi(m[2])
	if err != nil {
		return "", 0, false
	}
	class = m[1]
	if class == "sec2" {
		class = "sec"
	}
	return class, index, true
}

// parseAlgorithms parses a uacce algorithms attribute: names separated by
// newlines (or, on some kernels, spaces), such as "rsa\ndh\necdh\n".
func parseAlgorithms(data string) ([]string, error) {
	var algs []string
	for f := range strings.FieldsSeq(data) {
		for _, r := range f {
			if !isAlnum(r) && !strings.ContainsRune("-_()", r) {
				return nil, fmt.Errorf("bad algorithm name %q", clip(f))
			}
		}
		algs = append(algs, f)
	}
	if len(algs) == 0 {
		return nil, errors.New("no algorithms")
	}
	return algs, nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const limit = 80
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}
