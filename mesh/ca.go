package mesh

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"time"
)

// CA issues the certificates node proxies present to each other: one per
// node, naming it as spiffe://<super node>/node/<node>.
type CA struct {
	superNode string
	cert      *x509.Certificate
	key       *ecdsa.PrivateKey
	pool      *x509.CertPool
}

// NewCA makes a CA for a super node, valid for validity.
func NewCA(superNode string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ubkit mesh CA for " + superNode},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(validity),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{superNode: superNode, cert: cert, key: key, pool: pool}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// Cert is the CA's own certificate: what proxies in other processes add to
// their roots.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// Roots is the pool that verifies this CA's certificates.
func (ca *CA) Roots() *x509.CertPool { return ca.pool }

// Issue returns a certificate for node, for both ends of a hop.
func (ca *CA) Issue(node string, validity time.Duration) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	id := &url.URL{Scheme: "spiffe", Host: ca.superNode, Path: "/node/" + node}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: node},
		URIs:         []*url.URL{id},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// peerNode returns the node a verified peer certificate names, if it
// belongs to superNode.
func peerNode(cs tls.ConnectionState, superNode string) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("mesh: the peer presented no certificate")
	}
	for _, u := range cs.PeerCertificates[0].URIs {
		if u.Scheme == "spiffe" && u.Host == superNode {
			if n, ok := strings.CutPrefix(u.Path, "/node/"); ok && n != "" {
				return n, nil
			}
		}
	}
	return "", fmt.Errorf("mesh: the peer's certificate names no node of super node %s", superNode)
}
