package meshsuite

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/mesh"
	"github.com/ubkit-io/ubkit/shm"
)

// haproxyRelay is the baseline a user would deploy instead of ubkit's node
// proxies, the sidecar or ambient pattern: an HAProxy on the client's node
// takes the application's plain TCP and relays it over TCP with mutual TLS
// (TLS 1.3, certificates from a mesh CA, each side verifying the other's)
// to an HAProxy on the server's node, which relays it to the backend. Both
// relay at layer 4 (mode tcp), as the node proxies do, with one thread each
// on their node's CPU (nodeCPU), as the node proxies run Go code on one
// thread there.
type haproxyRelay struct {
	// Local is where the application connects: the client node's HAProxy.
	Local string
	// Hop is where the client node's HAProxy connects with mutual TLS: the
	// server node's.
	Hop     string
	servers []*testenv.Server
}

// startHAProxyRelay starts the two HAProxy processes of a relay to backend
// (host:port) on free loopback ports, with certificates from a fresh mesh
// CA for superNode, and returns once both listen.
func startHAProxyRelay(superNode, backend string) (*haproxyRelay, error) {
	ca, err := mesh.NewCA(superNode, time.Hour)
	if err != nil {
		return nil, err
	}
	r := &haproxyRelay{}
	inbound, err := startInboundHAProxy(ca, serverNode, backend)
	if err != nil {
		return nil, err
	}
	r.servers, r.Hop = append(r.servers, inbound), inbound.Addr
	outbound, err := startOutboundHAProxy(ca, clientNode, inbound.Addr, serverNode)
	if err != nil {
		r.Close()
		return nil, err
	}
	r.servers, r.Local = append(r.servers, outbound), outbound.Addr
	return r, nil
}

// startInboundHAProxy starts node's HAProxy accepting connections with
// mutual TLS (a client certificate from ca required) and relaying them to
// backend.
func startInboundHAProxy(ca *mesh.CA, node, backend string) (*testenv.Server, error) {
	return startHAProxy(ca, node, func(port int, crt, caFile string) string {
		return fmt.Sprintf(`frontend hop
	bind 127.0.0.1:%d ssl crt %s ca-file %s verify required ssl-min-ver TLSv1.3
	default_backend service
backend service
	server backend %s
`, port, crt, caFile, backend)
	})
}

// startOutboundHAProxy starts node's HAProxy accepting the application's
// plain TCP and relaying it with mutual TLS to hop, whose certificate must
// be peer's (named for it, as the node proxies check that their peer's
// certificate names the node they dialed).
func startOutboundHAProxy(ca *mesh.CA, node, hop, peer string) (*testenv.Server, error) {
	return startHAProxy(ca, node, func(port int, crt, caFile string) string {
		return fmt.Sprintf(`frontend app
	bind 127.0.0.1:%d
	default_backend hop
backend hop
	server %s %s ssl crt %s ca-file %s verify required verifyhost %s sni str(%s) ssl-min-ver TLSv1.3
`, port, peer, hop, crt, caFile, peer, peer)
	})
}

// Close stops both HAProxy processes and removes their files.
func (r *haproxyRelay) Close() {
	for _, s := range r.servers {
		s.Close()
	}
}

// startHAProxy starts node's HAProxy, pinned to the node's CPU, with node's
// certificate and key from ca; frontends returns its proxies' sections for
// the port to bind, the certificate file and the CA file.
func startHAProxy(ca *mesh.CA, node string, frontends func(port int, crt, caFile string) string) (*testenv.Server, error) {
	cpu, err := shm.AllowedCPU(nodeCPU[node])
	if err != nil {
		return nil, err
	}
	cert, err := ca.Issue(node, time.Hour)
	if err != nil {
		return nil, err
	}
	return testenv.StartHAProxy(func(port int, dir string) (string, error) {
		crt, caFile := filepath.Join(dir, node+".pem"), filepath.Join(dir, "ca.pem")
		if err := writePEM(crt, cert); err != nil {
			return "", err
		}
		if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert().Raw}), 0o600); err != nil {
			return "", err
		}
		return fmt.Sprintf(`global
	nbthread 1
	cpu-map 1/all %d
defaults
	mode tcp
	timeout connect 5s
	timeout client 1m
	timeout server 1m
`, cpu) + frontends(port, crt, caFile), nil
	})
}

// writePEM writes cert's chain and private key to path, the form HAProxy's
// crt takes.
func writePEM(path string, cert tls.Certificate) error {
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return err
	}
	var b []byte
	for _, der := range cert.Certificate {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	b = append(b, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...)
	return os.WriteFile(path, b, 0o600)
}
