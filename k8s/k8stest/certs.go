package k8stest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is a Cluster's test certificate authority, and the files the
// processes read: the CA, the apiserver's serving certificate and the
// service-account key.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  crypto.Signer
	// Files in dir.
	caFile, caKeyFile, servingCert, servingKey, saKey string
}

// clientCert is a client certificate and key, PEM-encoded, that the
// apiserver authenticates as a user in groups.
type clientCert struct {
	certPEM, keyPEM []byte
}

func newPKI(dir string) (*pki, error) {
	p := &pki{dir: dir}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ubkit k8stest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	p.caKey = key
	p.caFile = filepath.Join(dir, "ca.crt")
	p.caKeyFile = filepath.Join(dir, "ca.key")
	if err := writePEM(p.caFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	if err := writeKey(p.caKeyFile, key); err != nil {
		return nil, err
	}

	serving, err := p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	})
	if err != nil {
		return nil, err
	}
	p.servingCert = filepath.Join(dir, "apiserver.crt")
	p.servingKey = filepath.Join(dir, "apiserver.key")
	if err := os.WriteFile(p.servingCert, serving.certPEM, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(p.servingKey, serving.keyPEM, 0o600); err != nil {
		return nil, err
	}

	// Service-account tokens are signed with an RSA key (RS256, which
	// every client of the issuer can check).
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	p.saKey = filepath.Join(dir, "sa.key")
	if err := writeKey(p.saKey, saKey); err != nil {
		return nil, err
	}
	return p, nil
}

// client issues a client certificate for user in groups (the apiserver
// reads the user from the common name, the groups from the
// organisations).
func (p *pki) client(user string, groups ...string) (clientCert, error) {
	return p.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// issue signs tmpl, given a fresh key and serial number, with the CA.
func (p *pki) issue(tmpl *x509.Certificate) (clientCert, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return clientCert{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return clientCert{}, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, key.Public(), p.caKey)
	if err != nil {
		return clientCert{}, fmt.Errorf("k8stest: issue a certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return clientCert{}, err
	}
	return clientCert{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func (p *pki) caPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.caCert.Raw})
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

func writeKey(path string, key crypto.Signer) error {
	// PKCS #1 for RSA and SEC 1 for EC: the formats every Kubernetes
	// component reads for these flags.
	switch k := key.(type) {
	case *rsa.PrivateKey:
		return writePEM(path, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(k))
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return err
		}
		return writePEM(path, "EC PRIVATE KEY", der)
	}
	return fmt.Errorf("k8stest: unsupported key type %T", key)
}
