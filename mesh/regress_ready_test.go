package mesh

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"
)

// scriptedADS answers the cluster request with one cluster, closes
// askedEDS when the client asks for its endpoints, then sends them only
// when release is closed. A unit-test fake: the real control plane is
// tested elsewhere.
type scriptedADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	askedEDS, release chan struct{}
}

func (s *scriptedADS) StreamAggregatedResources(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	c, _ := anypb.New(&cluster.Cluster{Name: "echo"})
	cla, _ := anypb.New(&endpoint.ClusterLoadAssignment{ClusterName: "echo", Endpoints: []*endpoint.LocalityLbEndpoints{{
		Locality: &core.Locality{Zone: "n1"},
		LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
			Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
				Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: 9}}}}}}}},
	}}})
	sentEDS := false
	for {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		switch {
		case req.TypeUrl == resource.ClusterType && req.ResponseNonce == "":
			if err := st.Send(&discovery.DiscoveryResponse{TypeUrl: resource.ClusterType, VersionInfo: "1", Nonce: "c1", Resources: []*anypb.Any{c}}); err != nil {
				return err
			}
		case req.TypeUrl == resource.EndpointType && !sentEDS:
			sentEDS = true
			close(s.askedEDS)
			go func() {
				<-s.release
				st.Send(&discovery.DiscoveryResponse{TypeUrl: resource.EndpointType, VersionInfo: "1", Nonce: "e1", Resources: []*anypb.Any{cla}})
			}()
		}
	}
}

// Ready must wait for the endpoints of the clusters, not just the cluster
// list: a proxy taking the clusters alone for the state answered its first
// requests with "no endpoint of echo" (seen as EOFs in ubctl bench mesh).
func TestRegressXDSReadyBeforeEndpoints(t *testing.T) {
	ads := &scriptedADS{askedEDS: make(chan struct{}), release: make(chan struct{})}
	srv := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, ads)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Stop()
	xr := newXDS(t, "n0", l.Addr().String())
	defer xr.Close()
	// The registry asks for the endpoints, then publishes what it knows:
	// the first change it signals (nothing else has come).
	for _, step := range []struct {
		what string
		ch   <-chan struct{}
	}{{"the client asking for endpoints", ads.askedEDS}, {"the registry publishing the cluster", xr.Changed()}} {
		select {
		case <-step.ch:
		case <-time.After(hangGuard):
			t.Fatalf("no sign of %s", step.what)
		}
	}
	select {
	case <-xr.Ready():
		s, _ := xr.Services(t.Context())
		t.Fatalf("Ready closed with the cluster known and its endpoints not yet sent (services %v)", s)
	default:
	}
	close(ads.release)
	select {
	case <-xr.Ready():
	case <-time.After(hangGuard):
		t.Fatal("Ready never closed after the endpoints came")
	}
	s, err := xr.Services(t.Context())
	if err != nil || len(s) != 1 || s[0].Name != "echo" || len(s[0].Instances) != 1 {
		t.Fatalf("services after Ready: %v, %v", s, err)
	}
}

// newXDS follows the control plane at server as node of dev4, over an
// insecure loopback stream.
func newXDS(t testing.TB, node, server string) *XDSRegistry {
	t.Helper()
	xr, err := NewXDSRegistry(context.Background(), XDSConfig{SuperNode: "dev4", Node: node, Server: server, Credentials: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	return xr
}

// nackADS sends a cluster that does not decode after a good one, then
// records the client's answer to each.
type nackADS struct {
	discovery.UnimplementedAggregatedDiscoveryServiceServer
	answers chan *discovery.DiscoveryRequest
}

func (s *nackADS) StreamAggregatedResources(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	good, _ := anypb.New(&cluster.Cluster{Name: "echo"})
	bad := &anypb.Any{TypeUrl: resource.ClusterType, Value: []byte{0xff, 0xff, 0xff}}
	for {
		req, err := st.Recv()
		if err != nil {
			return err
		}
		if req.TypeUrl != resource.ClusterType {
			continue
		}
		switch req.ResponseNonce {
		case "":
			err = st.Send(&discovery.DiscoveryResponse{TypeUrl: resource.ClusterType, VersionInfo: "1", Nonce: "c1", Resources: []*anypb.Any{good}})
		case "c1":
			s.answers <- req
			err = st.Send(&discovery.DiscoveryResponse{TypeUrl: resource.ClusterType, VersionInfo: "2", Nonce: "c2", Resources: []*anypb.Any{good, bad}})
		case "c2":
			s.answers <- req
		}
		if err != nil {
			return err
		}
	}
}

// TestXDSRegistryNACKs: a configuration the registry cannot use is refused
// as xDS says (a NACK: the version last accepted, the response's nonce,
// and an error detail saying why), counted in NACKs, logged at Warn to the
// configured logger, and the state last accepted stays. Before, the
// resource was skipped and the rest acknowledged as if all were well.
func TestXDSRegistryNACKs(t *testing.T) {
	ads := &nackADS{answers: make(chan *discovery.DiscoveryRequest, 2)}
	srv := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, ads)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Stop()
	var logged bytes.Buffer
	var mu sync.Mutex
	xr, err := NewXDSRegistry(t.Context(), XDSConfig{SuperNode: "dev4", Node: "n0", Server: l.Addr().String(),
		Credentials: insecure.NewCredentials(), Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &mu}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer xr.Close()
	wait := func() *discovery.DiscoveryRequest {
		select {
		case r := <-ads.answers:
			return r
		case <-time.After(10 * time.Second): // a hang guard
			t.Fatal("the registry did not answer the control plane")
			return nil
		}
	}
	if ack := wait(); ack.ErrorDetail != nil || ack.VersionInfo != "1" {
		t.Fatalf("the good configuration was answered %v", ack)
	}
	nack := wait()
	if nack.ErrorDetail == nil || nack.VersionInfo != "1" || nack.ResponseNonce != "c2" || !strings.Contains(nack.ErrorDetail.Message, "does not decode") {
		t.Fatalf("the bad configuration was answered %v, want a NACK of version 2 keeping version 1, saying why", nack)
	}
	if n, last := xr.NACKs(); n != 1 || last != nack.ErrorDetail.Message {
		t.Errorf("NACKs() = %d, %q", n, last)
	}
	mu.Lock()
	out := logged.String()
	mu.Unlock()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "refused a configuration") {
		t.Errorf("logged %q, want the refusal at Warn", out)
	}
	t.Logf("NACK: %s", nack.ErrorDetail.Message)
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestXDSConfigChecked: a registry without what it needs says so.
func TestXDSConfigChecked(t *testing.T) {
	for _, cfg := range []XDSConfig{
		{Node: "n0", Server: "127.0.0.1:1", Credentials: insecure.NewCredentials()},
		{SuperNode: "dev4", Node: "n0", Credentials: insecure.NewCredentials()},
		{SuperNode: "dev4", Node: "n0", Server: "127.0.0.1:1"},
	} {
		if _, err := NewXDSRegistry(t.Context(), cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
}
