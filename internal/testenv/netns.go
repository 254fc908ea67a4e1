package testenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// NetnsPair is two network namespaces, A and B, joined by a veth link: two
// hosts for a test. Each namespace has lo up and one end of the link, named
// Link, up with its address. Nothing else is connected: the namespaces reach
// each other and nothing outside. Run both ends of a test inside them (see
// Command): the test process is in the host's namespace, which has no link to
// AddrA or AddrB and would send such packets to its default route.
type NetnsPair struct {
	A, B         string // namespace names, as `ip netns` knows them
	AddrA, AddrB string // IPv4 address of the link end in A and in B
	Link         string // name of the link end in each namespace

	created []string // namespaces this pair made, for its cleanup
}

// NetnsPrefixLen is the prefix length of AddrA and AddrB: each pair has its
// own /30 in 10.200.0.0/16.
const NetnsPrefixLen = 30

const (
	netnsPrefix = "ubkit-"
	netnsLink   = "ubkit0"
	// The /30s in 10.200.0.0/16: that many pairs per process before the
	// numbering wraps. Reusing a subnet would still be harmless: every pair's
	// link is alone in its own two namespaces.
	netnsSubnets = 1 << (NetnsPrefixLen - 16)
	// An `ip` call that takes longer than this is stuck.
	ipTimeout = 30 * time.Second

	// Capability bits (linux/capability.h) that `ip netns` and `ip link` need.
	capNetAdmin = 12
	capSysAdmin = 21
)

var (
	// netnsCount numbers pairs within this process; the pid in each name
	// separates processes.
	netnsCount atomic.Uint64
	// ownSweep guards the one sweep (in sweepLeftovers) that deletes
	// namespaces bearing this process's pid: before it has made any, they
	// can only be left by an earlier process that had the same pid.
	ownSweep sync.Once
)

// RequireNetns fails the test, naming what is missing and how to get it,
// unless NewNetnsPair can work here: it needs root (with CAP_SYS_ADMIN and
// CAP_NET_ADMIN) and the `ip` command from iproute2.
func RequireNetns(t testing.TB) {
	t.Helper()
	_, ipErr := ipPath()
	capEff, capsKnown := effectiveCaps()
	if problem := netnsProblem(os.Geteuid(), ipErr == nil, capEff, capsKnown); problem != "" {
		t.Fatal(problem)
	}
}

// netnsProblem says what stops network namespace tests from running, or ""
// if nothing does.
func netnsProblem(euid int, haveIP bool, capEff uint64, capsKnown bool) string {
	var missing []string
	if euid != 0 {
		missing = append(missing, fmt.Sprintf("root (this test runs as uid %d)", euid))
	}
	if !haveIP {
		missing = append(missing, "the `ip` command (not in $PATH, /usr/sbin or /sbin)")
	}
	if len(missing) > 0 {
		return "testenv: network namespace tests need root and the `ip` command (Debian package iproute2); missing: " +
			strings.Join(missing, " and ") +
			". Run `make test` as root, which installs iproute2 (or run `apt-get install iproute2` as root)"
	}
	need := uint64(1)<<capSysAdmin | uint64(1)<<capNetAdmin
	if capsKnown && capEff&need != need {
		return "testenv: network namespace tests need CAP_SYS_ADMIN and CAP_NET_ADMIN, and this root process " +
			"lacks them (a container started without --privileged?); run `make test` as root on the host " +
			"or in a privileged container"
	}
	return ""
}

// effectiveCaps reads this process's effective capability set. If it cannot
// (no /proc), known is false and `ip` will report what fails.
func effectiveCaps() (capEff uint64, known bool) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(status)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			capEff, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return capEff, err == nil
		}
	}
	return 0, false
}

// ipPath finds the `ip` command. Root's $PATH has /usr/sbin, but sudo or a
// minimal environment may not, so the usual places are tried too.
var ipPath = sync.OnceValues(func() (string, error) {
	path, err := exec.LookPath("ip")
	if err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if info, statErr := os.Stat(path); statErr == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return path, nil
		}
	}
	return "", err
})

