package discovery

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// DeviceKind is a kind of device discovery looks for.
type DeviceKind string

// Device kinds.
const (
	GPU DeviceKind = "GPU"
	NPU DeviceKind = "NPU"
	KAE DeviceKind = "KAE"
)

// ScanOptions say where [Scan] looks and what it expects.
type ScanOptions struct {
	// Root is the root of the file system to read: "/" on a node (""
	// means "/"), a fixture tree in tests, or the host's root mounted
	// into a container (such as "/host").
	Root string
	// Topology is the super node this node belongs to; nil means
	// [topology.FromEnv] (UB_TOPOLOGY, else this host alone).
	Topology *topology.Topology
	// TopologyNode is the node of Topology this host is; "" means
	// [topology.LocalNode] (UB_NODE, else the node named like the host).
	TopologyNode string
	// Versions are the expected driver versions, per device kind.
	Versions map[DeviceKind]VersionPolicy
	// Firmware are the expected firmware versions, per device kind: the
	// Ascend firmware package's for NPUs, every GPU's VBIOS for GPUs
	// (KAE engines expose none).
	Firmware map[DeviceKind]VersionPolicy
	// Kernel is the expected kernel release (proc/sys/kernel/osrelease,
	// as uname -r prints it: "5.10.0-182.0.0.95.oe2203sp3.aarch64"
	// compares as 5.10.0.182...).
	Kernel VersionPolicy
}

// Report is what one scan found.
type Report struct {
	// SuperNode and Node are this node's identity in its UB super node
	// (the topology's name and the node's name in it); both are "" if
	// the identity could not be read (see the Identity condition). The
	// label carries SuperNode as [Report.SuperNodeID] gives it.
	SuperNode, Node string
	// UBBandwidth is this node's UB link bandwidth in bytes per second,
	// each way: the widest of its links in the topology (what one
	// transfer into or out of it can get at most); 0 if the identity is
	// unknown or the node has no link.
	UBBandwidth float64
	GPUs        []GPUDevice
	NPUs        []NPUDevice
	KAE         []KAEEngine
	HugePages   []HugePagePool
	NUMA        []NUMANode
	// Drivers holds the driver version found per device kind ("" if
	// none is exposed).
	Drivers map[DeviceKind]string
	// Firmware holds the firmware version per device kind, where the
	// devices expose one: Ascend's firmware package for the NPUs, the
	// oldest VBIOS of the GPUs.
	Firmware map[DeviceKind]string
	// Kernel is the kernel release (proc/sys/kernel/osrelease), "" if
	// unreadable.
	Kernel string
	// Conditions are the results of the identity and version checks.
	Conditions []Condition
	// Errors are the devices and files that could not be read; the rest
	// of the report stands without them.
	Errors []*DeviceError
}

// GPUDevice is an NVIDIA GPU.
type GPUDevice struct {
	// Address is its PCI address, "0000:07:00.0".
	Address string
	// DeviceID is its PCI device ID ("0x20b5").
	DeviceID string
	// Model, UUID and VBIOS come from the driver's information file,
	// when the driver is loaded.
	Model, UUID, VBIOS string
	// Minor is its /dev/nvidiaN number, -1 if unknown.
	Minor int
}

// NPUDevice is an Ascend NPU: /dev/davinciN.
type NPUDevice struct {
	Index int
}

// KAEEngine is a Kunpeng accelerator engine registered with uacce.
type KAEEngine struct {
	// Name is the uacce device: "hisi_hpre-0".
	Name string
	// Class is "hpre" (public-key crypto), "sec" (symmetric crypto and
	// digests) or "zip" (compression).
	Class string
	// API is the queue interface, such as "hisi_qm_v2".
	API string
	// Algorithms it offers: "rsa", "sm2", "zlib", ...
	Algorithms []string
	// AvailableInstances is how many queues are free. It moves with the
	// workload, so it is not published (see [Report.Features]).
	AvailableInstances int64
	// Flags are uacce's device flags (1: SVA).
	Flags int64
}

// HugePagePool is one huge page size of the system pool.
type HugePagePool struct {
	PageSize int64
	// Total is the pool's size in pages (nr_hugepages), Free how many
	// of them are free. Free moves with the workload, so it is not
	// published (see [Report.Features]).
	Total, Free int64
}

// NUMANode is one NUMA node.
type NUMANode struct {
	ID                int
	CPUs              []int
	MemTotal, MemFree int64
}

