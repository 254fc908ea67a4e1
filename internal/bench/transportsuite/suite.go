// Package transportsuite is the `ubctl bench transport` suite: connections
// over ubkit's transport against TCP loopback and a unix socket, each
// between two processes, with unchanged gRPC and net/http on top.
package transportsuite

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/transport/ubgrpc"
)

// Cases returns the suite's cases: ubkit (the same-host path) against
// "tcp" (loopback) and "uds" (a unix socket).
func Cases() []bench.Case {
	three := func(run func(kind string, d time.Duration) (bench.Measurement, error)) []bench.Contender {
		var cs []bench.Contender
		for _, k := range []string{"ubkit", "tcp", "uds"} {
			cs = append(cs, bench.Contender{Name: k, Run: func(d time.Duration) (bench.Measurement, error) { return run(k, d) }})
		}
		return cs
	}
	return append([]bench.Case{
		{Name: "echo-64B", Unit: "ns/op", Better: "lower", Latency: true, Contenders: three(echo)},
		onePCase(),
		{Name: "stream-64KiB", Unit: "GB/s", Better: "higher", Contenders: three(stream)},
		{Name: "grpc-unary", Unit: "ns/op", Better: "lower", Latency: true, Contenders: three(grpcUnary)},
		{Name: "grpc-stream-1MiB", Unit: "GB/s", Better: "higher", Contenders: three(grpcStream)},
		{Name: "http1-rps", Unit: "requests/s", Better: "higher", Contenders: three(httpRPS)},
	}, connectCloseCases(connectCloseCycles)...)
}

// connectCloseCycles is how many connections the connect-close cases make.
const connectCloseCycles = 1000

// DemoCases is what `ubctl demo` shows: a gRPC unary call to a server in
// another process, over ubkit and over TCP loopback.
func DemoCases() []bench.Case {
	var out []bench.Case
	for _, c := range Cases() {
		if c.Name == "grpc-unary" {
			c.Contenders = c.Contenders[:2] // ubkit, tcp
			out = append(out, c)
		}
	}
	return out
}

type peerArgs struct {
	Kind string `json:"kind"` // ubkit, ubkit-sim (node n0 of dev4), tcp or uds
	Mode string `json:"mode"` // echo, sink, grpc, grpc-stream, http or connect-close
}

func init() {
	bench.RegisterPeer("transport-server", func(raw json.RawMessage) error {
		var a peerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		l, addr, err := listen(a.Kind)
		if err != nil {
			return err
		}
		defer l.Close()
		fmt.Println(addr)
		switch a.Mode {
		case "grpc-stream":
			return newStreamServer(a.Kind).Serve(l)
		case "grpc":
			srv := grpc.NewServer(serverOptions(a.Kind)...)
			healthpb.RegisterHealthServer(srv, health.NewServer())
			return srv.Serve(l)
		case "http":
			return http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.Write([]byte("ok"))
			}))
		case "connect-close":
			return serveConnectClose(l)
		}
		c, err := l.Accept()
		if err != nil {
			return err
		}
		defer c.Close()
		if a.Mode == "echo" {
			buf := make([]byte, 64)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return nil
				}
				if _, err := c.Write(buf); err != nil {
					return nil
				}
			}
		}
		// sink: read and sum everything, then report count and checksum.
		r := bufio.NewReaderSize(c, 256<<10)
		buf := make([]byte, 64<<10)
		var n, sum uint64
		for {
			k, err := io.ReadFull(r, buf)
			sum += bench.Sum(buf[:k])
			n += uint64(k)
			if err != nil {
				break
			}
		}
		var res [16]byte
		binary.LittleEndian.PutUint64(res[:], n)
		binary.LittleEndian.PutUint64(res[8:], sum)
		c.Write(res[:])
		return nil
	})
}

func listen(kind string) (net.Listener, string, error) {
	switch kind {
	case "ubkit":
		addr := fmt.Sprintf("ub:///bench-%d", os.Getpid())
		l, err := transport.Listen(context.Background(), addr)
		return l, addr, err
	case "ubkit-sim":
		e, err := simEndpoint("n0")
		if err != nil {
			return nil, "", err
		}
		addr := fmt.Sprintf("ub:///bench-%d", os.Getpid())
		l, err := e.Listen(context.Background(), addr)
		return l, addr, err
	case "tcp":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", err
		}
		return l, l.Addr().String(), nil
	}
	if err := os.MkdirAll(transport.RuntimeDir(), 0o700); err != nil {
		return nil, "", err
	}
	l, err := net.Listen("unix", filepath.Join(transport.RuntimeDir(), fmt.Sprintf("bench-uds-%d.sock", os.Getpid())))
	if err != nil {
		return nil, "", err
	}
	return l, l.Addr().String(), nil
}

