package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// The test binary re-executed inside a namespace plays a TCP echo server or
// client there (netnsHelper); these variables tell it which.
const (
	netnsHelperEnv     = "UBKIT_TESTENV_NETNS_HELPER" // "serve" or "dial"
	netnsHelperAddrEnv = "UBKIT_TESTENV_NETNS_ADDR"   // host:port
)

// What a "dial" helper prints: the echo, or that the connection was refused.
const (
	dialEchoed  = "echoed "
	dialRefused = "refused"
)

// helperTimeout bounds every connection of the echo server, so a hung one
// cannot hang the test (ChildHangGuard bounds the helper processes).
const helperTimeout = 20 * time.Second

func TestNetnsPairEcho(t *testing.T) {
	t.Parallel()
	p := NewNetnsPair(t)
	tests := []struct {
		name     string
		from, to string
		toAddr   string
	}{
		{"A to B", p.A, p.B, p.AddrB},
		{"B to A", p.B, p.A, p.AddrA},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := startEchoServer(t, p, tt.to, net.JoinHostPort(tt.toAddr, "0"))
			msg := "hello from " + tt.from
			if got, want := dialFrom(t, p, tt.from, addr, msg), dialEchoed+msg; got != want {
				t.Fatalf("dialing %s from %s: got %q, want %q", addr, tt.from, got, want)
			}
		})
	}
}

// TestNetnsPairIsolation shows that each namespace has its own loopback: a
// server on 127.0.0.1 in A answers in A and is not there from B.
func TestNetnsPairIsolation(t *testing.T) {
	t.Parallel()
	p := NewNetnsPair(t)
	addr := startEchoServer(t, p, p.A, "127.0.0.1:0")
	if got, want := dialFrom(t, p, p.A, addr, "loopback"), dialEchoed+"loopback"; got != want {
		t.Fatalf("dialing %s inside A: got %q, want %q", addr, got, want)
	}
	if got := dialFrom(t, p, p.B, addr, "loopback"); got != dialRefused {
		t.Fatalf("dialing A's %s from B: got %q, want %q", addr, got, dialRefused)
	}
}

// TestNetnsPairParallel makes pairs from parallel tests and checks that their
// names and subnets differ and that each link is set up.
func TestNetnsPairParallel(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		names = map[string]bool{}
		addrs = map[string]bool{}
	)
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			p := NewNetnsPair(t)
			mu.Lock()
			for _, name := range []string{p.A, p.B} {
				if names[name] {
					t.Errorf("namespace name %s given out twice", name)
				}
				names[name] = true
			}
			for _, addr := range []string{p.AddrA, p.AddrB} {
				if addrs[addr] {
					t.Errorf("address %s given out twice", addr)
				}
				addrs[addr] = true
			}
			mu.Unlock()
			for _, end := range []struct{ ns, addr string }{{p.A, p.AddrA}, {p.B, p.AddrB}} {
				out, err := ip("-n", end.ns, "-o", "-4", "addr", "show", "dev", p.Link, "up")
				if err != nil {
					t.Fatal(err)
				}
				if want := fmt.Sprintf("inet %s/%d", end.addr, NetnsPrefixLen); !strings.Contains(string(out), want) {
					t.Errorf("%s in %s: want %q up, got %q", p.Link, end.ns, want, out)
				}
			}
		})
	}
}

// TestNetnsPairCleanup runs alone (not parallel), so this process's
// namespaces are exactly those it makes.
func TestNetnsPairCleanup(t *testing.T) {
	before := ownNetns(t)
	var p *NetnsPair
	t.Run("pair", func(t *testing.T) {
		p = NewNetnsPair(t)
		during := ownNetns(t)
		for _, ns := range []string{p.A, p.B} {
			if !slices.Contains(during, ns) {
				t.Errorf("`ip netns list` lacks %s while the pair exists: %v", ns, during)
			}
		}
	})
	if p == nil {
		t.Fatal("no pair made")
	}
	if after := ownNetns(t); !slices.Equal(before, after) {
		t.Errorf("this process's namespaces before the pair: %v, after its cleanup: %v", before, after)
	}
}

