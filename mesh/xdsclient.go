package mesh

import (
	"context"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// XDSRegistry is a Registry fed by a control plane over ADS, as a node
// proxy sees it: clusters (CDS) and their endpoints (EDS), each
// endpoint's node taken from its locality's zone. It reconnects when the
// stream breaks and keeps the last state meanwhile.
type XDSRegistry struct {
	superNode, node, server string

	mu        sync.Mutex
	services  []Service
	listeners map[string]string // service -> loopback address, from LDS
	ready     chan struct{}
	once      sync.Once
	changed   chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
}

// NewXDSRegistry starts following the control plane at server for node of
// superNode.
func NewXDSRegistry(superNode, node, server string) *XDSRegistry {
	ctx, cancel := context.WithCancel(context.Background())
	r := &XDSRegistry{superNode: superNode, node: node, server: server, ready: make(chan struct{}),
		changed: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go r.run(ctx)
	return r
}

// Close stops following.
func (r *XDSRegistry) Close() {
	r.cancel()
	<-r.done
}

// Ready is closed once the first endpoints arrived.
func (r *XDSRegistry) Ready() <-chan struct{} { return r.ready }

func (r *XDSRegistry) Services(context.Context) ([]Service, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.services), nil
}

func (r *XDSRegistry) Changed() <-chan struct{} { return r.changed }

func (r *XDSRegistry) run(ctx context.Context) {
	defer close(r.done)
	for ctx.Err() == nil {
		r.stream(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (r *XDSRegistry) stream(ctx context.Context) {
	conn, err := grpc.NewClient(r.server, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return
	}
	defer conn.Close()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return
	}
	node := &core.Node{Id: "ubkit-proxy~" + r.superNode + "~" + r.node, Cluster: r.superNode,
		Locality: &core.Locality{Region: r.superNode, Zone: r.node}}
	if s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}) != nil {
		return
	}
	if s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}) != nil {
		return
	}
	var names []string
	assignments := map[string]*endpoint.ClusterLoadAssignment{}
	edsVersion, edsNonce := "", ""
	for {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		switch resp.TypeUrl {
		case resource.ListenerType:
			ls := map[string]string{}
			for _, a := range resp.Resources {
				var l listener.Listener
				if a.UnmarshalTo(&l) != nil {
					continue
				}
				svc, ok := strings.CutPrefix(l.Name, ProxyListenerPrefix)
				sa := l.GetAddress().GetSocketAddress()
				if !ok || sa == nil {
					continue
				}
				ls[svc] = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
			}
			if s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) != nil {
				return
			}
			r.mu.Lock()
			r.listeners = ls
			r.mu.Unlock()
			r.signal()
		case resource.ClusterType:
			var got []string
			for _, a := range resp.Resources {
				var c cluster.Cluster
				if a.UnmarshalTo(&c) == nil {
					got = append(got, c.Name)
				}
			}
			slices.Sort(got)
			if len(got) == 0 {
				r.publish(assignments, nil) // nothing to ask endpoints for: the state is known
			}
			if s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) != nil {
				return
			}
			if !slices.Equal(got, names) {
				names = got
				for n := range assignments {
					if !slices.Contains(names, n) {
						delete(assignments, n)
					}
				}
				if s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names,
					VersionInfo: edsVersion, ResponseNonce: edsNonce}) != nil {
					return
				}
				// A removed cluster may get no endpoints response: publish
				// what is left now.
				r.publish(assignments, names)
			}
		case resource.EndpointType:
			for _, a := range resp.Resources {
				var cla endpoint.ClusterLoadAssignment
				if a.UnmarshalTo(&cla) == nil {
					assignments[cla.ClusterName] = &cla
				}
			}
			edsVersion, edsNonce = resp.VersionInfo, resp.Nonce
			if s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names,
				VersionInfo: edsVersion, ResponseNonce: edsNonce}) != nil {
				return
			}
			r.publish(assignments, names)
		}
	}
}

// publish makes assignments the registry's services. Ready closes only once
// every cluster in names has its endpoints: a proxy that took the
// clusters alone for the state answered its first requests with "no
// endpoint".
func (r *XDSRegistry) publish(assignments map[string]*endpoint.ClusterLoadAssignment, names []string) {
	var services []Service
	for name, cla := range assignments {
		s := Service{Name: name}
		for _, loc := range cla.Endpoints {
			for _, e := range loc.LbEndpoints {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				if sa == nil {
					continue
				}
				s.Endpoints = append(s.Endpoints, Endpoint{Node: loc.GetLocality().GetZone(),
					Address: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))})
			}
		}
		services = append(services, s)
	}
	r.mu.Lock()
	r.services = services
	r.mu.Unlock()
	complete := true
	for _, n := range names {
		if assignments[n] == nil {
			complete = false
		}
	}
	if complete {
		r.once.Do(func() { close(r.ready) })
	}
	r.signal()
}

func (r *XDSRegistry) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// ProxyListeners returns, per service, the loopback address the control
// plane tells node proxies to listen on for it.
func (r *XDSRegistry) ProxyListeners() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.listeners)
}
