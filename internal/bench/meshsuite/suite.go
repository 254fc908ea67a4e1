// Package meshsuite is `ubctl bench mesh`: what the mesh adds to a call.
//
// The proxy cases time a call (HTTP, gRPC, or a plain TCP echo; 1 KiB
// each way) from an application on node00 of the simulated cm384 super
// node (any two nodes 1 µs apart) to a backend on node01 through node00's
// proxy, the bus (mutual TLS) and node01's proxy, and the same request
// straight to the backend over TCP, the two taking turns in stretches of
// 20 ms in the same run. The value is the p50 (or p99) the path adds.
//
// The cases named as the targets run as a deployment does, each part in a
// process of its own: the application, node00's proxy, node01's proxy and
// the backend (the control plane stays in this process). A super node
// gives each node CPUs of its own, so each simulated node gets one of the
// machine's CPUs: node00's processes (application and proxy) share one and
// node01's (proxy and backend) another, and the direct path crosses
// between the CPUs over TCP where the proxied path crosses over the bus
// (on a machine with one CPU, everything shares it). The "-1proc" cases run the same mesh
// with everything in this process: what the proxies' own work adds when no
// hop wakes another process.
//
// Beside ubkit, the target cases run the baseline a user would pick
// instead, the sidecar or ambient pattern: two HAProxy processes (Debian
// package haproxy) relaying at layer 4 between the nodes with mutual TLS,
// laid out as the node proxies are (see haproxyRelay); its row
// ("haproxy-mtls") is the latency it adds, measured the same way in the
// same invocation, round for round with ubkit's. Their reference row
// ("direct-tcp") is the direct call's latency itself, shown for scale.
//
// grpc-proxyless-unary times a unary gRPC call from a client process to a
// server process over the bus against the same over TCP loopback.
package meshsuite

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/transportsuite"
	"github.com/ubkit-io/ubkit/internal/meshsim"
)

// payload is every request's and answer's size.
const payload = 1 << 10

// Cases returns the suite's cases.
func Cases() []bench.Case {
	cases := []bench.Case{
		addedCase("proxy-http-1KB-added-p50", "http", 50, procSamples, haproxySamples),
		addedCase("proxy-http-1KB-added-p99", "http", 99, procSamples, haproxySamples),
		addedCase("proxy-grpc-1KB-added-p50", "grpc", 50, procSamples, haproxySamples),
		// The proxies carry TCP: a 1 KiB echo over a plain connection is
		// their own cost with no protocol on top.
		addedCase("proxy-tcp-1KB-added-p50", "tcp", 50, procSamples, haproxySamples),
		// HAProxy cannot run inside this process: the one-process cases
		// have no HAProxy row.
		addedCase("proxy-http-1KB-added-p50-1proc", "http", 50, inProcSamples, nil),
		addedCase("proxy-grpc-1KB-added-p50-1proc", "grpc", 50, inProcSamples, nil),
		addedCase("proxy-tcp-1KB-added-p50-1proc", "tcp", 50, inProcSamples, nil),
	}
	// A proxyless client resolves through xDS once; each call then takes
	// the same path as any gRPC call over ubkit, so the case is the
	// transport suite's gRPC unary round trip (client and server in two
	// processes) against gRPC over TCP loopback.
	for _, c := range transportsuite.Cases() {
		if c.Name != "grpc-unary" {
			continue
		}
		c.Name = "grpc-proxyless-unary"
		var cs []bench.Contender
		for _, ct := range c.Contenders {
			switch ct.Name {
			case "ubkit":
				cs = append(cs, ct)
			case "tcp":
				ct.Name = "grpc-tcp"
				cs = append(cs, ct)
			}
		}
		c.Contenders = cs
		cases = append(cases, c)
	}
	return cases
}

// samplesFunc starts a mesh for mode ("http", "grpc" or "tcp") and returns the
// round trips of calls through the proxies (unless directOnly) and of
// direct calls, taking turns for about d.
type samplesFunc func(mode string, d time.Duration, directOnly bool) (via, direct []float64, err error)

// addedCase is a case of the latency (at percentile pct) that a relay adds
// to a call of mode: ubkit's node proxies (run), against HAProxy relaying
// with mutual TLS (haproxy, unless nil) measured the same way in its own
// runs, with the direct call's latency (in ns, not added) as the reference.
func addedCase(name, mode string, pct int, run, haproxy samplesFunc) bench.Case {
	added := func(run samplesFunc) func(d time.Duration) (bench.Measurement, error) {
		return func(d time.Duration) (bench.Measurement, error) {
			vs, ds, err := run(mode, d, false)
			if err != nil {
				return bench.Measurement{}, err
			}
			return bench.Measurement{Value: percentile(vs, pct) - percentile(ds, pct)}, nil
		}
	}
	c := bench.Case{Name: name, Unit: "ns added", Better: "lower", Contenders: []bench.Contender{
		{Name: "ubkit", Run: added(run)},
		{Name: "direct-tcp", Role: bench.Reference, About: fmt.Sprintf("the direct call's p%d, for scale", pct),
			Run: func(d time.Duration) (bench.Measurement, error) {
				_, ds, err := run(mode, d, true)
				if err != nil {
					return bench.Measurement{}, err
				}
				return bench.Measurement{Value: percentile(ds, pct)}, nil
			}},
	}}
	if haproxy != nil {
		c.Contenders = append(c.Contenders, bench.Contender{Name: "haproxy-mtls", Run: added(haproxy)})
	}
	return c
}

