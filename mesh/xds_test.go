package mesh

import (
	"context"
	"net"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// TestXDSServices speaks raw xDS to the separate CDS and EDS services: a
// registry change reaches a connected client as a new version, and a
// client that reconnects gets the current state.
func TestXDSServices(t *testing.T) {
	topo, _ := topology.Example("dev4")
	reg, err := NewStaticRegistry([]Service{{Name: "a", Instances: []Instance{
		{Node: "n0", Address: "10.0.0.1:80"}, {Node: "n1", Address: "10.0.0.2:80"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cp := NewControlPlane(topo, reg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go cp.Serve(l)
	defer cp.Close()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	node := &core.Node{Id: "test~n1", Locality: &core.Locality{Zone: "n1"}}

	clusters := func(s clusterservice.ClusterDiscoveryService_StreamClustersClient, ack *discovery.DiscoveryResponse) *discovery.DiscoveryResponse {
		t.Helper()
		req := &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}
		if ack != nil {
			req.VersionInfo, req.ResponseNonce = ack.VersionInfo, ack.Nonce
		}
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	cds := clusterservice.NewClusterDiscoveryServiceClient(conn)
	s1, err := cds.StreamClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r1 := clusters(s1, nil)
	if len(r1.Resources) != 1 {
		t.Fatalf("first answer: %d clusters", len(r1.Resources))
	}
	reg.Set([]Service{
		{Name: "a", Instances: []Instance{{Node: "n0", Address: "10.0.0.1:80"}, {Node: "n1", Address: "10.0.0.2:80"}}},
		{Name: "b", Instances: []Instance{{Node: "n2", Address: "10.0.0.3:80"}}},
	})
	r2 := clusters(s1, r1) // the ACK, then the push
	if len(r2.Resources) != 2 || r2.VersionInfo == r1.VersionInfo {
		t.Fatalf("after the change: %d clusters, version %s (was %s)", len(r2.Resources), r2.VersionInfo, r1.VersionInfo)
	}
	s1.CloseSend()
	// A reconnecting client gets the current state at once.
	s2, err := cds.StreamClusters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r3 := clusters(s2, nil)
	if len(r3.Resources) != 2 || r3.VersionInfo != r2.VersionInfo {
		t.Fatalf("reconnected: %d clusters, version %s, want %s", len(r3.Resources), r3.VersionInfo, r2.VersionInfo)
	}
	// EDS, separately: n1 sees its own endpoint first.
	eds, err := endpointservice.NewEndpointDiscoveryServiceClient(conn).StreamEndpoints(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := eds.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: []string{"a"}}); err != nil {
		t.Fatal(err)
	}
	er, err := eds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var cla endpoint.ClusterLoadAssignment
	if len(er.Resources) != 1 || er.Resources[0].UnmarshalTo(&cla) != nil {
		t.Fatalf("EDS answer: %v", er)
	}
	if cla.Endpoints[0].Locality.Zone != "n1" || cla.Endpoints[0].Priority != 0 || cla.Endpoints[1].Priority != 1 {
		t.Fatalf("n1's assignment: %v", cla.Endpoints)
	}
}
