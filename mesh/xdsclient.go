package mesh

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
)

// XDSRegistry is a Registry fed by a control plane over ADS, as a node
// proxy sees it: clusters (CDS) and their endpoints (EDS), each
// endpoint's node taken from its locality's zone. It reconnects when the
// stream breaks and keeps the last state meanwhile. A response it cannot
// use (a resource that does not decode, a proxy listener without a socket
// address, endpoints without their cluster's name) is refused as xDS says,
// with a NACK naming the problem, and the last accepted state stays.
type XDSRegistry struct {
	superNode, node string
	conn            *grpc.ClientConn
	log             *slog.Logger

	mu        sync.Mutex
	services  []Service
	listeners map[string]string // service -> loopback address, from LDS
	nacks     int
	lastNACK  string
	ready     chan struct{}
	once      sync.Once
	changed   chan struct{}
	cancel    context.CancelFunc
	done      chan struct{}
}

// XDSConfig says whose view an XDSRegistry follows, and where.
type XDSConfig struct {
	// SuperNode and Node name the node proxy whose view this is.
	SuperNode, Node string
	// Server is the control plane's address (a gRPC target).
	Server string
	// Credentials secure the stream to the control plane. Required: pass
	// insecure.NewCredentials() only for a control plane on loopback.
	Credentials credentials.TransportCredentials
	// Logger gets what the registry has to say (refused configurations at
	// Warn, reconnections at Debug). Default: nothing is logged.
	Logger *slog.Logger
}

