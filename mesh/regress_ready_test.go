package mesh

import (
	"net"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
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
	xr := NewXDSRegistry("dev4", "n0", l.Addr().String())
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
	if err != nil || len(s) != 1 || s[0].Name != "echo" || len(s[0].Endpoints) != 1 {
		t.Fatalf("services after Ready: %v, %v", s, err)
	}
}
