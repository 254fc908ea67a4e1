// Package meshsuite is `ubctl bench mesh`: what the mesh adds to a call.
//
// The proxy cases run a mesh on the simulated cm384 super node (any two
// nodes 1 µs apart) in this process: an application on node00 calls a
// backend on node01 through node00's proxy, the bus (mutual TLS) and
// node01's proxy; the same request goes straight to the backend over TCP,
// the two taking turns in stretches of 20 ms in the same run. The value is
// the p50 (or p99) the path adds. grpc-proxyless-unary times a unary gRPC
// call from a client process to a server process over the bus against the
// same over TCP loopback.
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
		addedCase("proxy-http-1KB-added-p50", httpPaths, 50),
		addedCase("proxy-http-1KB-added-p99", httpPaths, 99),
		addedCase("proxy-grpc-1KB-added-p50", grpcPaths, 50),
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

// paths starts a mesh and returns a call through the proxies and a direct
// call, each timing one round trip of 1 KiB each way.
type paths func() (viaProxies, direct func() (time.Duration, error), stop func(), err error)

// burst is how long each path runs at a stretch before the other takes
// over (at least one measured call), and settle how many calls open each
// stretch unmeasured.
const (
	burst  = 20 * time.Millisecond
	settle = 3
)

func addedCase(name string, mk paths, pct int) bench.Case {
	return bench.Case{Name: name, Unit: "ns added", Better: "lower", Contenders: []bench.Contender{
		{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) {
			via, direct, stop, err := mk()
			if err != nil {
				return bench.Measurement{}, err
			}
			defer stop()
			// The two paths take turns in stretches of back-to-back calls
			// (A B A B ...), not call by call: a gRPC connection sends
			// HTTP/2 control frames (BDP pings, window updates, their
			// acks) after each answer, and call by call those of one path
			// crossed the other path's calls, so each measured the other's
			// traffic as well as its own. The first calls of a stretch,
			// which the other path's last frames may still cross, are not
			// counted.
			var vs, ds []float64
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
				if err := run(via, &vs); err != nil {
					return bench.Measurement{}, err
				}
				if err := run(direct, &ds); err != nil {
					return bench.Measurement{}, err
				}
			}
			return bench.Measurement{Value: percentile(vs, pct) - percentile(ds, pct)}, nil
		}},
		{Name: "direct-tcp", Run: func(d time.Duration) (bench.Measurement, error) {
			_, direct, stop, err := mk()
			if err != nil {
				return bench.Measurement{}, err
			}
			defer stop()
			var ds []float64
			for start := time.Now(); time.Since(start) < d; {
				w, err := direct()
				if err != nil {
					return bench.Measurement{}, err
				}
				ds = append(ds, float64(w))
			}
			return bench.Measurement{Value: percentile(ds, pct)}, nil
		}},
	}}
}

func percentile(s []float64, pct int) float64 {
	if len(s) == 0 {
		return 0
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*pct/100)]
}

var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Write(b)
})

func httpPaths() (func() (time.Duration, error), func() (time.Duration, error), func(), error) {
	m, err := meshsim.Start("cm384", []string{"node00", "node01"}, "echo", "node01", echo)
	if err != nil {
		return nil, nil, nil, err
	}
	viaClient, directClient := &http.Client{Timeout: 10 * time.Second}, &http.Client{Timeout: 10 * time.Second}
	body := bytes.Repeat([]byte("m"), payload)
	call := func(c *http.Client, addr string) func() (time.Duration, error) {
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
		}
	}
	stop := func() {
		viaClient.CloseIdleConnections()
		directClient.CloseIdleConnections()
		m.Close()
	}
	return call(viaClient, m.Local["node00"]), call(directClient, m.Backend), stop, nil
}

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

func grpcPaths() (func() (time.Duration, error), func() (time.Duration, error), func(), error) {
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&echoService, struct{}{})
	// The mesh's service is the gRPC server's TCP port.
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	go srv.Serve(gl)
	m, err := meshsim.StartAt("cm384", []string{"node00", "node01"}, "echo", "node01", gl.Addr().String())
	if err != nil {
		srv.Stop()
		return nil, nil, nil, err
	}
	dial := func(addr string) (*grpc.ClientConn, error) {
		return grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	}
	via, err := dial(m.Local["node00"])
	if err != nil {
		m.Close()
		srv.Stop()
		return nil, nil, nil, err
	}
	direct, err := dial(gl.Addr().String())
	if err != nil {
		via.Close()
		m.Close()
		srv.Stop()
		return nil, nil, nil, err
	}
	body := bytes.Repeat([]byte("g"), payload)
	call := func(cc *grpc.ClientConn) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			var out []byte
			start := time.Now()
			if err := cc.Invoke(context.Background(), "/ubkit.bench.Echo/Echo", &body, &out); err != nil {
				return 0, err
			}
			el := time.Since(start)
			if !bytes.Equal(out, body) {
				return 0, fmt.Errorf("meshsuite: the gRPC echo came back different")
			}
			return el, nil
		}
	}
	stop := func() {
		via.Close()
		direct.Close()
		m.Close()
		srv.Stop()
	}
	return call(via), call(direct), stop, nil
}