// NewNetnsPair makes two network namespaces joined by a veth link and
// registers t.Cleanup to delete them (which deletes the link). It fails the
// test if the prerequisites are missing (see RequireNetns) or a step fails,
// after undoing the steps that succeeded.
//
// Names are ubkit-<pid>-<n>-a and ubkit-<pid>-<n>-b, unique across parallel
// tests and test processes. Before making them it deletes namespaces left by
// test processes that are gone (SweepNetns).
func NewNetnsPair(t testing.TB) *NetnsPair {
	t.Helper()
	RequireNetns(t)

	removed, sweepErr := sweepLeftovers()
	if len(removed) > 0 {
		t.Logf("testenv: deleted network namespaces left by test processes that are gone: %s", strings.Join(removed, " "))
	}
	if sweepErr != nil {
		// Not fatal: the leftovers are in no one's way, and if `ip` itself is
		// broken the next step says so.
		t.Logf("testenv: deleting leftover network namespaces: %v", sweepErr)
	}

	p, err := newNetnsPair(os.Getpid(), netnsCount.Add(1))
	if err != nil {
		t.Fatalf("testenv: making a network namespace pair: %v", err)
	}
	t.Cleanup(func() {
		if err := p.remove(); err != nil {
			t.Errorf("testenv: deleting network namespaces %s and %s: %v", p.A, p.B, err)
		}
	})
	return p
}

// OpenNetnsPair is NewNetnsPair for programs (a benchmark): it returns the
// pair, or why it cannot be made (the error of RequireNetns's checks, or
// of `ip`), and Close deletes it.
func OpenNetnsPair() (*NetnsPair, error) {
	if euid := os.Geteuid(); euid != 0 {
		return nil, fmt.Errorf("testenv: network namespaces need root (this is uid %d) and the ip command (Debian package iproute2)", euid)
	}
	if _, err := ipPath(); err != nil {
		return nil, err
	}
	sweepLeftovers()
	return newNetnsPair(os.Getpid(), netnsCount.Add(1))
}

// Close deletes the namespaces of a pair made by OpenNetnsPair.
func (p *NetnsPair) Close() error { return p.remove() }

// sweepLeftovers is SweepNetns, and the first time in this process, before
// it makes any namespace, it also deletes those that bear its own pid.
func sweepLeftovers() (removed []string, err error) {
	self := os.Getpid()
	swept := false
	ownSweep.Do(func() {
		swept = true
		removed, err = sweepNetns(func(pid int) bool { return pid == self || !pidAlive(pid) })
	})
	if swept {
		return removed, err
	}
	return SweepNetns()
}

// newNetnsPair makes pair number n of process pid. If a step fails it
// deletes what it made before returning the error.
func newNetnsPair(pid int, n uint64) (*NetnsPair, error) {
	p := &NetnsPair{
		A:    fmt.Sprintf("%s%d-%d-a", netnsPrefix, pid, n),
		B:    fmt.Sprintf("%s%d-%d-b", netnsPrefix, pid, n),
		Link: netnsLink,
	}
	p.AddrA, p.AddrB = netnsAddrs(n)
	if err := p.build(); err != nil {
		if cleanupErr := p.remove(); cleanupErr != nil {
			err = errors.Join(err, fmt.Errorf("undoing it: %w", cleanupErr))
		}
		return nil, err
	}
	return p, nil
}

func (p *NetnsPair) build() error {
	for _, ns := range []string{p.A, p.B} {
		if _, err := ip("netns", "add", ns); err != nil {
			return err
		}
		p.created = append(p.created, ns)
	}
	// Made directly inside the namespaces, so the link never exists in the
	// host's namespace, even briefly, and its ends' names cannot clash there.
	steps := [][]string{
		{"-n", p.A, "link", "add", p.Link, "type", "veth", "peer", "name", p.Link, "netns", p.B},
		{"-n", p.A, "addr", "add", fmt.Sprintf("%s/%d", p.AddrA, NetnsPrefixLen), "dev", p.Link},
		{"-n", p.B, "addr", "add", fmt.Sprintf("%s/%d", p.AddrB, NetnsPrefixLen), "dev", p.Link},
		{"-n", p.A, "link", "set", "lo", "up"},
		{"-n", p.B, "link", "set", "lo", "up"},
		{"-n", p.A, "link", "set", p.Link, "up"},
		{"-n", p.B, "link", "set", p.Link, "up"},
	}
	for _, args := range steps {
		if _, err := ip(args...); err != nil {
			return err
		}
	}
	return nil
}

