package meshsuite

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"google.golang.org/grpc/credentials/insecure"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/mesh"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// The mesh: an application on clientNode calls service, served on
// serverNode.
const (
	topo       = "cm384"
	clientNode = "node00"
	serverNode = "node01"
	service    = "echo"
)

// nodeCPU is the CPU, counted among those this process may use, that the
// processes of each node run on. On a machine with one, they all share it.
var nodeCPU = map[string]int{clientNode: 0, serverNode: 1}

// runSeq numbers this process's runs, for their fabrics' names.
var runSeq atomic.Int64

// backendArgs starts a backend peer: an HTTP echo handler, a gRPC echo
// service or a TCP echo, on a loopback TCP port it prints.
type backendArgs struct {
	Mode string `json:"mode"` // http, grpc or tcp
	onCPU
}

// proxyArgs starts a node proxy peer: its node's transport endpoint on the
// simulated super node, its certificate from the mesh CA, and its
// configuration from the control plane at ControlPlane. It prints the
// address of its local listener for the service.
type proxyArgs struct {
	Node         string `json:"node"`
	RuntimeDir   string `json:"runtimeDir"`
	Fabric       string `json:"fabric"` // the simulation's shared state (simprov.OptFabric)
	ControlPlane string `json:"controlPlane"`
	Cert         []byte `json:"cert"` // DER
	Key          []byte `json:"key"`  // PKCS #8
	Root         []byte `json:"root"` // DER
	onCPU
}

// clientArgs starts the application peer: it measures (see measure) and
// prints the round trips as a clientResult.
type clientArgs struct {
	Mode       string        `json:"mode"`
	Via        string        `json:"via"`
	Direct     string        `json:"direct"`
	For        time.Duration `json:"for"`
	DirectOnly bool          `json:"directOnly"`
	onCPU
}

type clientResult struct {
	Via    []float64 `json:"via"`
	Direct []float64 `json:"direct"`
}

func init() {
	pinnedPeer("mesh-backend", func(a backendArgs) error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		fmt.Println(l.Addr())
		switch a.Mode {
		case "http":
			return http.Serve(l, echo)
		case "grpc":
			return grpcEcho().Serve(l)
		case "tcp":
			return serveTCPEcho(l)
		}
		return fmt.Errorf("unknown mode %q", a.Mode)
	})
	pinnedPeer("mesh-proxy", func(a proxyArgs) error {
		t, err := topology.Example(topo)
		if err != nil {
			return err
		}
		key, err := x509.ParsePKCS8PrivateKey(a.Key)
		if err != nil {
			return err
		}
		root, err := x509.ParseCertificate(a.Root)
		if err != nil {
			return err
		}
		roots := x509.NewCertPool()
		roots.AddCert(root)
		ep, err := transport.NewEndpoint(transport.Config{Node: a.Node, Topology: t, Provider: "sim", RuntimeDir: a.RuntimeDir,
			ProviderOptions: map[string]string{simprov.OptFabric: a.Fabric}})
		if err != nil {
			return err
		}
		defer ep.Close()
		xr, err := mesh.NewXDSRegistry(context.Background(), mesh.XDSConfig{SuperNode: t.Name, Node: a.Node, Server: a.ControlPlane,
			Credentials: insecure.NewCredentials()})
		if err != nil {
			return err
		}
		defer xr.Close()
		select {
		case <-xr.Ready():
		case <-time.After(10 * time.Second):
			return errors.New("the control plane sent no endpoints")
		}
		p, err := mesh.NewNodeProxy(context.Background(), mesh.ProxyConfig{Endpoint: ep, SuperNode: t.Name,
			Cert: tls.Certificate{Certificate: [][]byte{a.Cert}, PrivateKey: key}, Roots: roots, Registry: xr})
		if err != nil {
			return err
		}
		defer p.Close()
		l, err := p.ListenService(service, "127.0.0.1:0")
		if err != nil {
			return err
		}
		fmt.Println(l.Addr())
		select {} // until the harness kills it
	})
	pinnedPeer("mesh-client", func(a clientArgs) error {
		vs, ds, err := measure(a.Mode, a.Via, a.Direct, a.For, a.DirectOnly)
		if err != nil {
			return err
		}
		if err := json.NewEncoder(os.Stdout).Encode(clientResult{Via: vs, Direct: ds}); err != nil {
			return err
		}
		// Until the harness kills it: the harness stops reading the output
		// of a peer that exited.
		select {}
	})
}

// onCPU is the part of a peer's arguments that says which CPU it runs on
// (see nodeCPU).
type onCPU struct {
	CPU int `json:"cpu"`
}

func (o onCPU) cpu() int { return o.CPU }

// pinnedPeer registers a peer role that runs pinned to the CPU its
// arguments name.
func pinnedPeer[A interface{ cpu() int }](role string, run func(A) error) {
	bench.RegisterPeer(role, func(raw json.RawMessage) error {
		var a A
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		if err := pin(a.cpu()); err != nil {
			return err
		}
		return run(a)
	})
}