func dial(ctx context.Context, kind, addr string) (net.Conn, error) {
	switch kind {
	case "ubkit":
		return transport.Dial(ctx, addr)
	case "tcp":
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", addr)
}

// server starts a peer serving mode over kind and returns it and its
// address; kill stops it and removes what a killed peer leaves behind.
func server(kind, mode string) (*killer, string, error) {
	p, addr, err := startServer(kind, mode)
	if err != nil {
		return nil, "", err
	}
	return &killer{p, kind, addr}, addr, nil
}

type killer struct {
	p          *bench.Peer
	kind, addr string
}

func (k *killer) Kill() {
	k.p.Kill()
	switch k.kind {
	case "uds":
		os.Remove(k.addr)
	case "ubkit", "ubkit-sim":
		if ep, err := transport.Default(); err == nil {
			ep.Sweep()
		}
	}
}

func startServer(kind, mode string) (*bench.Peer, string, error) {
	p, err := bench.StartPeerPipe("transport-server", peerArgs{Kind: kind, Mode: mode})
	if err != nil {
		return nil, "", err
	}
	addr, err := bufio.NewReader(p.Stdout()).ReadString('\n')
	if err != nil {
		p.Kill()
		return nil, "", fmt.Errorf("transport-server: %w", err)
	}
	return p, strings.TrimSpace(addr), nil
}

// connTo starts a server peer in mode over kind and dials it; stop closes
// the connection and kills the peer.
func connTo(kind, mode string) (net.Conn, func(), error) {
	p, addr, err := server(kind, mode)
	if err != nil {
		return nil, nil, err
	}
	c, err := dial(context.Background(), kind, addr)
	if err != nil {
		p.Kill()
		return nil, nil, err
	}
	return c, func() { c.Close(); p.Kill() }, nil
}

// grpcTo starts a gRPC server peer in mode over kind and returns a client
// connection to it; stop closes it and kills the peer.
func grpcTo(kind, mode string, opts ...grpc.DialOption) (*grpc.ClientConn, func(), error) {
	p, addr, err := server(kind, mode)
	if err != nil {
		return nil, nil, err
	}
	target := "passthrough:///bench"
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if kind == "ubkit" {
		// What a ubkit user writes: the ub:// address as the target, and
		// package ubgrpc's options.
		target = addr
		opts = append(opts, ubgrpc.DialOptions(nil)...)
	} else {
		opts = append(opts,
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return dial(ctx, kind, addr) }),
			grpc.WithInitialWindowSize(ubgrpc.StreamWindow), grpc.WithInitialConnWindowSize(ubgrpc.ConnWindow))
	}
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		p.Kill()
		return nil, nil, err
	}
	return cc, func() { cc.Close(); p.Kill() }, nil
}

// serverOptions are a gRPC server's options over kind: package ubgrpc's
// for ubkit; for the sockets, the same flow-control windows (so that the
// connection is what differs; they gain little or nothing from them,
// docs/PERFORMANCE.md) and gRPC's read buffer, which saves them system
// calls.
func serverOptions(kind string) []grpc.ServerOption {
	if kind == "ubkit" {
		return ubgrpc.ServerOptions()
	}
	return []grpc.ServerOption{grpc.InitialWindowSize(ubgrpc.StreamWindow), grpc.InitialConnWindowSize(ubgrpc.ConnWindow)}
}

func latency(samples []float64) bench.Measurement {
	s := slices.Clone(samples)
	slices.Sort(s)
	return bench.Measurement{Value: s[len(s)/2], Samples: samples}
}

func echo(kind string, d time.Duration) (bench.Measurement, error) {
	c, stop, err := connTo(kind, "echo")
	if err != nil {
		return bench.Measurement{}, err
	}
	defer stop()
	out, in := make([]byte, 64), make([]byte, 64)
	var samples []float64
	start := time.Now()
	for i := uint64(0); time.Since(start) < d; i++ {
		t0 := time.Now()
		bench.Fill(out, i)
		if _, err := c.Write(out); err != nil {
			return bench.Measurement{}, err
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return bench.Measurement{}, err
		}
		if bench.Sum(in) != bench.FillSum(64, i) {
			return bench.Measurement{}, fmt.Errorf("echo mismatch")
		}
		samples = append(samples, float64(time.Since(t0)))
	}
	return latency(samples), nil
}

func stream(kind string, d time.Duration) (bench.Measurement, error) {
	c, stop, err := connTo(kind, "sink")
	if err != nil {
		return bench.Measurement{}, err
	}
	defer stop()
	buf := make([]byte, 64<<10)
	var n, sum uint64
	start := time.Now()
	for i := uint64(0); time.Since(start) < d; i++ {
		bench.Fill(buf, i)
		sum += bench.FillSum(len(buf), i)
		if _, err := c.Write(buf); err != nil {
			return bench.Measurement{}, err
		}
		n += uint64(len(buf))
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	var res [16]byte
	if _, err := io.ReadFull(c, res[:]); err != nil {
		return bench.Measurement{}, fmt.Errorf("sink result: %w", err)
	}
	el := time.Since(start)
	if binary.LittleEndian.Uint64(res[:]) != n || binary.LittleEndian.Uint64(res[8:]) != sum {
		return bench.Measurement{}, fmt.Errorf("sink got different bytes")
	}
	return bench.Measurement{Value: float64(n) / el.Seconds() / 1e9}, nil
}

func grpcUnary(kind string, d time.Duration) (bench.Measurement, error) {
	cc, stop, err := grpcTo(kind, "grpc")
	if err != nil {
		return bench.Measurement{}, err
	}
	defer stop()
	client := healthpb.NewHealthClient(cc)
	ctx := context.Background()
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		return bench.Measurement{}, err
	}
	var samples []float64
	start := time.Now()
	for time.Since(start) < d {
		t0 := time.Now()
		if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			return bench.Measurement{}, err
		}
		samples = append(samples, float64(time.Since(t0)))
	}
	return latency(samples), nil
}

func httpRPS(kind string, d time.Duration) (bench.Measurement, error) {
	p, addr, err := server(kind, "http")
	if err != nil {
		return bench.Measurement{}, err
	}
	defer p.Kill()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx, kind, addr) }}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		resp, err := client.Get("http://bench/")
		if err != nil {
			return bench.Measurement{}, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		n++
	}
	return bench.Measurement{Value: float64(n) / time.Since(start).Seconds()}, nil
}
