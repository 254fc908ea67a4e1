package mesh

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and balancers

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// hangGuard bounds the waits of tests for what takes milliseconds when
// the code works: only a hang waits that long, and it fails the test.
const hangGuard = 30 * time.Second

func TestMain(m *testing.M) {
	testenv.RegisterChild("client", child)
	testenv.Main(m)
}

// TestSnapshotView: each node gets its own view: its own node's endpoints
// in priority 0, farther ones after; versions change only with content.
func TestSnapshotView(t *testing.T) {
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := NewStaticRegistry([]Service{{Name: "svc", Instances: []Instance{
		{Node: "n0", Address: "10.0.0.1:80"}, {Node: "n1", Address: "10.0.0.2:80"}, {Node: "n1", Address: "10.0.0.3:80"},
		{Node: "elsewhere", Address: "10.9.9.9:80"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	cp := NewControlPlane(topo, reg)
	services, _ := reg.Services(context.Background())
	view := func(node string) (string, []*endpoint.LocalityLbEndpoints) {
		snap, err := cp.Snapshot(node, services)
		if err != nil {
			t.Fatal(err)
		}
		cla := snap.GetResources(resource.EndpointType)["svc"].(*endpoint.ClusterLoadAssignment)
		return snap.GetVersion(resource.EndpointType), cla.Endpoints
	}
	v1, eps := view("n1")
	if len(eps) != 3 || eps[0].Locality.Zone != "n1" || eps[0].Priority != 0 || eps[0].LoadBalancingWeight.GetValue() != 2 ||
		eps[1].Locality.Zone != "n0" || eps[1].Priority != 1 || eps[2].Locality.Zone != "elsewhere" || eps[2].Priority != 2 {
		t.Fatalf("n1's view: %v", eps)
	}
	if eps[0].Locality.Region != "dev4" {
		t.Errorf("region %q, want the super node", eps[0].Locality.Region)
	}
	if _, eps := view("n0"); eps[0].Locality.Zone != "n0" {
		t.Fatalf("n0's view starts with %s", eps[0].Locality.Zone)
	}
	if v, _ := view("n1"); v != v1 {
		t.Error("the same content got another version")
	}
	reg.Set(append(services, Service{Name: "other", Instances: []Instance{{Node: "n2", Address: "10.0.0.4:81"}}}))
	services2, _ := reg.Services(context.Background())
	snap, _ := cp.Snapshot("n1", services2)
	if snap.GetVersion(resource.EndpointType) == v1 {
		t.Error("new content kept the version")
	}
	if _, err := NewStaticRegistry([]Service{{Name: "bad", Instances: []Instance{{Node: "n0", Address: "nope"}}}}); err == nil {
		t.Error("accepted an address that is not host:port")
	}
}

// backend serves health checks and says which node answered, on TCP and
// on the bus.
func backend(t *testing.T, ep *transport.Endpoint, svc string) (tcp string, stop func()) {
	t.Helper()
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		grpc.SetHeader(ctx, metadata.Pairs("node", ep.Node()))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl, err := ep.Listen(context.Background(), "ub:///"+svc)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(tl)
	go srv.Serve(bl)
	return tl.Addr().String(), srv.GracefulStop
}

// TestProxylessGRPC: grpc-go's own xDS client, in a process playing node
// n1, resolves xds:///greeter through the control plane, calls the
// backend on its own node over shared memory, and fails over to the one on
// n2 (the ub path across the simulated super node) when it goes away.
func TestProxylessGRPC(t *testing.T) {
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	endpoint := func(node string) *transport.Endpoint {
		ep, err := transport.NewEndpoint(transport.Config{Node: node, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		return ep
	}
	n1, n2 := endpoint("n1"), endpoint("n2")
	a1, stop1 := backend(t, n1, "greeter-backend")
	a2, stop2 := backend(t, n2, "greeter-backend")
	defer stop2()
	regFile := filepath.Join(dir, "registry.yaml")
	os.WriteFile(regFile, []byte(fmt.Sprintf(`services:
  - name: greeter
    endpoints:
      - {node: n1, address: "%s", bus: "ub://n1/greeter-backend"}
      - {node: n2, address: "%s", bus: "ub://n2/greeter-backend"}
`, a1, a2)), 0o600)
	reg, err := LoadRegistry(regFile)
	if err != nil {
		t.Fatal(err)
	}
	cp := NewControlPlane(topo, reg)
	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go cp.Serve(cl)
	defer cp.Close()
	boot, err := Bootstrap("dev4", "n1", cl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Child(t, "client", "GRPC_XDS_BOOTSTRAP_CONFIG="+string(boot),
		"UB_TOPOLOGY=example:dev4", "UB_NODE=n1", "UB_PROVIDER=sim", "UBKIT_RUNTIME_DIR="+dir, "MESH_REGISTRY="+regFile)
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := bufio.NewReader(out)
	phase := func() map[string]int {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("child: %v", err)
		}
		var got map[string]int
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("child said %q", line)
		}
		return got
	}
	first := phase()
	if first["n1 shm"] != 20 {
		t.Fatalf("calls with both backends up: %v, want all 20 on n1 over shared memory", first)
	}
	stop1()
	io.WriteString(in, "go\n")
	second := phase()
	if second["n2 ub"] == 0 || second["errors"] > 0 {
		t.Fatalf("calls with n1's backend gone: %v, want them on n2 over the ub path, none failing", second)
	}
	t.Logf("both up: %v; n1's backend gone: %v", first, second)
	in.Close()
	cmd.Wait()
}

// child is the proxyless client: 20 calls, report, wait, 20 more, report.
func child() int {
	reg, err := LoadRegistry(os.Getenv("MESH_REGISTRY"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ep, err := transport.Default()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cc, err := grpc.NewClient("xds:///greeter", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(Dialer(ep, reg)))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	calls := func() {
		got := map[string]int{}
		for range 20 {
			var md metadata.MD
			var p peer.Peer
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md), grpc.Peer(&p), grpc.WaitForReady(true))
			cancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, "call:", err)
				got["errors"]++
				continue
			}
			path := "tcp"
			if a, ok := p.Addr.(transport.Addr); ok {
				path = string(a.Path)
			}
			node := strings.Join(md.Get("node"), ",")
			got[node+" "+path]++
		}
		b, _ := json.Marshal(got)
		fmt.Println(string(b))
	}
	calls()
	bufio.NewReader(os.Stdin).ReadString('\n')
	calls()
	return 0
}