// inProcSamples runs the mesh, the backend and the calls in this process.
func inProcSamples(mode string, d time.Duration, directOnly bool) ([]float64, []float64, error) {
	var m *meshsim.Mesh
	var err error
	switch mode {
	case "http":
		m, err = meshsim.Start(topo, []string{clientNode, serverNode}, service, serverNode, echo)
	case "grpc", "tcp":
		var l net.Listener
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, nil, err
		}
		defer l.Close()
		if mode == "grpc" {
			srv := grpcEcho()
			go srv.Serve(l)
			defer srv.Stop()
		} else {
			go serveTCPEcho(l)
		}
		m, err = meshsim.StartAt(topo, []string{clientNode, serverNode}, service, serverNode, l.Addr().String())
	default:
		err = fmt.Errorf("meshsuite: unknown mode %q", mode)
	}
	if err != nil {
		return nil, nil, err
	}
	defer m.Close()
	return measure(mode, m.Local[clientNode], m.Backend, d, directOnly)
}

// measure calls the backend at direct, and unless directOnly through the
// proxy at via, for about d, and returns the round trips (ns).
//
// The two paths take turns in stretches of back-to-back calls (A B A B
// ...), not call by call: a gRPC connection sends HTTP/2 control frames
// (BDP pings, window updates, their acks) after each answer, and call by
// call those of one path crossed the other path's calls, so each measured
// the other's traffic as well as its own. The first calls of a stretch,
// which the other path's last frames may still cross, are not counted.
func measure(mode, via, direct string, d time.Duration, directOnly bool) (vs, ds []float64, err error) {
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
	}()
	open := func(addr string) (func() (time.Duration, error), error) {
		call, stop, err := caller(mode, addr)
		if err != nil {
			return nil, err
		}
		closers = append(closers, stop)
		return call, nil
	}
	directCall, err := open(direct)
	if err != nil {
		return nil, nil, err
	}
	var viaCall func() (time.Duration, error)
	if !directOnly {
		if viaCall, err = open(via); err != nil {
			return nil, nil, err
		}
	}
	run := func(call func() (time.Duration, error), out *[]float64) error {
		for i, start := 0, time.Now(); i <= settle || time.Since(start) < burst; i++ {
			t, err := call()
			if err != nil {
				return err
			}
			if i >= settle {
				*out = append(*out, float64(t))
			}
		}
		return nil
	}
	for start := time.Now(); time.Since(start) < d; {
		if !directOnly {
			if err := run(viaCall, &vs); err != nil {
				return nil, nil, err
			}
		}
		if err := run(directCall, &ds); err != nil {
			return nil, nil, err
		}
	}
	return vs, ds, nil
}

// burst is how long each path runs at a stretch before the other takes
// over (at least one measured call), and settle how many calls open each
// stretch unmeasured.
const (
	burst  = 20 * time.Millisecond
	settle = 3
)

func percentile(s []float64, pct int) float64 {
	if len(s) == 0 {
		return 0
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*pct/100)]
}

// callTimeout bounds every call: a path that wedges fails its case.
const callTimeout = 10 * time.Second

// caller returns a call of mode to addr, timing one round trip of payload
// bytes each way and checking the echo.
func caller(mode, addr string) (func() (time.Duration, error), func(), error) {
	switch mode {
	case "http":
		c := &http.Client{Timeout: callTimeout}
		body := bytes.Repeat([]byte("m"), payload)
		url := "http://" + addr + "/echo"
		return func() (time.Duration, error) {
			start := time.Now()
			resp, err := c.Post(url, "application/octet-stream", bytes.NewReader(body))
			if err != nil {
				return 0, err
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || !bytes.Equal(got, body) {
				return 0, fmt.Errorf("meshsuite: the echo came back different (%v)", err)
			}
			return time.Since(start), nil
		}, c.CloseIdleConnections, nil
	case "grpc":
		cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			return nil, nil, err
		}
		body := bytes.Repeat([]byte("g"), payload)
		return func() (time.Duration, error) {
			var out []byte
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			defer cancel()
			start := time.Now()
			if err := cc.Invoke(ctx, "/ubkit.bench.Echo/Echo", &body, &out); err != nil {
				return 0, err
			}
			el := time.Since(start)
			if !bytes.Equal(out, body) {
				return 0, fmt.Errorf("meshsuite: the gRPC echo came back different")
			}
			return el, nil
		}, func() { cc.Close() }, nil
	case "tcp":
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, nil, err
		}
		out, in := bytes.Repeat([]byte("t"), payload), make([]byte, payload)
		return func() (time.Duration, error) {
			c.SetDeadline(time.Now().Add(callTimeout))
			start := time.Now()
			if _, err := c.Write(out); err != nil {
				return 0, err
			}
			if _, err := io.ReadFull(c, in); err != nil {
				return 0, err
			}
			el := time.Since(start)
			if !bytes.Equal(in, out) {
				return 0, fmt.Errorf("meshsuite: the TCP echo came back different")
			}
			return el, nil
		}, func() { c.Close() }, nil
	}
	return nil, nil, fmt.Errorf("meshsuite: unknown mode %q", mode)
}

var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Write(b)
})

// rawCodec sends []byte messages as they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "ubkit-mesh-raw" }

var _ encoding.Codec = rawCodec{}

var echoService = grpc.ServiceDesc{
	ServiceName: "ubkit.bench.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Echo", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		var b []byte
		if err := dec(&b); err != nil {
			return nil, err
		}
		return &b, nil
	}}},
}

// serveTCPEcho echoes payload bytes at a time on every connection l
// accepts, until l is closed.
func serveTCPEcho(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			b := make([]byte, payload)
			for {
				if _, err := io.ReadFull(c, b); err != nil {
					return
				}
				if _, err := c.Write(b); err != nil {
					return
				}
			}
		}()
	}
}

// grpcEcho is a gRPC server with the echo service.
func grpcEcho() *grpc.Server {
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&echoService, struct{}{})
	return srv
}