// DeviceError says which device or file could not be read, and why.
type DeviceError struct {
	// Kind is GPU, NPU or KAE, or "hugepages", "numa", "kernel".
	Kind string
	// Device names the device ("0000:07:00.0", "hisi_zip-0"), "" for the
	// kind as a whole.
	Device string
	// Path is the file, relative to the root.
	Path string
	Err  error
}

func (e *DeviceError) Error() string {
	dev := e.Kind
	if e.Device != "" {
		dev += " " + e.Device
	}
	return fmt.Sprintf("discovery: %s: /%s: %v", dev, e.Path, e.Err)
}

func (e *DeviceError) Unwrap() error { return e.Err }

// Scan reads this node's identity and devices. It fails only if the root
// cannot be read at all; everything else that goes wrong is in
// [Report.Errors] or [Report.Conditions].
func Scan(opts ScanOptions) (*Report, error) {
	root := opts.Root
	if root == "" {
		root = "/"
	}
	if st, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("discovery: root: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("discovery: root %s is not a directory", root)
	}
	return scanFS(os.DirFS(root), opts), nil
}

type scanner struct {
	fsys fs.FS
	r    *Report
	// firmware holds the distinct firmware versions per kind, for the
	// checks (the GPUs' VBIOS versions may differ).
	firmware map[DeviceKind][]string
	// npuFirmwareRanges are the firmware versions the Ascend driver says
	// it works with (its compatible_version_fw), nil if it says none.
	npuFirmwareRanges []versionRange
}

func scanFS(fsys fs.FS, opts ScanOptions) *Report {
	s := &scanner{fsys: fsys, r: &Report{Drivers: map[DeviceKind]string{}, Firmware: map[DeviceKind]string{}}, firmware: map[DeviceKind][]string{}}
	s.identity(opts)
	s.gpus()
	s.npus()
	s.kae()
	s.hugePages()
	s.numa()
	s.kernel()
	s.checks(opts)
	return s.r
}

// checks adds the conditions of the version checks: every kind of device
// found has its driver checked (NoPolicy without a policy) and, when it
// exposes a firmware version or there is a policy, its firmware; the
// Ascend driver's firmware list, when it has one; the kernel, with a
// policy.
func (s *scanner) checks(opts ScanOptions) {
	r := s.r
	for _, kind := range []DeviceKind{GPU, NPU, KAE} {
		if r.count(kind) == 0 {
			continue
		}
		var drivers []string
		if v := r.Drivers[kind]; v != "" {
			drivers = []string{v}
		}
		r.Conditions = append(r.Conditions, checkVersion(string(kind)+"DriverVersion", string(kind)+" driver", "driver", drivers, opts.Versions[kind]))
		if fw, p := s.firmware[kind], opts.Firmware[kind]; len(fw) > 0 || p != (VersionPolicy{}) {
			r.Conditions = append(r.Conditions, checkVersion(string(kind)+"FirmwareVersion", string(kind)+" firmware", "firmware", fw, p))
		}
	}
	if len(r.NPUs) > 0 && s.npuFirmwareRanges != nil && r.Firmware[NPU] != "" {
		r.Conditions = append(r.Conditions, checkCompatible(r.Firmware[NPU], r.Drivers[NPU], s.npuFirmwareRanges))
	}
	if opts.Kernel != (VersionPolicy{}) {
		var found []string
		if r.Kernel != "" {
			found = []string{r.Kernel}
		}
		r.Conditions = append(r.Conditions, checkVersion("KernelVersion", "kernel", "kernel", found, opts.Kernel))
	}
}

func (r *Report) count(kind DeviceKind) int {
	switch kind {
	case GPU:
		return len(r.GPUs)
	case NPU:
		return len(r.NPUs)
	case KAE:
		return len(r.KAE)
	}
	return 0
}

func (s *scanner) fail(kind, device, p string, err error) {
	s.r.Errors = append(s.r.Errors, &DeviceError{Kind: kind, Device: device, Path: p, Err: err})
}

// read returns a small file's content; ok is false if it does not exist.
func (s *scanner) read(p string) (string, bool, error) {
	f, err := s.fsys.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return "", true, err
	}
	if len(b) > maxFileSize {
		return "", true, fmt.Errorf("larger than %d bytes", maxFileSize)
	}
	return string(b), true, nil
}

// readDir lists a directory, sorted; a missing directory is empty.
func (s *scanner) readDir(kind, p string) []fs.DirEntry {
	ents, err := fs.ReadDir(s.fsys, p)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.fail(kind, "", p, err)
	}
	return ents
}

