package mesh

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// slowHealth answers after delay (the time its work takes, not a
// synchronisation), saying which node it is.
type slowHealth struct {
	healthpb.UnimplementedHealthServer
	node  string
	delay *time.Duration
	mu    *sync.Mutex
}

func (s slowHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	s.mu.Lock()
	d := *s.delay
	s.mu.Unlock()
	time.Sleep(d)
	grpc.SetHeader(ctx, metadata.Pairs("node", s.node))
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// TestTopologyBalancer: with two endpoints on the client's node and two on
// another, light load stays local; overload spills to the far node; with
// the local endpoints gone, calls go on there, none failing.
func TestTopologyBalancer(t *testing.T) {
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	eps := map[string]*transport.Endpoint{}
	for _, n := range []string{"n1", "n2"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		eps[n] = ep
	}
	var delay time.Duration
	var mu sync.Mutex
	var addrs []resolver.Address
	var services []Service
	stops := map[string][]func(){}
	for i, n := range []string{"n1", "n1", "n2", "n2"} {
		srv := grpc.NewServer()
		healthpb.RegisterHealthServer(srv, slowHealth{node: n, delay: &delay, mu: &mu})
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		bus := fmt.Sprintf("ub://%s/lb-%d", n, i)
		bl, err := eps[n].Listen(context.Background(), bus)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(tl)
		go srv.Serve(bl)
		defer srv.Stop()
		stops[n] = append(stops[n], srv.GracefulStop)
		addrs = append(addrs, WithNode(resolver.Address{Addr: tl.Addr().String()}, n))
		services = append(services, Service{Name: "lb", Instances: []Instance{{Node: n, Address: tl.Addr().String(), Bus: bus}}})
	}
	all := Service{Name: "lb"}
	for _, s := range services {
		all.Instances = append(all.Instances, s.Instances...)
	}
	reg, err := NewStaticRegistry([]Service{all})
	if err != nil {
		t.Fatal(err)
	}
	r := manual.NewBuilderWithScheme("ubkit-test")
	r.InitialState(resolver.State{Addresses: addrs})
	cc, err := grpc.NewClient("ubkit-test:///lb", grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(Dialer(eps["n1"], reg)),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"ubkit_topology": {"node": "n1", "topology": "dev4"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	run := func(calls, concurrency int) (map[string]int, int) {
		var wg sync.WaitGroup
		var cmu sync.Mutex
		got, failed := map[string]int{}, 0
		work := make(chan struct{}, calls)
		for range calls {
			work <- struct{}{}
		}
		close(work)
		for range concurrency {
			wg.Go(func() {
				for range work {
					var md metadata.MD
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md), grpc.WaitForReady(true))
					cancel()
					cmu.Lock()
					if err != nil {
						t.Logf("call: %v (%v)", err, status.Code(err) == codes.Unavailable)
						failed++
					} else {
						got[md.Get("node")[0]]++
					}
					cmu.Unlock()
				}
			})
		}
		wg.Wait()
		return got, failed
	}
	run(20, 4) // connect everything
	light, failed := run(200, 1)
	if failed > 0 || light["n1"] < 180 {
		t.Fatalf("light load: %v, %d failed; want at least 90%% on n1", light, failed)
	}
	mu.Lock()
	delay = 5 * time.Millisecond
	mu.Unlock()
	heavy, failed := run(400, 32)
	if failed > 0 || heavy["n2"] < 40 {
		t.Fatalf("overload: %v, %d failed; want calls spilling to n2", heavy, failed)
	}
	mu.Lock()
	delay = 0
	mu.Unlock()
	for _, stop := range stops["n1"] {
		stop()
	}
	gone, failed := run(200, 4)
	if failed > 0 || gone["n2"] != 200 {
		t.Fatalf("n1's endpoints gone: %v, %d failed; want all on n2", gone, failed)
	}
	t.Logf("light %v, overload %v, local endpoints gone %v", light, heavy, gone)
}
