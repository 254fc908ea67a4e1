package mesh

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// ControlPlane serves xDS (ADS and the separate LDS, RDS, CDS and EDS
// services, v3) for the services of a Registry, with a view per node of
// the topology.
type ControlPlane struct {
	// Logger gets what the control plane has to say that no call
	// returns: views it could not build and configurations a client
	// refused (at Warn), streams opening and closing and the snapshot
	// cache's own messages (at Debug). Set it before Serve. Default:
	// nothing is logged.
	Logger *slog.Logger

	topo  *topology.Topology
	reg   Registry
	cache cachev3.SnapshotCache
	srv   *grpc.Server

	mu       sync.Mutex
	nodes    map[string]bool // nodes that asked, by view key
	closed   bool
	serving  bool
	stop     chan struct{}
	stopOnce sync.Once
	updating sync.Mutex // one view update at a time, so none lands stale
}

// nodeView keys snapshots by the node the client runs on: the locality
// zone its bootstrap gives (see Bootstrap), else its node ID.
type nodeView struct{}

func (nodeView) ID(n *core.Node) string {
	if n == nil {
		return ""
	}
	if z := n.GetLocality().GetZone(); z != "" {
		return z
	}
	return n.GetId()
}

// NewControlPlane returns a control plane for the services of reg, placed
// on the nodes of t.
func NewControlPlane(t *topology.Topology, reg Registry) *ControlPlane {
	cp := &ControlPlane{topo: t, reg: reg, nodes: map[string]bool{}, stop: make(chan struct{})}
	// Every snapshot is complete and consistent, so requests are answered
	// as they come, on ADS and on the separate services alike.
	cp.cache = cachev3.NewSnapshotCache(false, nodeView{}, cacheLog{cp})
	return cp
}

var discard = slog.New(slog.DiscardHandler)

func (cp *ControlPlane) log() *slog.Logger {
	if cp.Logger == nil {
		return discard
	}
	return cp.Logger
}

// cacheLog gives go-control-plane's snapshot cache the control plane's
// Logger. Its Infof reports every watch, which is Debug for us.
type cacheLog struct{ cp *ControlPlane }

func (l cacheLog) logf(level slog.Level, format string, args []any) {
	if lg := l.cp.log(); lg.Enabled(context.Background(), level) {
		lg.Log(context.Background(), level, "mesh: xDS cache: "+fmt.Sprintf(format, args...))
	}
}

func (l cacheLog) Debugf(format string, args ...any) { l.logf(slog.LevelDebug, format, args) }
func (l cacheLog) Infof(format string, args ...any)  { l.logf(slog.LevelDebug, format, args) }
func (l cacheLog) Warnf(format string, args ...any)  { l.logf(slog.LevelWarn, format, args) }
func (l cacheLog) Errorf(format string, args ...any) { l.logf(slog.LevelError, format, args) }

// Serve answers xDS on l until Close.
func (cp *ControlPlane) Serve(l net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(_ context.Context, id int64, typeURL string) error {
			cp.log().Debug("mesh: an xDS stream opened", "stream", id, "type", typeURL)
			return nil
		},
		StreamClosedFunc: func(id int64, n *core.Node) {
			cp.log().Debug("mesh: an xDS stream closed", "stream", id, "node", nodeView{}.ID(n))
		},
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			node := nodeView{}.ID(req.GetNode())
			if d := req.GetErrorDetail(); d != nil {
				cp.log().Warn("mesh: a client refused a configuration", "node", node, "type", req.GetTypeUrl(),
					"version_kept", req.GetVersionInfo(), "err", d.GetMessage())
			}
			cp.ensure(node)
			return nil
		},
	}
	xds := serverv3.NewServer(ctx, cp.cache, cb)
	cp.mu.Lock()
	if cp.closed || cp.serving {
		cp.mu.Unlock()
		return errors.New("mesh: control plane closed or already serving")
	}
	cp.serving = true
	cp.srv = grpc.NewServer()
	srv := cp.srv
	cp.mu.Unlock()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, xds)
	listenerservice.RegisterListenerDiscoveryServiceServer(srv, xds)
	routeservice.RegisterRouteDiscoveryServiceServer(srv, xds)
	clusterservice.RegisterClusterDiscoveryServiceServer(srv, xds)
	endpointservice.RegisterEndpointDiscoveryServiceServer(srv, xds)
	go cp.watch()
	return srv.Serve(l)
}