func (s *scanner) identity(opts ScanOptions) {
	c := Condition{Type: "Identity"}
	t := opts.Topology
	var err error
	if t == nil {
		t, err = topology.FromEnv()
	}
	var n topology.Node
	if err == nil {
		if opts.TopologyNode != "" {
			i, ok := t.NodeIndex(opts.TopologyNode)
			switch {
			case !ok:
				err = fmt.Errorf("%w %q in topology %q", topology.ErrUnknownNode, opts.TopologyNode, t.Name)
			case t.Nodes[i].IsSwitch():
				err = fmt.Errorf("%q is a switch in topology %q", opts.TopologyNode, t.Name)
			default:
				n = t.Nodes[i]
			}
		} else {
			n, err = topology.LocalNode(t)
		}
	}
	if err != nil {
		c.Status, c.Reason = ConditionFalse, "NotFound"
		c.Message = fmt.Sprintf("super-node identity unknown: %v (set %s and %s)", err, topology.EnvTopology, topology.EnvNode)
	} else {
		s.r.SuperNode, s.r.Node = t.Name, n.Name
		s.r.UBBandwidth = t.LinkBandwidth(n.Name)
		c.Status, c.Reason = ConditionTrue, "Found"
		c.Message = fmt.Sprintf("node %s of super node %s", n.Name, t.Name)
		switch id := s.r.SuperNodeID(); {
		case id == "":
			c.Status, c.Reason = ConditionFalse, "InvalidName"
			c.Message += fmt.Sprintf(": no SuperNode can be named after %q (%s is a DNS-1123 label), so %s is not published: rename the super node in its topology", t.Name, LabelSuperNode, LabelSuperNode)
		case id != t.Name:
			c.Message += fmt.Sprintf(", published as %s=%s (a SuperNode's name is a DNS-1123 label)", LabelSuperNode, id)
		}
	}
	s.r.Conditions = append(s.r.Conditions, c)
}

const (
	nvidiaVendor = 0x10de
	// PCI base class 0x03 is a display controller (VGA 0x0300, 3D
	// 0x0302); NVIDIA's audio functions and NVSwitches have others.
	pciDisplayClass = 0x03
)

func (s *scanner) gpus() {
	const kind = string(GPU)
	byAddr := map[string]*GPUDevice{}
	var order []string
	for _, e := range s.readDir(kind, "sys/bus/pci/devices") {
		addr := e.Name()
		dir := path.Join("sys/bus/pci/devices", addr)
		vendor, ok, err := s.read(dir + "/vendor")
		if !ok && err == nil {
			continue
		}
		v, perr := parseHex(vendor)
		if err == nil {
			err = perr
		}
		if err != nil {
			s.fail(kind, addr, dir+"/vendor", err)
			continue
		}
		if v != nvidiaVendor {
			continue
		}
		class, _, err := s.read(dir + "/class")
		cl, perr := parseHex(class)
		if err == nil {
			err = perr
		}
		if err != nil {
			s.fail(kind, addr, dir+"/class", err)
			continue
		}
		if cl>>16 != pciDisplayClass {
			continue
		}
		g := &GPUDevice{Address: strings.ToLower(addr), Minor: -1}
		if dev, ok, err := s.read(dir + "/device"); ok && err == nil {
			if id, err := parseHex(dev); err == nil {
				g.DeviceID = fmt.Sprintf("0x%04x", id)
			}
		}
		byAddr[g.Address] = g
		order = append(order, g.Address)
	}
	// The driver's view: one directory per GPU it bound, named by its PCI
	// address. A GPU the driver has but sysfs does not show (a container
	// without /sys) still counts.
	for _, e := range s.readDir(kind, "proc/driver/nvidia/gpus") {
		p := path.Join("proc/driver/nvidia/gpus", e.Name(), "information")
		data, ok, err := s.read(p)
		if !ok && err == nil {
			err = errors.New("missing")
		}
		if err != nil {
			s.fail(kind, e.Name(), p, err)
			continue
		}
		info := parseKeyValues(data, ':')
		addr := strings.ToLower(info["Bus Location"])
		if addr == "" {
			addr = strings.ToLower(e.Name())
		}
		g := byAddr[addr]
		if g == nil {
			g = &GPUDevice{Address: addr, Minor: -1}
			byAddr[addr] = g
			order = append(order, addr)
		}
		g.Model, g.UUID, g.VBIOS = info["Model"], info["GPU UUID"], info["Video BIOS"]
		if m, ok := info["Device Minor"]; ok {
			n, err := strconv.Atoi(m)
			if err != nil || n < 0 {
				s.fail(kind, addr, p, fmt.Errorf("bad Device Minor %q", clip(m)))
			} else {
				g.Minor = n
			}
		}
	}
	sort.Strings(order)
	for _, a := range order {
		s.r.GPUs = append(s.r.GPUs, *byAddr[a])
	}
	if len(s.r.GPUs) == 0 {
		return
	}
	// A GPU's firmware is its VBIOS; the report's is the oldest.
	for _, g := range s.r.GPUs {
		if g.VBIOS != "" && !slices.Contains(s.firmware[GPU], g.VBIOS) {
			s.firmware[GPU] = append(s.firmware[GPU], g.VBIOS)
		}
	}
	slices.SortFunc(s.firmware[GPU], compareVersions)
	if fw := s.firmware[GPU]; len(fw) > 0 {
		s.r.Firmware[GPU] = fw[0]
	}
	if data, ok, err := s.read("proc/driver/nvidia/version"); ok {
		v, perr := parseNvidiaVersion(data)
		if err == nil {
			err = perr
		}
		if err != nil {
			s.fail(kind, "", "proc/driver/nvidia/version", err)
		} else {
			s.r.Drivers[GPU] = v
			return
		}
	}
	s.moduleVersion(GPU, "nvidia")
}

