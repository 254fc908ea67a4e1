package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// NodeCA is a super node's certificate authority for tests across hosts
// (network namespaces): it issues node certificates the way mesh.CA does
// (a URI SAN spiffe://<super node>/node/<node>), into PEM files, for
// transport endpoints to prove their node to each other.
type NodeCA struct {
	dir, name string
	cert      *x509.Certificate
	key       *ecdsa.PrivateKey
}

// NewNodeCA makes a CA called name with its certificate in
// dir/<name>-ca.pem, valid for a day.
func NewNodeCA(dir, name string) (*NodeCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &NodeCA{dir: dir, name: name, cert: cert, key: key}
	return ca, writePEM(ca.caFile(), "CERTIFICATE", der)
}

func (ca *NodeCA) caFile() string { return filepath.Join(ca.dir, ca.name+"-ca.pem") }

// Cert is the CA's certificate.
func (ca *NodeCA) Cert() *x509.Certificate { return ca.cert }

// Issue writes a certificate and key naming node of superNode, as
// dir/<superNode>-<node>.pem and .key, and returns the environment
// (UBKIT_TLS_CERT, UBKIT_TLS_KEY, UBKIT_TLS_CA) that makes them a
// default transport endpoint's identity.
func (ca *NodeCA) Issue(superNode, node string) ([]string, error) {
	return ca.IssueFile(fmt.Sprintf("%s-%s", superNode, node), superNode, node)
}

// IssueFile is Issue into dir/<file>.pem and dir/<file>.key.
func (ca *NodeCA) IssueFile(file, superNode, node string) ([]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: n, Subject: pkix.Name{CommonName: node},
		URIs:      []*url.URL{{Scheme: "spiffe", Host: superNode, Path: "/node/" + node}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	base := filepath.Join(ca.dir, file)
	if err := writePEM(base+".pem", "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writePEM(base+".key", "PRIVATE KEY", kd); err != nil {
		return nil, err
	}
	return []string{"UBKIT_TLS_CERT=" + base + ".pem", "UBKIT_TLS_KEY=" + base + ".key", "UBKIT_TLS_CA=" + ca.caFile()}, nil
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// TwoHostTopology writes dir/topology.json: super node superNode with
// node n0 at address a and n1 at address b (each with its registry on the
// default port 7470), one link between them, and returns its path.
func TwoHostTopology(dir, superNode, a, b string) (string, error) {
	node := func(name, addr string) map[string]any {
		return map[string]any{"name": name, "cpus": 1, "memory": "1GiB",
			"labels": map[string]string{"ubkit.io/address": addr, "ubkit.io/registry": net.JoinHostPort(addr, "7470")}}
	}
	js, err := json.Marshal(map[string]any{"name": superNode, "nodes": []any{node("n0", a), node("n1", b)},
		"links": []any{map[string]any{"a": "n0", "b": "n1", "latency": "1us", "bandwidth": "10GB/s"}}})
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "topology.json")
	return path, os.WriteFile(path, js, 0o600)
}