// Close stops serving.
func (cp *ControlPlane) Close() {
	cp.mu.Lock()
	cp.closed = true
	srv := cp.srv
	cp.mu.Unlock()
	cp.stopOnce.Do(func() { close(cp.stop) })
	if srv != nil {
		srv.Stop()
	}
}

// watch rebuilds every node's view when the registry changes.
func (cp *ControlPlane) watch() {
	for {
		select {
		case <-cp.stop:
			return
		case <-cp.reg.Changed():
			cp.mu.Lock()
			nodes := make([]string, 0, len(cp.nodes))
			for n := range cp.nodes {
				nodes = append(nodes, n)
			}
			cp.mu.Unlock()
			for _, n := range nodes {
				cp.updateOrLog(n)
			}
		}
	}
}

// ensure builds a node's view the first time it asks.
func (cp *ControlPlane) ensure(node string) {
	cp.mu.Lock()
	known := cp.nodes[node]
	cp.nodes[node] = true
	cp.mu.Unlock()
	if !known {
		cp.updateOrLog(node)
	}
}

// updateOrLog updates node's view; the node keeps the view it had if that
// fails, and the log says why.
func (cp *ControlPlane) updateOrLog(node string) {
	if err := cp.update(node); err != nil {
		cp.log().Warn("mesh: could not update a node's view", "node", node, "err", err)
	}
}

func (cp *ControlPlane) update(node string) error {
	cp.updating.Lock()
	defer cp.updating.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	services, err := cp.reg.Services(ctx)
	if err != nil {
		return err
	}
	snap, err := cp.Snapshot(node, services)
	if err != nil {
		return err
	}
	return cp.cache.SetSnapshot(ctx, node, snap)
}

// Snapshot builds node's view of services: a listener (with its routes),
// a cluster and an endpoint assignment per service. Its version is a hash of the content,
// so it changes only when the content does.
func (cp *ControlPlane) Snapshot(node string, services []Service) (*cachev3.Snapshot, error) {
	services = slices.Clone(services)
	slices.SortFunc(services, func(a, b Service) int { return cmp.Compare(a.Name, b.Name) })
	// Every type is present, even empty, so that a node with no services
	// still gets answers (and versions) for them.
	res := map[resource.Type][]types.Resource{resource.ListenerType: {}, resource.ClusterType: {}, resource.EndpointType: {}}
	h := sha256.New()
	add := func(t resource.Type, m proto.Message) error {
		res[t] = append(res[t], m.(types.Resource))
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			return err
		}
		h.Write([]byte(t))
		h.Write(b)
		return nil
	}
	for _, s := range services {
		l, err := apiListener(s.Name)
		if err != nil {
			return nil, err
		}
		rs := []struct {
			t resource.Type
			m proto.Message
		}{
			{resource.ListenerType, l},
			{resource.ClusterType, edsCluster(s.Name)},
			{resource.EndpointType, cp.assignment(node, s)},
		}
		if s.ProxyPort > 0 {
			pl, err := proxyListener(s.Name, s.ProxyPort)
			if err != nil {
				return nil, err
			}
			rs = append(rs, struct {
				t resource.Type
				m proto.Message
			}{resource.ListenerType, pl})
		}
		for _, r := range rs {
			if err := add(r.t, r.m); err != nil {
				return nil, err
			}
		}
	}
	snap, err := cachev3.NewSnapshot(hex.EncodeToString(h.Sum(nil))[:16], res)
	if err != nil {
		return nil, err
	}
	if err := snap.Consistent(); err != nil {
		return nil, fmt.Errorf("mesh: inconsistent snapshot for %s: %w", node, err)
	}
	return snap, nil
}

