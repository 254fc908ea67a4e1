package mesh

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// brokenRegistry cannot say what its services are.
type brokenRegistry struct{ changed chan struct{} }

func (r brokenRegistry) Services(context.Context) ([]Service, error) {
	return nil, errors.New("the registry is down")
}
func (r brokenRegistry) Changed() <-chan struct{} { return r.changed }

// TestControlPlaneLogs: what the control plane learns and no call returns
// goes to its Logger: a configuration a client refused (Warn), a view it
// could not build (Warn), streams opening (Debug).
func TestControlPlaneLogs(t *testing.T) {
	topo, _ := topology.Example("dev4")
	log, rec := testenv.NewLogRecorder()
	serve := func(reg Registry) clusterservice.ClusterDiscoveryService_StreamClustersClient {
		cp := NewControlPlane(topo, reg)
		cp.Logger = log
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go cp.Serve(l)
		t.Cleanup(cp.Close)
		conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang guard
		t.Cleanup(cancel)
		s, err := clusterservice.NewClusterDiscoveryServiceClient(conn).StreamClusters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	node := &core.Node{Id: "test~n1", Locality: &core.Locality{Zone: "n1"}}

	reg, err := NewStaticRegistry([]Service{{Name: "a", Instances: []Instance{{Node: "n0", Address: "10.0.0.1:80"}}}})
	if err != nil {
		t.Fatal(err)
	}
	s := serve(reg)
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, "level=DEBUG", "mesh: an xDS stream opened")
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce,
		ErrorDetail: &status.Status{Code: 3, Message: "no thanks"}}); err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, "level=WARN", "mesh: a client refused a configuration", "node=n1", "no thanks")

	s = serve(brokenRegistry{changed: make(chan struct{})})
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, "level=WARN", "mesh: could not update a node's view", "node=n1", "the registry is down")
}
