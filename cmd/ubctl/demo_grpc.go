package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// demoCalls is how many health checks each client makes; tests shorten it.
var demoCalls = 300

// demoGRPCSuperNode runs an unchanged gRPC server on node n0 of the dev4
// simulated super node and calls it from a client on n0, one on n1 and one
// over plain TCP, printing the path gRPC saw for each and the latencies.
func demoGRPCSuperNode(w io.Writer) error {
	t, err := topology.Example("dev4")
	if err != nil {
		return err
	}
	endpoint := func(node string) (*transport.Endpoint, error) {
		return transport.NewEndpoint(transport.Config{Node: node, Topology: t, Provider: "sim",
			RuntimeDir: transport.RuntimeDir() + "/demo"})
	}
	n0, err := endpoint("n0")
	if err != nil {
		return err
	}
	defer n0.Close()
	n1, err := endpoint("n1")
	if err != nil {
		return err
	}
	defer n1.Close()

	l, err := n0.Listen(context.Background(), "ub:///health")
	if err != nil {
		return err
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		l.Close()
		return err
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	go srv.Serve(tl)
	defer srv.Stop()

	type client struct {
		label, target string
		dial          func(context.Context, string) (net.Conn, error)
	}
	clients := []client{
		{"client on n0 (same node)", "passthrough:///n0", func(ctx context.Context, _ string) (net.Conn, error) {
			return n0.Dial(ctx, "ub://n0/health")
		}},
		{"client on n1 (other node)", "passthrough:///n1", func(ctx context.Context, _ string) (net.Conn, error) {
			return n1.Dial(ctx, "ub://n0/health")
		}},
		{"plain TCP loopback", "passthrough:///tcp", func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", tl.Addr().String())
		}},
	}
	cost, _ := t.PathCost("n1", "n0", 64)
	fmt.Fprintf(w, "\ngRPC on a simulated super node (dev4 in this process: 4 nodes, each link %v one way):\n", cost.Latency)
	fmt.Fprintf(w, "an unchanged grpc-go server on n0, %d health checks per client\n", demoCalls)
	fmt.Fprintf(w, "  %-28s %-28s %12s %12s\n", "client", "server address gRPC saw", "p50", "p99")
	for _, c := range clients {
		cc, err := grpc.NewClient(c.target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(c.dial))
		if err != nil {
			return err
		}
		hc := healthpb.NewHealthClient(cc)
		lat := make([]time.Duration, 0, demoCalls)
		var path string
		for i := range demoCalls + 20 {
			var p peer.Peer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
			took := time.Since(start)
			cancel()
			if err != nil {
				cc.Close()
				return fmt.Errorf("%s: %w", c.label, err)
			}
			if i >= 20 { // the first calls connect and warm up
				lat = append(lat, took)
			}
			path = p.Addr.String() // the connection's remote address, path included
		}
		cc.Close()
		slices.Sort(lat)
		fmt.Fprintf(w, "  %-28s %-28s %12v %12v\n", c.label, path,
			lat[len(lat)/2].Round(100*time.Nanosecond), lat[len(lat)*99/100].Round(100*time.Nanosecond))
	}
	fmt.Fprintln(w, "  (the n1 client's calls cross the simulated link: each request and answer pays its latency)")
	return nil
}
