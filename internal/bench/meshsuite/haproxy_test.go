package meshsuite

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/mesh"
)

// echoBackend serves the TCP echo on a loopback port for the test.
func echoBackend(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go serveTCPEcho(l)
	return l.Addr().String()
}

// echoOnce sends one payload over c and says whether the same came back;
// err is why not.
func echoOnce(c net.Conn) error {
	c.SetDeadline(time.Now().Add(callTimeout))
	out, in := bytes.Repeat([]byte("h"), payload), make([]byte, payload)
	if _, err := c.Write(out); err != nil {
		return err
	}
	if _, err := io.ReadFull(c, in); err != nil {
		return err
	}
	if !bytes.Equal(in, out) {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// TestHAProxyRelay: a request goes through the two HAProxy processes and
// comes back, and the hop between them takes only mutual TLS with the
// mesh CA's certificates: plain TCP, TLS without a client certificate and
// TLS with another CA's certificate are refused, while a client holding
// the CA's certificate gets through (so the refusals are the hop's doing).
func TestHAProxyRelay(t *testing.T) {
	r, err := startHAProxyRelay(topo, echoBackend(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := net.Dial("tcp", r.Local)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c); err != nil {
		t.Fatalf("through the relay: %v", err)
	}

	// The hop's own CA is not at hand here (the relay made it); a client
	// of the right CA is tried against a second inbound HAProxy started
	// the same way with a CA the test holds.
	ca, err := mesh.NewCA(topo, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	in, err := startInboundHAProxy(ca, serverNode, echoBackend(t))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	other, err := mesh.NewCA(topo, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	good, err := ca.Issue(clientNode, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.Issue(clientNode, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dialTLS := func(addr string, certs []tls.Certificate) error {
		c, err := tls.Dial("tcp", addr, &tls.Config{Certificates: certs, MinVersion: tls.VersionTLS13,
			// The mesh's certificates name nodes by SPIFFE URI and common
			// name, not by DNS name: check the chain alone.
			InsecureSkipVerify: true,
			VerifyConnection: func(cs tls.ConnectionState) error {
				_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: ca.Roots()})
				return err
			}})
		if err != nil {
			return err
		}
		defer c.Close()
		return echoOnce(c)
	}
	if err := dialTLS(in.Addr, []tls.Certificate{good}); err != nil {
		t.Fatalf("a client with the CA's certificate: %v", err)
	}
	for name, certs := range map[string][]tls.Certificate{"no client certificate": nil, "another CA's certificate": {stranger}} {
		if err := dialTLS(in.Addr, certs); err == nil {
			t.Errorf("the hop took a client with %s", name)
		}
	}
	for _, addr := range []string{in.Addr, r.Hop} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := echoOnce(c); err == nil {
			t.Errorf("the hop at %s echoed plain TCP", addr)
		}
		c.Close()
	}
}

// TestHAProxyRelayChecksPeer: the client node's HAProxy refuses a hop whose
// certificate, though from the mesh CA, names another node than the one it
// relays to.
func TestHAProxyRelayChecksPeer(t *testing.T) {
	ca, err := mesh.NewCA(topo, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	in, err := startInboundHAProxy(ca, "node02", echoBackend(t))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := startOutboundHAProxy(ca, clientNode, in.Addr, serverNode)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	c, err := net.Dial("tcp", out.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoOnce(c); err == nil {
		t.Error("the relay reached a hop whose certificate names node02, not node01")
	}
}