// NewXDSRegistry starts following the control plane cfg names, until ctx
// ends or Close.
func NewXDSRegistry(ctx context.Context, cfg XDSConfig) (*XDSRegistry, error) {
	switch {
	case cfg.SuperNode == "" || cfg.Node == "":
		return nil, errors.New("mesh: XDSConfig needs SuperNode and Node")
	case cfg.Server == "":
		return nil, errors.New("mesh: XDSConfig needs Server, the control plane's address")
	case cfg.Credentials == nil:
		return nil, errors.New("mesh: XDSConfig needs Credentials (insecure.NewCredentials() for a control plane on loopback)")
	}
	conn, err := grpc.NewClient(cfg.Server, grpc.WithTransportCredentials(cfg.Credentials))
	if err != nil {
		return nil, fmt.Errorf("mesh: control plane %s: %w", cfg.Server, err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &XDSRegistry{superNode: cfg.SuperNode, node: cfg.Node, conn: conn, log: log, ready: make(chan struct{}),
		changed: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go r.run(ctx)
	return r, nil
}

// NACKs reports how many responses the registry refused, and why it
// refused the last.
func (r *XDSRegistry) NACKs() (n int, last string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nacks, r.lastNACK
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
	defer r.conn.Close()
	for ctx.Err() == nil {
		if err := r.stream(ctx); ctx.Err() == nil {
			r.log.Debug("mesh: the control plane's stream ended; reconnecting", "node", r.node, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stream follows one ADS stream until it ends, and says why.
func (r *XDSRegistry) stream(ctx context.Context) error {
	s, err := discovery.NewAggregatedDiscoveryServiceClient(r.conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	node := &core.Node{Id: "ubkit-proxy~" + r.superNode + "~" + r.node, Cluster: r.superNode,
		Locality: &core.Locality{Region: r.superNode, Zone: r.node}}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		return err
	}
	var names []string
	assignments := map[string]*endpoint.ClusterLoadAssignment{}
	accepted := map[string]string{} // the version last accepted, per type
	edsNonce := ""
	// ack accepts resp; nack refuses it, keeping the version last accepted.
	ack := func(resp *discovery.DiscoveryResponse, names []string) error {
		accepted[resp.TypeUrl] = resp.VersionInfo
		return s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resp.TypeUrl, ResourceNames: names,
			VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce})
	}
	nack := func(resp *discovery.DiscoveryResponse, names []string, why error) error {
		r.mu.Lock()
		r.nacks++
		r.lastNACK = why.Error()
		r.mu.Unlock()
		r.log.Warn("mesh: refused a configuration from the control plane", "node", r.node, "type", resp.TypeUrl,
			"version", resp.VersionInfo, "err", why)
		return s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resp.TypeUrl, ResourceNames: names,
			VersionInfo: accepted[resp.TypeUrl], ResponseNonce: resp.Nonce,
			ErrorDetail: &status.Status{Code: int32(codes.InvalidArgument), Message: why.Error()}})
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		switch resp.TypeUrl {
		case resource.ListenerType:
			ls, err := proxyListeners(resp)
			if err != nil {
				if err := nack(resp, nil, err); err != nil {
					return err
				}
				continue
			}
			if err := ack(resp, nil); err != nil {
				return err
			}
			r.mu.Lock()
			r.listeners = ls
			r.mu.Unlock()
			r.signal()
		case resource.ClusterType:
			got, err := clusterNames(resp)
			if err != nil {
				if err := nack(resp, nil, err); err != nil {
					return err
				}
				continue
			}
			if len(got) == 0 {
				r.publish(assignments, nil) // nothing to ask endpoints for: the state is known
			}
			if err := ack(resp, nil); err != nil {
				return err
			}
			if !slices.Equal(got, names) {
				names = got
				for n := range assignments {
					if !slices.Contains(names, n) {
						delete(assignments, n)
					}
				}
				if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.EndpointType, ResourceNames: names,
					VersionInfo: accepted[resource.EndpointType], ResponseNonce: edsNonce}); err != nil {
					return err
				}
				// A removed cluster may get no endpoints response: publish
				// what is left now.
				r.publish(assignments, names)
			}
		case resource.EndpointType:
			edsNonce = resp.Nonce
			got, err := loadAssignments(resp)
			if err != nil {
				if err := nack(resp, names, err); err != nil {
					return err
				}
				continue
			}
			maps.Copy(assignments, got)
			if err := ack(resp, names); err != nil {
				return err
			}
			r.publish(assignments, names)
		}
	}
}

// proxyListeners reads the proxy listeners of an LDS response: service
// name to loopback address. Listeners not named for a proxy are not ours.
func proxyListeners(resp *discovery.DiscoveryResponse) (map[string]string, error) {
	ls := map[string]string{}
	for i, a := range resp.Resources {
		var l listener.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			return nil, fmt.Errorf("listener %d does not decode: %w", i, err)
		}
		svc, ok := strings.CutPrefix(l.Name, ProxyListenerPrefix)
		if !ok {
			continue
		}
		sa := l.GetAddress().GetSocketAddress()
		if sa == nil || sa.GetAddress() == "" {
			return nil, fmt.Errorf("listener %s has no socket address", l.Name)
		}
		ls[svc] = net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))
	}
	return ls, nil
}

// clusterNames reads the cluster names of a CDS response, sorted.
func clusterNames(resp *discovery.DiscoveryResponse) ([]string, error) {
	var got []string
	for i, a := range resp.Resources {
		var c cluster.Cluster
		if err := a.UnmarshalTo(&c); err != nil {
			return nil, fmt.Errorf("cluster %d does not decode: %w", i, err)
		}
		if c.Name == "" {
			return nil, fmt.Errorf("cluster %d has no name", i)
		}
		got = append(got, c.Name)
	}
	slices.Sort(got)
	return got, nil
}

// loadAssignments reads the endpoints of an EDS response, by cluster.
func loadAssignments(resp *discovery.DiscoveryResponse) (map[string]*endpoint.ClusterLoadAssignment, error) {
	got := map[string]*endpoint.ClusterLoadAssignment{}
	for i, a := range resp.Resources {
		var cla endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&cla); err != nil {
			return nil, fmt.Errorf("endpoints %d do not decode: %w", i, err)
		}
		if cla.ClusterName == "" {
			return nil, fmt.Errorf("endpoints %d name no cluster", i)
		}
		got[cla.ClusterName] = &cla
	}
	return got, nil
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
				s.Instances = append(s.Instances, Instance{Node: loc.GetLocality().GetZone(),
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
