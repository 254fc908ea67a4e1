package topology

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Environment variables read by FromEnv and LocalNode.
const (
	// EnvTopology holds the topology: a file path, "example:<name>" for a
	// shipped example, or the YAML or JSON text itself (recognised by a
	// leading '{' or by a newline anywhere in it).
	EnvTopology = "UB_TOPOLOGY"
	// EnvNode names the node this process plays in a (simulated) super node.
	EnvNode = "UB_NODE"
)

// FromEnv returns the topology named by UB_TOPOLOGY (see [EnvTopology]), or
// the one-node topology of this host ([Discover]) when it is unset or
// empty. Errors name the variable.
func FromEnv() (*Topology, error) {
	v := os.Getenv(EnvTopology)
	trimmed := strings.TrimSpace(v)
	var (
		t   *Topology
		err error
	)
	switch {
	case trimmed == "":
		return Discover()
	case strings.HasPrefix(trimmed, "{") || strings.Contains(v, "\n"):
		t, err = Parse([]byte(v))
	case strings.HasPrefix(trimmed, "example:"):
		t, err = Example(strings.TrimPrefix(trimmed, "example:"))
	default:
		t, err = Load(v)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvTopology, err)
	}
	return t, nil
}

// LocalNode returns the node this process plays in t: the one named by
// UB_NODE if it is set (it must be a compute node of t), else the one named
// like this host, else the only compute node if there is exactly one.
func LocalNode(t *Topology) (Node, error) {
	host, _ := os.Hostname()
	return localNode(t, os.Getenv(EnvNode), nodeName(host))
}

func localNode(t *Topology, env, host string) (Node, error) {
	if env != "" {
		i, ok := t.NodeIndex(env)
		if !ok {
			return Node{}, fmt.Errorf("%s=%s: %w %q in topology %q", EnvNode, env, ErrUnknownNode, env, t.Name)
		}
		if t.Nodes[i].IsSwitch() {
			return Node{}, fmt.Errorf("%s=%s: %q is a switch in topology %q; a process plays a compute node", EnvNode, env, env, t.Name)
		}
		return t.Nodes[i], nil
	}
	if i, ok := t.NodeIndex(host); ok && !t.Nodes[i].IsSwitch() {
		return t.Nodes[i], nil
	}
	only := -1
	for i := range t.Nodes {
		if !t.Nodes[i].IsSwitch() {
			if only >= 0 {
				return Node{}, fmt.Errorf("topology %q has several compute nodes and none is named %q like this host: set %s to the node this process plays", t.Name, host, EnvNode)
			}
			only = i
		}
	}
	if only < 0 {
		return Node{}, fmt.Errorf("topology %q has no compute node", t.Name)
	}
	return t.Nodes[only], nil
}

// Discover returns a one-node topology describing this host, read from /proc
// and /sys (see [DiscoverFS]).
func Discover() (*Topology, error) {
	return DiscoverFS(os.DirFS("/"))
}