// TestNetnsPairRollback makes the second step fail (B's name is taken) and
// checks that A, made by the first, is deleted, and that the namespace that
// was in the way, which the pair did not make, is not.
func TestNetnsPairRollback(t *testing.T) {
	RequireNetns(t)
	sweepLeftovers() // before this test makes namespaces with its own pid
	pid, n := os.Getpid(), netnsCount.Add(1)
	inTheWay := fmt.Sprintf("%s%d-%d-b", netnsPrefix, pid, n)
	makeNetns(t, inTheWay)

	p, err := newNetnsPair(pid, n)
	if err == nil {
		p.remove()
		t.Fatalf("newNetnsPair succeeded with %s taken", inTheWay)
	}
	t.Logf("expected error: %v", err)
	names := ownNetns(t)
	if a := fmt.Sprintf("%s%d-%d-a", netnsPrefix, pid, n); slices.Contains(names, a) {
		t.Errorf("%s left behind after a failed pair", a)
	}
	if !slices.Contains(names, inTheWay) {
		t.Errorf("%s, which the failed pair did not make, was deleted", inTheWay)
	}
}

func TestSweepNetns(t *testing.T) {
	RequireNetns(t)
	sweepLeftovers() // before this test makes namespaces with its own pid
	dead := fmt.Sprintf("%s%d-1-a", netnsPrefix, deadPid(t))
	live := fmt.Sprintf("%s%d-%d-b", netnsPrefix, os.Getpid(), netnsCount.Add(1))
	makeNetns(t, dead)
	makeNetns(t, live)

	removed, err := SweepNetns()
	if err != nil {
		t.Fatal(err)
	}
	// Another test process's sweep may have deleted dead first, so the test
	// is that it is gone, not who deleted it.
	if slices.Contains(removed, live) {
		t.Errorf("SweepNetns removed %s, whose process is alive", live)
	}
	names, err := listNetns()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, dead) || !slices.Contains(names, live) {
		t.Errorf("after SweepNetns: %v; want %s gone and %s kept", names, dead, live)
	}
}

func TestParseNetnsName(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"ubkit-123-4-a", 123, true},
		{"ubkit-4194304-1000000-b", 4194304, true},
		{"ubkit-123-4-c", 0, false},
		{"ubkit-123-4", 0, false},
		{"ubkit-123-4-a-x", 0, false},
		{"ubkit-+12-4-a", 0, false},
		{"ubkit-0-4-a", 0, false},
		{"ubkit-12-x-a", 0, false},
		{"ubkitx-12-1-a", 0, false},
		{"cni-1234-1-a", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		pid, ok := parseNetnsName(tt.name)
		if pid != tt.pid || ok != tt.ok {
			t.Errorf("parseNetnsName(%q) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
	}
}

func TestNetnsAddrs(t *testing.T) {
	tests := []struct {
		n    uint64
		a, b string
	}{
		{1, "10.200.0.5", "10.200.0.6"},
		{63, "10.200.0.253", "10.200.0.254"},
		{64, "10.200.1.1", "10.200.1.2"},
		{netnsSubnets - 1, "10.200.255.253", "10.200.255.254"},
		{netnsSubnets, "10.200.0.1", "10.200.0.2"},
	}
	for _, tt := range tests {
		if a, b := netnsAddrs(tt.n); a != tt.a || b != tt.b {
			t.Errorf("netnsAddrs(%d) = %s, %s; want %s, %s", tt.n, a, b, tt.a, tt.b)
		}
	}
}

// TestNetnsProblem pins the messages a user sees when a prerequisite is
// missing (this machine has them all, so RequireNetns cannot show them).
func TestNetnsProblem(t *testing.T) {
	allCaps := uint64(1)<<capSysAdmin | uint64(1)<<capNetAdmin
	tests := []struct {
		name      string
		euid      int
		haveIP    bool
		capEff    uint64
		capsKnown bool
		want      string
	}{
		{"all there", 0, true, allCaps, true, ""},
		{"caps unknown", 0, true, 0, false, ""},
		{"not root", 1000, true, 0, true,
			"testenv: network namespace tests need root and the `ip` command (Debian package iproute2); " +
				"missing: root (this test runs as uid 1000). Run `make test` as root, which installs iproute2 " +
				"(or run `apt-get install iproute2` as root)"},
		{"no ip", 0, false, allCaps, true,
			"testenv: network namespace tests need root and the `ip` command (Debian package iproute2); " +
				"missing: the `ip` command (not in $PATH, /usr/sbin or /sbin). Run `make test` as root, which " +
				"installs iproute2 (or run `apt-get install iproute2` as root)"},
		{"neither", 1000, false, 0, true,
			"testenv: network namespace tests need root and the `ip` command (Debian package iproute2); " +
				"missing: root (this test runs as uid 1000) and the `ip` command (not in $PATH, /usr/sbin or /sbin). " +
				"Run `make test` as root, which installs iproute2 (or run `apt-get install iproute2` as root)"},
		{"root without caps", 0, true, 1 << capNetAdmin, true,
			"testenv: network namespace tests need CAP_SYS_ADMIN and CAP_NET_ADMIN, and this root process " +
				"lacks them (a container started without --privileged?); run `make test` as root on the host " +
				"or in a privileged container"},
	}
	for _, tt := range tests {
		if got := netnsProblem(tt.euid, tt.haveIP, tt.capEff, tt.capsKnown); got != tt.want {
			t.Errorf("%s: netnsProblem() =\n%q\nwant\n%q", tt.name, got, tt.want)
		}
	}
}

// ownNetns lists the namespaces whose names carry this process's pid.
func ownNetns(t *testing.T) []string {
	t.Helper()
	names, err := listNetns()
	if err != nil {
		t.Fatal(err)
	}
	var own []string
	for _, name := range names {
		if pid, ok := parseNetnsName(name); ok && pid == os.Getpid() {
			own = append(own, name)
		}
	}
	slices.Sort(own)
	return own
}

// makeNetns makes a bare namespace and deletes it when the test ends.
func makeNetns(t *testing.T, name string) {
	t.Helper()
	if _, err := ip("netns", "add", name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := deleteNetns(name); err != nil {
			t.Error(err)
		}
	})
}