// remove deletes the namespaces this pair made. It is idempotent.
func (p *NetnsPair) remove() error {
	var errs []error
	for _, ns := range p.created {
		if err := deleteNetns(ns); err != nil {
			errs = append(errs, err)
		}
	}
	p.created = nil
	return errors.Join(errs...)
}

// netnsAddrs gives pair n its /30 in 10.200.0.0/16: .1 and .2 of it.
func netnsAddrs(n uint64) (a, b string) {
	base := (n % netnsSubnets) * 4
	prefix := fmt.Sprintf("10.200.%d.", base/256)
	return prefix + strconv.FormatUint(base%256+1, 10), prefix + strconv.FormatUint(base%256+2, 10)
}

// Command returns a command that runs name with args inside namespace ns
// (p.A or p.B), through `ip netns exec`.
func (p *NetnsPair) Command(ns, name string, args ...string) *exec.Cmd {
	return p.CommandContext(context.Background(), ns, name, args...)
}

// CommandContext is Command with a context that kills the command when done.
// `ip netns exec` replaces itself with the command, so the kill reaches it.
func (p *NetnsPair) CommandContext(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	path, err := ipPath()
	if err != nil {
		path = "ip" // NewNetnsPair has failed the test already; let Start say so too.
	}
	return exec.CommandContext(ctx, path, append([]string{"netns", "exec", ns, name}, args...)...)
}

// SweepNetns deletes namespaces named ubkit-<pid>-... whose process is no
// longer alive (a test process that was killed before its cleanup ran), and
// returns their names. Namespaces of live processes and other names are left
// alone.
func SweepNetns() (removed []string, err error) {
	return sweepNetns(func(pid int) bool { return !pidAlive(pid) })
}

func sweepNetns(stale func(pid int) bool) (removed []string, err error) {
	names, err := listNetns()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, name := range names {
		pid, ok := parseNetnsName(name)
		if !ok || !stale(pid) {
			continue
		}
		if err := deleteNetns(name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// parseNetnsName returns the pid in a name that NewNetnsPair makes,
// ubkit-<pid>-<n>-a or -b; ok is false for any other name.
func parseNetnsName(name string) (pid int, ok bool) {
	parts := strings.Split(name, "-")
	if len(parts) != 4 || parts[0]+"-" != netnsPrefix || (parts[3] != "a" && parts[3] != "b") {
		return 0, false
	}
	if _, err := strconv.ParseUint(parts[2], 10, 64); err != nil {
		return 0, false
	}
	p, err := strconv.ParseUint(parts[1], 10, 31)
	if err != nil || p == 0 {
		return 0, false
	}
	return int(p), true
}

// pidAlive says whether process pid exists. When unsure it says yes, so that
// a sweep never deletes a live test's namespaces.
func pidAlive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return !errors.Is(err, fs.ErrNotExist)
}

// listNetns returns the names of the namespaces `ip netns` knows.
func listNetns() ([]string, error) {
	out, err := ip("netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		// A line is "name" or "name (id: N)".
		if fields := strings.Fields(line); len(fields) > 0 {
			names = append(names, fields[0])
		}
	}
	return names, nil
}

// deleteNetns deletes namespace ns. A namespace that is already gone (another
// process's sweep got there first) is not an error.
func deleteNetns(ns string) error {
	_, err := ip("netns", "delete", ns)
	if err == nil {
		return nil
	}
	names, listErr := listNetns()
	if listErr == nil && !slices.Contains(names, ns) {
		return nil
	}
	return err
}

// ip runs the `ip` command and returns its standard output; its error
// carries the command line and what `ip` wrote to standard error.
func ip(args ...string) ([]byte, error) {
	path, err := ipPath()
	if err != nil {
		return nil, fmt.Errorf("the `ip` command (Debian package iproute2) is missing: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).Output()
	if err != nil {
		msg := ""
		if exitErr, ok := errors.AsType[*exec.ExitError](err); ok {
			msg = strings.TrimSpace(string(exitErr.Stderr))
		}
		return out, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, msg)
	}
	return out, nil
}
