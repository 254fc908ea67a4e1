package transport

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Environment variables that give the default endpoint its identity (see
// Identity): PEM files of the node's certificate and key, and of the super
// node's CA.
const (
	EnvCert = "UBKIT_TLS_CERT"
	EnvKey  = "UBKIT_TLS_KEY"
	EnvCA   = "UBKIT_TLS_CA"
)

// Identity is what proves a node's name to other hosts: a certificate
// naming the node, issued by the super node's CA, and that CA, which
// verifies the other nodes' certificates. A certificate names node n of
// super node s with the URI SAN spiffe://s/node/n, as mesh.CA issues them.
//
// Dialers and listeners on other hosts (the tcp and ub paths across the
// network) run mutual TLS 1.3 with it: a listener accepts a remote dialer
// only if its certificate names the node it claims to be, and a dialer
// talks only to a listener whose certificate names the node it dialed. An
// endpoint without an identity refuses every dialer from another host.
type Identity struct {
	// Certificate is this node's, with its private key.
	Certificate tls.Certificate
	// Roots verify the other nodes' certificates: the super node's CA.
	Roots *x509.CertPool
	// SuperNode is the trust domain the certificates must name. Default:
	// the endpoint's topology name.
	SuperNode string
}

// identityFromEnv loads the identity UBKIT_TLS_CERT, UBKIT_TLS_KEY and
// UBKIT_TLS_CA name, if they are set.
func identityFromEnv() (*Identity, error) {
	cert, key, ca := os.Getenv(EnvCert), os.Getenv(EnvKey), os.Getenv(EnvCA)
	if cert == "" && key == "" && ca == "" {
		return nil, nil
	}
	if cert == "" || key == "" || ca == "" {
		return nil, fmt.Errorf("transport: set all of %s, %s and %s, or none", EnvCert, EnvKey, EnvCA)
	}
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("transport: node certificate (%s, %s): %w", EnvCert, EnvKey, err)
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, fmt.Errorf("transport: super node CA (%s): %w", EnvCA, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("transport: super node CA (%s): no PEM certificate in %s", EnvCA, ca)
	}
	return &Identity{Certificate: kp, Roots: roots}, nil
}

// certNode returns the node a certificate names in trust domain superNode.
func certNode(c *x509.Certificate, superNode string) (string, error) {
	if len(c.URIs) == 1 {
		u := c.URIs[0]
		if u.Scheme == "spiffe" && u.Host == superNode && u.User == nil && u.RawQuery == "" && u.Fragment == "" {
			if n, ok := strings.CutPrefix(u.Path, "/node/"); ok && checkName("node", n) == nil {
				return n, nil
			}
		}
	}
	return "", fmt.Errorf("transport: the peer's certificate names no node of super node %q (want a URI SAN spiffe://%s/node/<node>)", superNode, superNode)
}

// verifyPeer checks a peer's certificate chain against the roots and
// returns the node it names.
func (id *Identity) verifyPeer(cs tls.ConnectionState, usage x509.ExtKeyUsage) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("transport: the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: id.Roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return "", fmt.Errorf("transport: the peer's certificate: %w", err)
	}
	return certNode(leaf, id.SuperNode)
}

// check makes sure an identity can serve node: its certificate names the
// node and chains to its roots.
func (id *Identity) check(node string) error {
	if id.Roots == nil || len(id.Certificate.Certificate) == 0 || id.Certificate.PrivateKey == nil {
		return errors.New("transport: an identity needs a certificate, its key, and the roots that verify other nodes'")
	}
	leaf, err := x509.ParseCertificate(id.Certificate.Certificate[0])
	if err != nil {
		return fmt.Errorf("transport: the identity's certificate: %w", err)
	}
	inter := x509.NewCertPool()
	for _, der := range id.Certificate.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: id.Roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("transport: the identity's certificate does not chain to its roots: %w", err)
	}
	got, err := certNode(leaf, id.SuperNode)
	if err != nil {
		return err
	}
	if got != node {
		return fmt.Errorf("transport: the identity's certificate names node %s, but the endpoint plays node %s", got, node)
	}
	return nil
}

// serverConfig is a listener's side of the handshake: it asks for a
// certificate and leaves the node check to the caller, which knows which
// node the dialer claims.
func (id *Identity) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Certificate},
		ClientAuth:   tls.RequireAnyClientCert,
		// Every connection runs the full handshake, and its checks.
		SessionTicketsDisabled: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := id.verifyPeer(cs, x509.ExtKeyUsageClientAuth)
			return err
		},
	}
}

// clientConfig is a dialer's side: the listener must prove it is node.
func (id *Identity) clientConfig(node string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.Certificate},
		// The standard check wants the node's name as a DNS name; the
		// certificate names it as a URI, checked below instead.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := id.verifyPeer(cs, x509.ExtKeyUsageServerAuth)
			if err == nil && got != node {
				err = fmt.Errorf("transport: dialed node %s, but the listener's certificate names node %s", node, got)
			}
			return err
		},
	}
}
