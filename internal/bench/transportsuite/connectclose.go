package transportsuite

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime/debug"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/procstat"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"

	// The simulated super node's ub provider.
	_ "github.com/ubkit-io/ubkit/ub/provider/simprov"
)

// The connect-close cases: what n connections made and closed leave
// behind, per path of ubkit's, against a unix socket and TCP loopback
// connected and closed as often. Each run sets up its listener (another
// process) and dialer, makes one connection for what they keep for good
// (a ub context), then n, each carrying a byte each way; the value is
// what the two processes hold beyond what they held after the first:
// descriptors ("fds added"), or resident memory ("MiB added", both
// processes' after their collectors gave back what is free). The target
// is 0. A connection that leaks shows up as n of them (issue 15: two
// descriptors and two 2 MiB mappings a connection on the ub path).
func connectCloseCases(n int) []bench.Case {
	name := fmt.Sprintf("connect-close-%d", n)
	var cases []bench.Case
	for _, path := range []string{"shm", "ub", "tcp"} {
		for _, m := range []struct{ metric, unit string }{{"fds", "fds added"}, {"rss", "MiB added"}} {
			run := func(kind string) func(time.Duration) (bench.Measurement, error) {
				return func(time.Duration) (bench.Measurement, error) {
					grew, err := connectClose(kind, path, n)
					if m.metric == "fds" {
						return bench.Measurement{Value: float64(grew.FDs)}, err
					}
					return bench.Measurement{Value: float64(grew.RSS) / (1 << 20)}, err
				}
			}
			cases = append(cases, bench.Case{Name: name + "/" + path + "/" + m.metric, Unit: m.unit, Better: "lower",
				Contenders: []bench.Contender{{Name: "ubkit", Run: run("ubkit")}, {Name: "uds", Run: run("uds")}, {Name: "tcp", Run: run("tcp")}}})
		}
	}
	return cases
}

// simTopology is the simulated super node the ub path's runs play: the
// listener node n0, the dialer n1.
const simTopology = "dev4"

// simEndpoint is an endpoint playing node of the simulated super node.
func simEndpoint(node string) (*transport.Endpoint, error) {
	t, err := topology.Example(simTopology)
	if err != nil {
		return nil, err
	}
	return transport.NewEndpoint(transport.Config{Node: node, Topology: t, Provider: "sim"})
}

// serveConnectClose is the listener's side: each connection gets what it
// sends back, and is closed once the dialer closed it. The process gives its
// free memory back to the system every 100 ms, so that its resident
// memory, read from outside, counts what it uses.
func serveConnectClose(l net.Listener) error {
	go func() {
		for range time.Tick(100 * time.Millisecond) {
			debug.FreeOSMemory()
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			io.Copy(c, c)
			c.Close()
		}()
	}
}

// connectClose runs n connections over kind (ubkit on path, or a baseline
// socket) and returns what the two processes hold beyond what they held
// after the first.
func connectClose(kind, path string, n int) (procstat.Usage, error) {
	serverKind, query := kind, ""
	var dialer *transport.Endpoint
	if kind == "ubkit" {
		switch path {
		case "ub":
			serverKind = "ubkit-sim"
			e, err := simEndpoint("n1")
			if err != nil {
				return procstat.Usage{}, err
			}
			defer e.Close()
			dialer = e
		case "tcp":
			query = "?path=tcp"
		}
	}
	p, addr, err := server(serverKind, "connect-close")
	if err != nil {
		return procstat.Usage{}, err
	}
	defer p.Kill()
	if dialer != nil {
		addr = "ub://n0/" + addr[len("ub:///"):]
	}
	once := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var c net.Conn
		var err error
		if dialer != nil {
			c, err = dialer.Dial(ctx, addr)
		} else {
			c, err = dial(ctx, kind, addr+query)
		}
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		b := []byte{1}
		if _, err := c.Write(b); err != nil {
			return err
		}
		_, err = io.ReadFull(c, b)
		return err
	}
	usage := func() (procstat.Usage, error) { return settledUsage(p.p.PID()) }
	if err := once(); err != nil {
		return procstat.Usage{}, err
	}
	before, err := usage()
	if err != nil {
		return procstat.Usage{}, err
	}
	for range n {
		if err := once(); err != nil {
			return procstat.Usage{}, err
		}
	}
	after, err := usage()
	return after.Sub(before), err
}

// settledUsage returns what this process and the listener peer hold
// together, once the listener closed its side of the last connection (a
// moment after the dialer): when their descriptors stayed the same for
// 250 ms (past the listener's next return of free memory), or after 3 s.
func settledUsage(peer int) (procstat.Usage, error) {
	read := func() (procstat.Usage, error) {
		self, err := procstat.Compact()
		if err != nil {
			return self, err
		}
		other, err := procstat.Of(peer)
		return self.Add(other), err
	}
	last, err := read()
	since, deadline := time.Now(), time.Now().Add(3*time.Second)
	for err == nil && time.Since(since) < 250*time.Millisecond && time.Now().Before(deadline) {
		time.Sleep(25 * time.Millisecond)
		var u procstat.Usage
		if u, err = read(); u.FDs != last.FDs {
			since = time.Now()
		}
		last = u
	}
	return last, err
}