// pin puts this process on its node's CPU, running Go code on one
// thread at a time.
func pin(cpu int) error {
	runtime.GOMAXPROCS(1)
	_, err := shm.PinProcess(cpu)
	return err
}

// procSamples runs the mesh as a deployment does: backend, node proxies and
// application in processes of their own, each on its node's CPU, with the
// control plane (and its CA) in this process.
var procSamples = deployedSamples(nodeProxies)

// haproxySamples runs the same with HAProxy relaying in place of the node
// proxies (see haproxyRelay).
var haproxySamples = deployedSamples(func(t *topology.Topology, backend string, closers *[]func()) (string, error) {
	r, err := startHAProxyRelay(t.Name, backend)
	if err != nil {
		return "", err
	}
	*closers = append(*closers, r.Close)
	return r.Local, nil
})

// relayFunc starts what carries the application's calls on clientNode to
// the backend (host:port) on serverNode, adds what stops it to closers,
// and returns where the application connects.
type relayFunc func(t *topology.Topology, backend string, closers *[]func()) (via string, err error)

// deployedSamples returns a samplesFunc that runs a backend process on
// serverNode's CPU, the relay (unless directOnly) and the application's
// process on clientNode's CPU, which measures.
func deployedSamples(relay relayFunc) samplesFunc {
	return func(mode string, d time.Duration, directOnly bool) (vs, ds []float64, err error) {
		var closers []func()
		defer func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}()
		t, err := topology.Example(topo)
		if err != nil {
			return nil, nil, err
		}
		be, backend, err := startLine("mesh-backend", backendArgs{Mode: mode, onCPU: onCPU{nodeCPU[serverNode]}})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, be.Kill)
		var via string
		if !directOnly {
			if via, err = relay(t, backend, &closers); err != nil {
				return nil, nil, err
			}
		}
		p, err := bench.StartPeerPipe("mesh-client", clientArgs{Mode: mode, Via: via, Direct: backend, For: d,
			DirectOnly: directOnly, onCPU: onCPU{nodeCPU[clientNode]}})
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, p.Kill)
		// Every call has its own timeout; this bounds the whole run as
		// well, so that nothing wedged can hold the harness.
		watchdog := time.AfterFunc(d+time.Minute, p.Kill)
		defer watchdog.Stop()
		var res clientResult
		if err := json.NewDecoder(p.Stdout()).Decode(&res); err != nil {
			return nil, nil, fmt.Errorf("mesh-client: %w (%v)", err, p.Wait())
		}
		return res.Via, res.Direct, nil
	}
}

// nodeProxies starts ubkit's mesh between the nodes: the simulated super
// node's shared state, the control plane (in this process, with its CA)
// and a node proxy process on each node's CPU.
func nodeProxies(t *topology.Topology, backend string, closers *[]func()) (string, error) {
	// The simulated super node's shared state (link bookings) is this
	// run's own, not shared with any other simulation of cm384 on the
	// host; this process makes it and removes it at the end.
	fabric := fmt.Sprintf("meshbench-%d-%d", os.Getpid(), runSeq.Add(1))
	fab, err := simprov.OpenFabricNamed(t, fabric)
	if err != nil {
		return "", err
	}
	*closers = append(*closers, func() {
		// Last of the relay: the peers were killed, as crashed processes
		// would be, and their shared memory goes the way a crashed
		// process's does.
		shm.Sweep()
		fab.Remove()
		fab.Close()
	})
	dir, err := os.MkdirTemp("", "ubkit-meshbench-")
	if err != nil {
		return "", err
	}
	*closers = append(*closers, func() { os.RemoveAll(dir) })
	reg, err := mesh.NewStaticRegistry([]mesh.Service{{Name: service, Instances: []mesh.Instance{{Node: serverNode, Address: backend}}}})
	if err != nil {
		return "", err
	}
	cp := mesh.NewControlPlane(t, reg)
	cl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go cp.Serve(cl)
	*closers = append(*closers, func() { cp.Close(); cl.Close() })
	ca, err := mesh.NewCA(t.Name, time.Hour)
	if err != nil {
		return "", err
	}
	var via string
	for _, n := range []string{serverNode, clientNode} {
		cert, err := ca.Issue(n, time.Hour)
		if err != nil {
			return "", err
		}
		key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
		if err != nil {
			return "", err
		}
		p, addr, err := startLine("mesh-proxy", proxyArgs{Node: n, RuntimeDir: dir, Fabric: fabric, ControlPlane: cl.Addr().String(),
			Cert: cert.Certificate[0], Key: key, Root: ca.Cert().Raw, onCPU: onCPU{nodeCPU[n]}})
		if err != nil {
			return "", err
		}
		*closers = append(*closers, p.Kill)
		if n == clientNode {
			via = addr
		}
	}
	return via, nil
}

// startLine starts a peer and reads the line it prints.
func startLine(role string, args any) (*bench.Peer, string, error) {
	p, err := bench.StartPeerPipe(role, args)
	if err != nil {
		return nil, "", err
	}
	line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
	if err != nil {
		p.Kill()
		return nil, "", fmt.Errorf("%s: %w (%v)", role, err, p.Wait())
	}
	return p, strings.TrimSpace(line), nil
}
