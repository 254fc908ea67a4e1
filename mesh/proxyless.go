package mesh

import (
	"context"
	"encoding/json"
	"net"

	"github.com/ubkit-io/ubkit/transport"
)

// Bootstrap returns the xDS bootstrap for a proxyless gRPC process on node
// of the super node superNode, talking to the control plane at server
// (host:port). Put it in GRPC_XDS_BOOTSTRAP_CONFIG before the process
// starts (grpc-go reads it once); then grpc.NewClient("xds:///<service>")
// resolves through the control plane.
func Bootstrap(superNode, node, server string) ([]byte, error) {
	type creds struct {
		Type string `json:"type"`
	}
	type xdsServer struct {
		ServerURI      string   `json:"server_uri"`
		ChannelCreds   []creds  `json:"channel_creds"`
		ServerFeatures []string `json:"server_features"`
	}
	type locality struct {
		Region string `json:"region"`
		Zone   string `json:"zone"`
	}
	type nodeInfo struct {
		ID       string   `json:"id"`
		Cluster  string   `json:"cluster"`
		Locality locality `json:"locality"`
	}
	return json.Marshal(struct {
		XDSServers []xdsServer `json:"xds_servers"`
		Node       nodeInfo    `json:"node"`
	}{
		XDSServers: []xdsServer{{ServerURI: server, ChannelCreds: []creds{{Type: "insecure"}}, ServerFeatures: []string{"xds_v3"}}},
		Node:       nodeInfo{ID: "ubkit~" + superNode + "~" + node, Cluster: superNode, Locality: locality{Region: superNode, Zone: node}},
	})
}

// Dialer returns a dialer for grpc.WithContextDialer: an instance the
// registry says also listens on the bus is dialed there with ep (the ub
// path to another node, shm on this one); any other address over TCP.
func Dialer(ep *transport.Endpoint, reg Registry) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if reg != nil {
			if services, err := reg.Services(ctx); err == nil {
				if bus, ok := busAddress(services, addr); ok {
					return ep.Dial(ctx, bus)
				}
			}
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}