// moduleVersion reads a kernel module's version (sys/module/<m>/version)
// as kind's driver version, if it has one.
func (s *scanner) moduleVersion(kind DeviceKind, module string) {
	if v, ok := s.readVersion(string(kind), "sys/module/"+module+"/version"); ok {
		s.r.Drivers[kind] = v
	}
}

// readVersion reads the one version in the file at p. A file that is not
// there is no version and no error; one that cannot be read or parsed is
// reported as a failure of what.
func (s *scanner) readVersion(what, p string) (string, bool) {
	data, ok, err := s.read(p)
	if !ok && err == nil {
		return "", false
	}
	v, perr := parseSingleVersion(data)
	if err == nil {
		err = perr
	}
	if err != nil {
		s.fail(what, "", p, err)
		return "", false
	}
	return v, true
}

var davinci = regexp.MustCompile(`^davinci([0-9]+)$`)

const (
	ascendDriverVersion   = "usr/local/Ascend/driver/version.info"
	ascendFirmwareVersion = "usr/local/Ascend/firmware/version.info"
)

func (s *scanner) npus() {
	const kind = string(NPU)
	manager := false
	for _, e := range s.readDir(kind, "dev") {
		if e.Name() == "davinci_manager" {
			manager = true
		}
		m := davinci.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		i, err := strconv.Atoi(m[1])
		if err != nil {
			s.fail(kind, e.Name(), "dev/"+e.Name(), err)
			continue
		}
		s.r.NPUs = append(s.r.NPUs, NPUDevice{Index: i})
	}
	if len(s.r.NPUs) == 0 {
		return
	}
	slices.SortFunc(s.r.NPUs, func(a, b NPUDevice) int { return a.Index - b.Index })
	if !manager {
		s.fail(kind, "", "dev/davinci_manager", errors.New("missing: the Ascend driver is not (fully) loaded, and containers cannot use the NPUs"))
	}
	var driver map[string]string
	s.r.Drivers[NPU], driver = s.ascendVersion(ascendDriverVersion)
	s.r.Firmware[NPU], _ = s.ascendVersion(ascendFirmwareVersion)
	if fw := s.r.Firmware[NPU]; fw != "" {
		s.firmware[NPU] = []string{fw}
	}
	if list, ok := driver["compatible_version_fw"]; ok {
		ranges, err := parseVersionRanges(list)
		if err != nil {
			s.fail(kind, "", ascendDriverVersion, fmt.Errorf("compatible_version_fw: %w", err))
		} else {
			s.npuFirmwareRanges = ranges
		}
	}
}

// ascendVersion returns the version in an Ascend version.info file ("" if
// there is none, or it is not one) and all of the file's keys.
func (s *scanner) ascendVersion(p string) (string, map[string]string) {
	data, ok, err := s.read(p)
	if !ok && err == nil {
		return "", nil
	}
	if err != nil {
		s.fail(string(NPU), "", p, err)
		return "", nil
	}
	kv := parseKeyValues(data, '=')
	v := kv["Version"]
	if v == "" {
		v = kv["version"]
	}
	if v == "" {
		s.fail(string(NPU), "", p, errors.New("no Version= line"))
		return "", kv
	}
	if _, err := parseSingleVersion(v); err != nil {
		s.fail(string(NPU), "", p, err)
		return "", kv
	}
	return v, kv
}

