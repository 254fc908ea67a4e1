// Command mesh-proxy runs ubkit's mesh on three nodes of the simulated
// super node dev4, all in this process: an xDS control plane, a node proxy
// per node (configured from the control plane over xDS, hops between them
// over the bus with mutual TLS) and an HTTP service on n2. Then it sends an
// HTTP request to n0's proxy, as an application on n0 would, and prints
// the answer.
//
// In a real deployment each node runs one proxy process (with UB_NODE
// naming its node and UB_TOPOLOGY the super node), the control plane runs
// once, and the CA's certificates are issued ahead of time.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/ubkit-io/ubkit/mesh"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

const (
	superNode = "dev4" // a shipped example topology: four nodes, 20 µs links
	service   = "hello"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mesh-proxy:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topo, err := topology.Example(superNode)
	if err != nil {
		return err
	}

	// The service: plain HTTP on TCP, on node n2.
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the service on n2 (you asked for %s)\n", r.URL.Path)
	})}
	go srv.Serve(backend)
	defer srv.Close()

	// The control plane publishes the registry's services to every node,
	// each with its own view of where the endpoints are.
	reg, err := mesh.NewStaticRegistry([]mesh.Service{{Name: service, Instances: []mesh.Instance{
		{Node: "n2", Address: backend.Addr().String()},
	}}})
	if err != nil {
		return err
	}
	cp := mesh.NewControlPlane(topo, reg)
	cpl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go cp.Serve(cpl)
	defer cp.Close()

	// The mesh's CA: proxies prove their node to each other with its
	// certificates.
	ca, err := mesh.NewCA(topo.Name, 24*time.Hour)
	if err != nil {
		return err
	}

	// The transport's rendezvous sockets for this run, and a simulated
	// fabric (link state) of its own, both removed at the end.
	dir, err := os.MkdirTemp("", "mesh-proxy-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	fabric := fmt.Sprintf("mesh-proxy-%d", os.Getpid())
	defer removeFabric(topo, fabric)

	local := map[string]string{} // node -> its proxy's listener for the service
	for _, node := range []string{"n0", "n1", "n2"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: node, Topology: topo, Provider: simprov.Name,
			ProviderOptions: map[string]string{simprov.OptFabric: fabric}, RuntimeDir: dir})
		if err != nil {
			return err
		}
		defer ep.Close()
		// The proxy's registry follows the control plane over xDS.
		xr, err := mesh.NewXDSRegistry(ctx, mesh.XDSConfig{SuperNode: topo.Name, Node: node, Server: cpl.Addr().String(),
			Credentials: insecure.NewCredentials()}) // insecure only because the control plane is on loopback
		if err != nil {
			return err
		}
		defer xr.Close()
		select {
		case <-xr.Ready():
		case <-ctx.Done():
			return errors.New("the control plane sent no endpoints")
		}
		cert, err := ca.Issue(node, 24*time.Hour)
		if err != nil {
			return err
		}
		p, err := mesh.NewNodeProxy(ctx, mesh.ProxyConfig{Endpoint: ep, SuperNode: topo.Name, Cert: cert, Roots: ca.Roots(), Registry: xr})
		if err != nil {
			return err
		}
		defer p.Close()
		l, err := p.ListenService(service, "127.0.0.1:0")
		if err != nil {
			return err
		}
		local[node] = l.Addr().String()
	}

	// An application on n0 talks plain HTTP to its node's proxy; the
	// proxy carries the connection to n2's proxy over the bus.
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	url := "http://" + local["n0"] + "/greeting"
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	fmt.Printf("GET %s (n0's proxy) -> %s %s", url, resp.Status, body)
	return nil
}

// removeFabric deletes the simulated fabric's shared state, which
// outlives the processes of a simulation by design.
func removeFabric(topo *topology.Topology, name string) {
	f, err := simprov.OpenFabricNamed(topo, name)
	if err != nil {
		return
	}
	f.Remove()
	f.Close()
}
