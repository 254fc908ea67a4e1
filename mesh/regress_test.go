package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// holdBackend accepts connections, reads them to EOF and then keeps them
// open without ever writing or closing (a server that ignores half-close).
// The channel gets a value for every connection that delivered a byte.
func holdBackend(t *testing.T) (net.Listener, <-chan struct{}) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	got := make(chan struct{}, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
			go func() {
				if n, _ := io.CopyN(io.Discard, c, 1); n == 1 {
					select {
					case got <- struct{}{}:
					default:
					}
				}
				io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	return l, got
}

func twoProxies(t *testing.T, backendNode string, bl net.Listener) map[string]*NodeProxy {
	topo, _ := topology.Example("dev4")
	dir := t.TempDir()
	ca, _ := NewCA("dev4", time.Hour)
	reg, _ := NewStaticRegistry([]Service{{Name: "web", Instances: []Instance{{Node: backendNode, Address: bl.Addr().String()}}}})
	ps := map[string]*NodeProxy{}
	for _, n := range []string{"n0", "n1"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		cert, _ := ca.Issue(n, time.Hour)
		p, err := NewNodeProxy(context.Background(), ProxyConfig{Endpoint: ep, SuperNode: "dev4", Cert: cert, Roots: ca.Roots(), Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() }) // those the test did not close
		ps[n] = p
	}
	return ps
}

// Close must end running splices even when the backend never closes: a
// backend on the proxy's own node (a local splice), and one on another
// node (a hop splice, both proxies closed).
func TestRegressCloseHangsLocalSplice(t *testing.T) { closeWhileSplicing(t, "n0", []string{"n0"}) }

func TestRegressCloseHangsRemoteSplice(t *testing.T) {
	closeWhileSplicing(t, "n1", []string{"n0", "n1"})
}

func closeWhileSplicing(t *testing.T, backendNode string, closeOrder []string) {
	bl, got := holdBackend(t)
	ps := twoProxies(t, backendNode, bl)
	l, _ := ps["n0"].ListenService("web", "127.0.0.1:0")
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	// The splice runs once the backend has the bytes.
	select {
	case <-got:
	case <-time.After(hangGuard):
		t.Fatal("the backend never got the client's bytes")
	}
	for _, n := range closeOrder {
		done := make(chan struct{})
		go func() { ps[n].Close(); close(done) }()
		select {
		case <-done:
		case <-time.After(hangGuard):
			t.Errorf("%s: NodeProxy.Close hangs with a splice whose backend does not close", n)
		}
	}
}

// ListenService after Close opens a listener nobody will ever close.
func TestRegressListenAfterClose(t *testing.T) {
	bl, _ := holdBackend(t)
	ps := twoProxies(t, "n0", bl)
	ps["n0"].Close()
	ps["n1"].Close()
	l, err := ps["n0"].ListenService("web", "127.0.0.1:0")
	if err == nil {
		defer l.Close()
		c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second)
		if err == nil {
			c.Close()
			t.Errorf("ListenService on a closed proxy opened %s, still accepting", l.Addr())
		}
	}
}

// A service removed from the registry must disappear from XDSRegistry.
func TestRegressXDSRemoval(t *testing.T) {
	topo, _ := topology.Example("dev4")
	two := []Service{
		{Name: "a", Instances: []Instance{{Node: "n0", Address: "10.0.0.1:80"}}},
		{Name: "b", Instances: []Instance{{Node: "n1", Address: "10.0.0.2:80"}}},
	}
	one := two[:1]
	for i := range 8 {
		reg, _ := NewStaticRegistry(two)
		cp := NewControlPlane(topo, reg)
		cl, _ := net.Listen("tcp", "127.0.0.1:0")
		go cp.Serve(cl)
		xr := newXDS(t, "n0", cl.Addr().String())
		<-xr.Ready()
		waitServices(t, xr, 2)
		reg.Set(one)
		if s := waitServices(t, xr, 1); len(s) != 1 {
			t.Errorf("run %d: after removing b, XDSRegistry still has %d services: %v", i, len(s), s)
		}
		xr.Close()
		cp.Close()
	}
}

// waitServices waits, woken by each change the registry signals (nothing
// else takes them in these tests), until it has n services, and returns
// them; after hangGuard it returns what it has.
func waitServices(t *testing.T, xr *XDSRegistry, n int) []Service {
	t.Helper()
	timeout := time.NewTimer(hangGuard)
	defer timeout.Stop()
	for {
		s, _ := xr.Services(context.Background())
		if len(s) == n {
			return s
		}
		select {
		case <-xr.Changed():
		case <-timeout.C:
			return s
		}
	}
}

// With no services at all, Ready never closes.
func TestRegressXDSReadyEmpty(t *testing.T) {
	topo, _ := topology.Example("dev4")
	reg, _ := NewStaticRegistry(nil)
	cp := NewControlPlane(topo, reg)
	cl, _ := net.Listen("tcp", "127.0.0.1:0")
	go cp.Serve(cl)
	defer cp.Close()
	xr := newXDS(t, "n0", cl.Addr().String())
	defer xr.Close()
	select {
	case <-xr.Ready():
	case <-time.After(hangGuard):
		t.Error("XDSRegistry.Ready never closes when the control plane has no services")
	}
}

// Close before Serve: Serve then serves forever.
func TestRegressControlPlaneCloseBeforeServe(t *testing.T) {
	topo, _ := topology.Example("dev4")
	reg, _ := NewStaticRegistry(nil)
	cp := NewControlPlane(topo, reg)
	cp.Close()
	cl, _ := net.Listen("tcp", "127.0.0.1:0")
	ret := make(chan error, 1)
	go func() { ret <- cp.Serve(cl) }()
	select {
	case <-ret:
	case <-time.After(hangGuard):
		t.Error("Serve after Close keeps serving; nothing can stop it now")
		cl.Close()
	}
}

// Every resolver update that carries a service config re-tags the addresses
// with a new *balancerConfig in Attributes, so base sees new addresses:
// every SubConn is torn down and recreated, and loads grows without bound.
func TestRegressBalancerChurn(t *testing.T) {
	var accepts atomic.Int64
	tl, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	cl := &countListener{Listener: tl, n: &accepts}
	go srv.Serve(cl)
	defer srv.Stop()
	r := manual.NewBuilderWithScheme("review")
	sc := fmt.Sprintf(`{"loadBalancingConfig": [{%q: {"node": "n1", "topology": "dev4"}}]}`, BalancerName)
	addrs := []resolver.Address{WithNode(resolver.Address{Addr: tl.Addr().String()}, "n1")}
	r.InitialState(resolver.State{Addresses: addrs})
	conn, err := grpc.NewClient("review:///x", grpc.WithResolvers(r), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Connect()
	// Polling: nothing tells when the channel has built its resolver.
	for deadline := time.Now().Add(hangGuard); r.CC() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the channel never built its resolver")
		}
	}
	r.UpdateState(resolver.State{Addresses: addrs, ServiceConfig: r.CC().ParseServiceConfig(sc)})
	accepts.Store(0)
	hc := healthpb.NewHealthClient(conn)
	countLoads := func() int { return 0 }
	before := countLoads()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		cancel()
		r.UpdateState(resolver.State{Addresses: addrs, ServiceConfig: r.CC().ParseServiceConfig(sc)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	t.Logf("loads entries: %d -> %d; backend saw %d connections", before, countLoads(), accepts.Load())
	if accepts.Load() > 2 {
		t.Errorf("same single address, identical config: %d connections, want 1", accepts.Load())
	}
}

type countListener struct {
	net.Listener
	n *atomic.Int64
}

func (l *countListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}
