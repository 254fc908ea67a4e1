// Package meshsim starts a mesh on a simulated super node inside one
// process: the control plane, a node proxy per node configured from it over
// xDS, and HTTP backends. `ubctl demo` and `ubctl bench mesh` use it;
// examples/mesh-proxy does the same with public packages only.
package meshsim

import (
	"context"
	"errors"
	"google.golang.org/grpc/credentials/insecure"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mesh"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"

	// The simulated super node's ub provider.
	_ "github.com/ubkit-io/ubkit/ub/provider/simprov"
)

// Mesh is a running mesh.
type Mesh struct {
	// Local maps each node to its proxy's local listener for the service.
	Local map[string]string
	// Backend is the service's backend address (plain TCP).
	Backend string
	closers []func()
	dir     string
}

// Start runs topology example topo's nodes with a proxy each and service
// served by handler on backendNode.
func Start(topo string, nodes []string, service, backendNode string, handler http.Handler) (*Mesh, error) {
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: handler}
	go srv.Serve(bl)
	m, err := StartAt(topo, nodes, service, backendNode, bl.Addr().String())
	if err != nil {
		srv.Close()
		return nil, err
	}
	m.closers = append([]func(){func() { srv.Close() }}, m.closers...)
	return m, nil
}

// StartAt is Start for a backend already listening at backend.
func StartAt(topo string, nodes []string, service, backendNode, backend string) (*Mesh, error) {
	t, err := topology.Example(topo)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ubkit-meshsim-")
	if err != nil {
		return nil, err
	}
	m := &Mesh{Local: map[string]string{}, dir: dir, Backend: backend}
	fail := func(err error) (*Mesh, error) {
		m.Close()
		return nil, err
	}
	reg, err := mesh.NewStaticRegistry([]mesh.Service{{Name: service, Instances: []mesh.Instance{{Node: backendNode, Address: m.Backend}}}})
	if err != nil {
		return fail(err)
	}
	cp := mesh.NewControlPlane(t, reg)
	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	go cp.Serve(cl)
	m.closers = append(m.closers, cp.Close)
	ca, err := mesh.NewCA(t.Name, 24*time.Hour)
	if err != nil {
		return fail(err)
	}
	for _, n := range nodes {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: t, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			return fail(err)
		}
		m.closers = append(m.closers, func() { ep.Close() })
		xr, err := mesh.NewXDSRegistry(context.Background(), mesh.XDSConfig{SuperNode: t.Name, Node: n, Server: cl.Addr().String(),
			Credentials: insecure.NewCredentials()})
		if err != nil {
			return fail(err)
		}
		m.closers = append(m.closers, xr.Close)
		select {
		case <-xr.Ready():
		case <-time.After(10 * time.Second):
			return fail(errors.New("meshsim: the control plane sent no endpoints"))
		}
		cert, err := ca.Issue(n, 24*time.Hour)
		if err != nil {
			return fail(err)
		}
		p, err := mesh.NewNodeProxy(context.Background(), mesh.ProxyConfig{Endpoint: ep, SuperNode: t.Name, Cert: cert, Roots: ca.Roots(), Registry: xr})
		if err != nil {
			return fail(err)
		}
		m.closers = append(m.closers, func() { p.Close() })
		l, err := p.ListenService(service, "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		m.Local[n] = l.Addr().String()
	}
	return m, nil
}

// Close stops everything, last started first.
func (m *Mesh) Close() {
	for i := len(m.closers) - 1; i >= 0; i-- {
		m.closers[i]()
	}
	os.RemoveAll(m.dir)
	// The simulated super node's link state outlives processes by design;
	// a mesh started here removes it if it made it.
	testenv.RemoveOwnSimFabrics()
}