// apiListener is what proxyless gRPC asks for by the target's name.
func apiListener(name string) (*listener.Listener, error) {
	rtr, err := anypb.New(&router.Router{})
	if err != nil {
		return nil, err
	}
	m, err := anypb.New(&hcm.HttpConnectionManager{
		StatPrefix: name,
		// The routes travel inside the listener: go-control-plane's
		// consistency check follows RDS references only from filter
		// chains, not from the API listeners proxyless gRPC uses.
		RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: routeConfig(name)},
		HttpFilters:    []*hcm.HttpFilter{{Name: "router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: rtr}}},
	})
	if err != nil {
		return nil, err
	}
	return &listener.Listener{Name: name, ApiListener: &listener.ApiListener{ApiListener: m}}, nil
}

// ProxyListenerPrefix names the listeners node proxies open for their
// node's applications: "proxy:<service>".
const ProxyListenerPrefix = "proxy:"

// proxyListener is a node proxy's loopback listener for a service: TCP
// proxied to the service's cluster.
func proxyListener(name string, port int) (*listener.Listener, error) {
	tp, err := anypb.New(&tcpproxy.TcpProxy{StatPrefix: name, ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: name}})
	if err != nil {
		return nil, err
	}
	return &listener.Listener{
		Name: ProxyListenerPrefix + name,
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address: "127.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(port)},
		}}},
		FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
			Name: "envoy.filters.network.tcp_proxy", ConfigType: &listener.Filter_TypedConfig{TypedConfig: tp},
		}}}},
	}, nil
}

func ads() *core.ConfigSource {
	return &core.ConfigSource{ResourceApiVersion: core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}
}

func routeConfig(name string) *route.RouteConfiguration {
	return &route.RouteConfiguration{
		Name: name,
		VirtualHosts: []*route.VirtualHost{{
			Name:    name,
			Domains: []string{name},
			Routes: []*route.Route{{
				Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
				Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: name}}},
			}},
		}},
	}
}

func edsCluster(name string) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		CommonLbConfig: &cluster.Cluster_CommonLbConfig{
			LocalityConfigSpecifier: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
				LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{},
			},
		},
	}
}

// assignment groups a service's endpoints by node (zone) and ranks the
// nodes by what reaching them costs from the requesting node: the cheapest
// cost is priority 0, the next priority 1, and so on; within a priority a
// locality's weight is its endpoint count. Endpoints on nodes the topology
// does not know come last.
func (cp *ControlPlane) assignment(from string, s Service) *endpoint.ClusterLoadAssignment {
	byNode := map[string][]Instance{}
	for _, e := range s.Instances {
		byNode[e.Node] = append(byNode[e.Node], e)
	}
	type loc struct {
		node string
		cost time.Duration
	}
	var locs []loc
	for n := range byNode {
		locs = append(locs, loc{n, cp.cost(from, n)})
	}
	slices.SortFunc(locs, func(a, b loc) int { return cmp.Or(cmp.Compare(a.cost, b.cost), cmp.Compare(a.node, b.node)) })
	cla := &endpoint.ClusterLoadAssignment{ClusterName: s.Name}
	prio, last := uint32(0), time.Duration(-1)
	for i, l := range locs {
		if i > 0 && l.cost != last {
			prio++
		}
		last = l.cost
		lle := &endpoint.LocalityLbEndpoints{
			Locality:            &core.Locality{Region: cp.topo.Name, Zone: l.node},
			Priority:            prio,
			LoadBalancingWeight: wrapperspb.UInt32(uint32(len(byNode[l.node]))),
		}
		for _, e := range byNode[l.node] {
			host, port, _ := net.SplitHostPort(e.Address)
			p, _ := strconv.Atoi(port)
			lle.LbEndpoints = append(lle.LbEndpoints, &endpoint.LbEndpoint{
				HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
					Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
						Address: host, PortSpecifier: &core.SocketAddress_PortValue{PortValue: uint32(p)},
					}}},
				}},
				HealthStatus: core.HealthStatus_HEALTHY,
			})
		}
		cla.Endpoints = append(cla.Endpoints, lle)
	}
	return cla
}

// cost is the topology's latency for a 1 KiB message; unknown nodes cost
// the most.
func (cp *ControlPlane) cost(from, to string) time.Duration {
	if from == to {
		return 0
	}
	c, err := cp.topo.PathCost(from, to, 1024)
	if err != nil {
		return time.Duration(1 << 62)
	}
	return c.Transfer
}