// deadPid returns the pid of a process that has exited.
func deadPid(t *testing.T) int {
	t.Helper()
	path, err := ipPath()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		cmd := exec.Command(path, "-V")
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
		if pid := cmd.Process.Pid; !pidAlive(pid) {
			return pid
		}
	}
	t.Fatal("every pid tried was reused at once")
	return 0
}

// startEchoServer runs an echo server in namespace ns, listening on addr,
// until the test ends, and returns the address it listens on.
func startEchoServer(t *testing.T, p *NetnsPair, ns, addr string) string {
	t.Helper()
	cmd := helperCommand(t, p, ns, "serve", addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the server's signal to stop
		if err := cmd.Wait(); err != nil {
			t.Errorf("echo server in %s: %v; stderr: %s", ns, err, stderr.String())
		}
	})
	// The server prints its address once it listens, so no dial comes early.
	// If it dies or hangs instead, its pipe closes (ChildHangGuard kills it).
	line, err := bufio.NewReader(stdout).ReadString('\n')
	listening, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("echo server in %s did not start: %q, %v; stderr: %s", ns, line, err, stderr.String())
	}
	return listening
}

// dialFrom connects from namespace ns to addr, sends msg, and returns what
// the dialing helper reports: dialEchoed and the reply, or dialRefused.
func dialFrom(t *testing.T, p *NetnsPair, ns, addr, msg string) string {
	t.Helper()
	cmd := helperCommand(t, p, ns, "dial", addr)
	cmd.Stdin = strings.NewReader(msg)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("dialing %s from %s: %v; output %q; stderr: %s", addr, ns, err, out, stderr.String())
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return line
}

func helperCommand(t *testing.T, p *NetnsPair, ns, mode, addr string) *exec.Cmd {
	t.Helper()
	return p.Child(t, ns, "netns-helper", netnsHelperEnv+"="+mode, netnsHelperAddrEnv+"="+addr,
		// A -race binary otherwise waits a second at exit (for late reports).
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
}

func init() { RegisterChild("netns-helper", netnsHelper) }

// netnsHelper is the server or client that the tests above run inside a
// namespace.
func netnsHelper() int {
	mode, addr := os.Getenv(netnsHelperEnv), os.Getenv(netnsHelperAddrEnv)
	var err error
	switch mode {
	case "serve":
		err = serveEcho(addr)
	case "dial":
		err = dialEcho(addr)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "netns helper %s %s: %v\n", mode, addr, err)
		return 1
	}
	return 0
}

// serveEcho echoes every connection to addr until its standard input closes.
func serveEcho(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		ln.Close()
	}()
	for {
		conn, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(helperTimeout))
			io.Copy(conn, conn)
		}()
	}
}

// dialEcho sends its standard input to the echo server at addr and prints
// the reply, or dialRefused if nothing listens there.
func dialEcho(addr string) error {
	msg, err := io.ReadAll(os.Stdin)
	if err != nil {
		return err
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if errors.Is(err, shm.ErrConnRefused) {
		fmt.Println(dialRefused)
		return nil
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(msg); err != nil {
		return err
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	reply, err := io.ReadAll(conn)
	if err != nil {
		return err
	}
	fmt.Println(dialEchoed + string(reply))
	return nil
}