// kernel reads the kernel release. A root without one (a fixture, a
// container without the host's /proc) has none, which is no error.
func (s *scanner) kernel() {
	if v, ok := s.readVersion("kernel", "proc/sys/kernel/osrelease"); ok {
		s.r.Kernel = v
	}
}

// kaeModules are the kernel modules of the engine classes, whose version
// (when the KAE driver package sets one) is the KAE driver version.
var kaeModules = map[string]string{"hpre": "hisi_hpre", "sec": "hisi_sec2", "zip": "hisi_zip"}

func (s *scanner) kae() {
	const kind = string(KAE)
	classes := map[string]bool{}
	for _, e := range s.readDir(kind, "sys/class/uacce") {
		class, _, ok := parseKAEName(e.Name())
		if !ok {
			continue
		}
		dir := path.Join("sys/class/uacce", e.Name())
		k := KAEEngine{Name: e.Name(), Class: class}
		var err error
		var p string
		for _, attr := range []string{"api", "algorithms", "available_instances", "flags"} {
			p = dir + "/" + attr
			data, ok, rerr := s.read(p)
			if rerr != nil {
				err = rerr
				break
			}
			if !ok {
				err = errors.New("missing")
				break
			}
			switch attr {
			case "api":
				k.API = strings.TrimSpace(data)
				if k.API == "" {
					err = errors.New("empty")
				}
			case "algorithms":
				k.Algorithms, err = parseAlgorithms(data)
			case "available_instances":
				k.AvailableInstances, err = parseCount(data)
			case "flags":
				k.Flags, err = parseCount(data)
			}
			if err != nil {
				break
			}
		}
		if err != nil {
			s.fail(kind, e.Name(), p, err)
			continue
		}
		s.r.KAE = append(s.r.KAE, k)
		classes[class] = true
	}
	for _, class := range []string{"hpre", "sec", "zip"} {
		if classes[class] {
			s.moduleVersion(KAE, kaeModules[class])
			if s.r.Drivers[KAE] != "" {
				return
			}
		}
	}
}

func (s *scanner) hugePages() {
	const kind = "hugepages"
	const dir = "sys/kernel/mm/hugepages"
	for _, e := range s.readDir(kind, dir) {
		size, err := parseHugePageSize(e.Name())
		if err != nil {
			continue
		}
		pool := HugePagePool{PageSize: size}
		p := path.Join(dir, e.Name())
		if pool.Total, err = s.count(p + "/nr_hugepages"); err == nil {
			pool.Free, err = s.count(p + "/free_hugepages")
		}
		if err != nil {
			s.fail(kind, e.Name(), errPath(err), err)
			continue
		}
		s.r.HugePages = append(s.r.HugePages, pool)
	}
	slices.SortFunc(s.r.HugePages, func(a, b HugePagePool) int { return int(a.PageSize>>10 - b.PageSize>>10) })
}

type pathError struct {
	path string
	err  error
}

func (e *pathError) Error() string { return e.err.Error() }
func (e *pathError) Unwrap() error { return e.err }

func errPath(err error) string {
	if pe, ok := err.(*pathError); ok {
		return pe.path
	}
	return ""
}

// count reads a decimal attribute; a missing one is an error.
func (s *scanner) count(p string) (int64, error) {
	data, ok, err := s.read(p)
	if err == nil && !ok {
		err = errors.New("missing")
	}
	if err == nil {
		var v int64
		if v, err = parseCount(data); err == nil {
			return v, nil
		}
	}
	return 0, &pathError{p, err}
}

var numaDir = regexp.MustCompile(`^node([0-9]+)$`)

func (s *scanner) numa() {
	const kind = "numa"
	const dir = "sys/devices/system/node"
	for _, e := range s.readDir(kind, dir) {
		m := numaDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		id, err := strconv.Atoi(m[1])
		if err != nil {
			continue
		}
		n := NUMANode{ID: id}
		p := path.Join(dir, e.Name(), "cpulist")
		data, ok, err := s.read(p)
		if err == nil && ok {
			n.CPUs, err = parseCPUList(data)
		}
		if err != nil {
			s.fail(kind, e.Name(), p, err)
			continue
		}
		p = path.Join(dir, e.Name(), "meminfo")
		data, ok, err = s.read(p)
		if err == nil && ok {
			n.MemTotal, n.MemFree, err = parseNodeMeminfo(data)
		}
		if err != nil {
			s.fail(kind, e.Name(), p, err)
			continue
		}
		s.r.NUMA = append(s.r.NUMA, n)
	}
	slices.SortFunc(s.r.NUMA, func(a, b NUMANode) int { return a.ID - b.ID })
}