// DiscoverFS builds a one-node topology from a Linux root file system, so
// tests can hand it a fake one (fstest.MapFS with paths such as
// "proc/meminfo"). The node and the topology are named after the host name
// in proc/sys/kernel/hostname (made a valid node name; "localhost" if
// absent). It reads:
//   - CPUs: sys/devices/system/cpu/online, else the "processor" lines of
//     proc/cpuinfo;
//   - NUMA nodes: the sys/devices/system/node/nodeN directories (1 if the
//     directory is absent but CPUs were found: a kernel without NUMA);
//   - memory: MemTotal in proc/meminfo;
//   - devices: dev/nvidiaN (GPU), dev/davinciN (Ascend NPU) and the KAE
//     engines in sys/class/uacce (hisi_zip, hisi_sec2, hisi_hpre), without
//     their memory.
//
// A file that is absent leaves its field zero; a file that is present but
// cannot be understood is an error.
func DiscoverFS(fsys fs.FS) (*Topology, error) {
	host := "localhost"
	if b, err := fs.ReadFile(fsys, "proc/sys/kernel/hostname"); err == nil {
		host = nodeName(string(b))
	}
	n := Node{Name: host, Kind: Compute}
	var err error
	if n.CPUs, err = discoverCPUs(fsys); err != nil {
		return nil, err
	}
	if n.MemoryBytes, err = discoverMemory(fsys); err != nil {
		return nil, err
	}
	n.NUMANodes = countEntries(fsys, "sys/devices/system/node", numaDir)
	if n.NUMANodes == 0 && n.CPUs > 0 {
		if _, err := fs.Stat(fsys, "sys/devices/system/node"); errors.Is(err, fs.ErrNotExist) {
			n.NUMANodes = 1
		}
	}
	for _, dev := range []struct {
		kind    DeviceKind
		dir     string
		pattern *regexp.Regexp
	}{
		{GPU, "dev", nvidiaDev},
		{NPU, "dev", davinciDev},
		{KAE, "sys/class/uacce", kaeDev},
	} {
		if c := countEntries(fsys, dev.dir, dev.pattern); c > 0 {
			n.Devices = append(n.Devices, Device{Kind: dev.kind, Count: c})
		}
	}
	return New(host, []Node{n}, nil)
}

var (
	numaDir    = regexp.MustCompile(`^node[0-9]+$`)
	nvidiaDev  = regexp.MustCompile(`^nvidia[0-9]+$`)
	davinciDev = regexp.MustCompile(`^davinci[0-9]+$`)
	kaeDev     = regexp.MustCompile(`^hisi_(zip|sec2|hpre)-[0-9]+$`)
)

func countEntries(fsys fs.FS, dir string, pattern *regexp.Regexp) int {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return 0
	}
	c := 0
	for _, e := range entries {
		if pattern.MatchString(e.Name()) {
			c++
		}
	}
	return c
}

func discoverCPUs(fsys fs.FS) (int, error) {
	const online = "sys/devices/system/cpu/online"
	if b, err := fs.ReadFile(fsys, online); err == nil {
		c, err := countCPUList(strings.TrimSpace(string(b)))
		if err != nil {
			return 0, fmt.Errorf("topology: discover: /%s: %v", online, err)
		}
		return c, nil
	}
	b, err := fs.ReadFile(fsys, "proc/cpuinfo")
	if err != nil {
		return 0, nil
	}
	c := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, _, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(key) == "processor" {
			c++
		}
	}
	return c, nil
}

// countCPUList counts the CPUs in a kernel CPU list such as "0-3,8,10-11".
func countCPUList(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	total := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a || b-a > 1<<20 {
				return 0, fmt.Errorf("bad CPU list %q", s)
			}
		}
		total += b - a + 1
	}
	return total, nil
}

func discoverMemory(fsys fs.FS) (int64, error) {
	const meminfo = "proc/meminfo"
	b, err := fs.ReadFile(fsys, meminfo)
	if err != nil {
		return 0, nil
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 2 && f[1] == "kB" {
			if kb, err := strconv.ParseInt(f[0], 10, 64); err == nil && kb >= 0 && kb < 1<<53 {
				return kb << 10, nil
			}
		}
		return 0, fmt.Errorf("topology: discover: /%s: cannot read %q", meminfo, strings.TrimSpace(sc.Text()))
	}
	return 0, nil
}

// nodeName turns a host name into a valid node name: each run of
// characters a node name cannot hold becomes one '-', separators are trimmed
// from both ends, and "localhost" stands for nothing.
func nodeName(host string) string {
	var b strings.Builder
	for _, c := range strings.TrimSpace(host) {
		switch {
		case c < 0x80 && validName(string(c)), c == '.', c == '_', c == '-':
			b.WriteRune(c)
		case !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), ".-_")
	if len(s) > 253 {
		s = strings.TrimRight(s[:253], ".-_")
	}
	if s == "" {
		return "localhost"
	}
	return s
}
