package discovery

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// LabelPrefix is the prefix of every label discovery publishes. The
// SuperNode controller and k8stest use the same prefix for the identity
// labels (LabelSuperNode, LabelNode), so that Nodes read the same whichever
// made them.
const LabelPrefix = "supernode.ubkit.io/"

// Identity labels.
const (
	LabelSuperNode = LabelPrefix + "id"
	LabelNode      = LabelPrefix + "node"
)

// LabelUBBandwidth is this node's UB link bandwidth, each way
// ([Report.UBBandwidth]), by the name the SuperNode controller reads as a
// label or an annotation (k8s/api/v1alpha1's LabelUBBandwidth) for a
// super node's interconnect bandwidth, and k8stest's nodes carry. As a
// label it is a number of bytes per second ("392000000000"), since a label
// value cannot hold "/"; as an annotation, which only direct labelling
// sets (NFD publishes labels only), it is written as ub/topology writes
// bandwidths ("392GB/s").
const LabelUBBandwidth = LabelPrefix + "ub-bandwidth"

// matchLabels are the labels of the version checks, by condition type:
// "true" or "false" whether the check passed (Unknown is "false"). A check
// without a policy (NoPolicy) has none.
var matchLabels = map[string]string{
	"GPUDriverVersion":      "gpu.driver-match",
	"NPUDriverVersion":      "npu.driver-match",
	"KAEDriverVersion":      "kae.driver-match",
	"GPUFirmwareVersion":    "gpu.firmware-match",
	"NPUFirmwareVersion":    "npu.firmware-match",
	"NPUFirmwareCompatible": "npu.firmware-compatible",
	"KernelVersion":         "kernel.version-match",
}

// Labels returns the Node labels a report stands for: the identity (the
// super node as SuperNodeID gives it, the node), the UB bandwidth
// (LabelUBBandwidth, in bytes per second), the
// count, driver and firmware version of each kind of device found, the
// outcome of each version check that has a policy (".driver-match",
// ".firmware-match", "kernel.version-match", see matchLabels) and of the
// Ascend driver's firmware list ("npu.firmware-compatible"), a
// "kae.<class>=true" per KAE engine class (hpre, sec, zip), the huge page
// pools' sizes and the NUMA node count. Every key starts with LabelPrefix;
// values are valid label values.
func (r *Report) Labels() map[string]string {
	l := map[string]string{}
	set := func(k, v string) {
		if v = labelValue(v); v != "" {
			l[LabelPrefix+k] = v
		}
	}
	if id := r.SuperNodeID(); id != "" {
		l[LabelSuperNode] = id
	}
	set("node", r.Node)
	if r.UBBandwidth >= 1 {
		if v := strconv.FormatFloat(math.Round(r.UBBandwidth), 'f', -1, 64); len(v) <= 63 {
			l[LabelUBBandwidth] = v
		}
	}
	for _, kind := range []DeviceKind{GPU, NPU, KAE} {
		n := r.count(kind)
		if n == 0 {
			continue
		}
		k := strings.ToLower(string(kind))
		set(k+".count", strconv.Itoa(n))
		set(k+".driver", r.Drivers[kind])
		set(k+".firmware", r.Firmware[kind])
	}
	for _, c := range r.Conditions {
		if k, ok := matchLabels[c.Type]; ok && c.Reason != "NoPolicy" {
			set(k, strconv.FormatBool(c.Status == ConditionTrue))
		}
	}
	if len(r.GPUs) > 0 && r.GPUs[0].Model != "" {
		set("gpu.model", r.GPUs[0].Model)
	}
	for _, e := range r.KAE {
		set("kae."+e.Class, "true")
	}
	for _, p := range r.HugePages {
		if p.Total > 0 {
			set("hugepages-"+pageSizeName(p.PageSize), strconv.FormatInt(p.Total, 10))
		}
	}
	if len(r.NUMA) > 0 {
		set("numa.count", strconv.Itoa(len(r.NUMA)))
	}
	return l
}

// Annotations returns the Node annotations a report stands for: the UB
// bandwidth (LabelUBBandwidth) as ub/topology writes bandwidths. Only
// direct labelling sets them: NFD's NodeFeature objects and feature files
// carry labels only, and the label carries the same figure.
func (r *Report) Annotations() map[string]string {
	a := map[string]string{}
	if r.UBBandwidth >= 1 && !math.IsInf(r.UBBandwidth, 0) {
		a[LabelUBBandwidth] = topology.FormatBandwidth(r.UBBandwidth)
	}
	return a
}

// Features returns the report as NFD attribute features: every label
// (by its key without LabelPrefix) and what is too long or too detailed to
// be a label (each huge page pool's size, KAE algorithms per class, each
// NUMA node's CPUs and memory, the kernel release, the number of scan
// errors).
//
// Features describe what the node is, not how busy it is: free huge pages
// and free KAE queues (HugePagePool.Free, KAEEngine.AvailableInstances)
// are in the Report but not here, so that a counter that moves with the
// workload neither republishes the features nor leaves a stale figure in
// the cluster.
func (r *Report) Features() map[string]string {
	f := map[string]string{}
	for k, v := range r.Labels() {
		f[strings.TrimPrefix(k, LabelPrefix)] = v
	}
	for _, p := range r.HugePages {
		f["hugepages-"+pageSizeName(p.PageSize)+".total"] = strconv.FormatInt(p.Total, 10)
	}
	algorithms := map[string]map[string]bool{}
	for _, e := range r.KAE {
		if algorithms[e.Class] == nil {
			algorithms[e.Class] = map[string]bool{}
		}
		for _, a := range e.Algorithms {
			algorithms[e.Class][a] = true
		}
	}
	for class, algs := range algorithms {
		f["kae."+class+".algorithms"] = strings.Join(sortedKeys(algs), ",")
	}
	for _, n := range r.NUMA {
		f[fmt.Sprintf("numa.node%d.cpus", n.ID)] = strconv.Itoa(len(n.CPUs))
		f[fmt.Sprintf("numa.node%d.memory", n.ID)] = strconv.FormatInt(n.MemTotal, 10)
	}
	if r.Kernel != "" {
		f["kernel.version"] = r.Kernel
	}
	if len(r.Errors) > 0 {
		f["scan.errors"] = strconv.Itoa(len(r.Errors))
	}
	return f
}

// Devices returns an identifier for every device of the report ("GPU
// 0000:07:00.0", "NPU davinci3", "KAE hisi_zip-0"), sorted, so that two
// scans can be compared.
func (r *Report) Devices() []string {
	var ids []string
	for _, g := range r.GPUs {
		ids = append(ids, "GPU "+g.Address)
	}
	for _, n := range r.NPUs {
		ids = append(ids, fmt.Sprintf("NPU davinci%d", n.Index))
	}
	for _, k := range r.KAE {
		ids = append(ids, "KAE "+k.Name)
	}
	sort.Strings(ids)
	return ids
}

// pageSizeName names a huge page size as Kubernetes' resources do: "2Mi",
// "1Gi", "64Ki".
func pageSizeName(b int64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return strconv.FormatInt(b>>30, 10) + "Gi"
	case b >= 1<<20 && b%(1<<20) == 0:
		return strconv.FormatInt(b>>20, 10) + "Mi"
	default:
		return strconv.FormatInt(b>>10, 10) + "Ki"
	}
}

// SuperNodeID is the value of the LabelSuperNode label: the super node's
// name as a SuperNode can be called, since the SuperNode controller makes
// one SuperNode per value and ignores Nodes whose value cannot name one.
// It is a DNS-1123 label: at most 63 lower-case letters, digits and '-',
// starting and ending with a letter or digit. A name that is one already
// is the id as it is. Any other is made one, upper case becoming lower
// case and every other character '-', and 8 hex digits of a hash of the
// name are added after a '-', the rest cut to 54 characters to leave
// room: "CM384_Rack.A" is "cm384-rack-a-<hash>", so that names the change
// would make equal ("CM384_A" and "cm384-a", or two that differ only
// after 63 characters) still name two SuperNodes (short of a collision of
// the 32-bit hash). A name with nothing left once made so (no letter or
// digit) has no id: "". A name that had to change is said in the Identity
// condition and logged by the agent.
func (r *Report) SuperNodeID() string { return superNodeID(r.SuperNode) }

// idHashLen is the length of the suffix superNodeID adds to a name it
// changed: '-' and 8 hex digits.
const idHashLen = 1 + 8

func superNodeID(name string) string {
	b := make([]byte, 0, len(name))
	for _, c := range strings.ToLower(name) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b = append(b, byte(c))
		} else {
			b = append(b, '-')
		}
		if len(b) > 63 {
			break
		}
	}
	id := strings.Trim(string(b), "-")
	if id == name || id == "" {
		return id
	}
	if len(id) > 63-idHashLen {
		id = strings.TrimRight(id[:63-idHashLen], "-")
	}
	sum := sha256.Sum256([]byte(name))
	return id + "-" + hex.EncodeToString(sum[:4])
}

// labelValue makes s a valid label value: at most 63 characters of
// letters, digits, '-', '_' and '.', starting and ending with a letter or
// digit; anything else becomes '_'.
func labelValue(s string) string {
	b := []byte(strings.TrimSpace(s))
	for i, c := range b {
		if !isAlnum(rune(c)) && c != '-' && c != '_' && c != '.' {
			b[i] = '_'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return strings.Trim(string(b), "-_.")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}
