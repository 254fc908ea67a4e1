package mesh

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// n0 dials n1's proxy; n1 presents (a) a cert for n2 from the right CA,
// (b) a cert for n1 from another CA, (c) a cert for n1 of another super
// node. All must be refused by n0's dialHop.
func TestRegressDialHopVerifiesServer(t *testing.T) {
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hi") })}
	bl, _ := net.Listen("tcp", "127.0.0.1:0")
	go backend.Serve(bl)
	defer backend.Close()
	ca, _ := NewCA("dev4", time.Hour)
	rogue, _ := NewCA("dev4", time.Hour)
	other, _ := NewCA("other", time.Hour)
	for name, mk := range map[string]func() (*CA, string){
		"control":     func() (*CA, string) { return ca, "n1" },
		"wrong node":  func() (*CA, string) { return ca, "n2" },
		"rogue CA":    func() (*CA, string) { return rogue, "n1" },
		"other super": func() (*CA, string) { return other, "n1" },
	} {
		t.Run(name, func(t *testing.T) {
			topo, _ := topology.Example("dev4")
			dir := t.TempDir()
			reg, _ := NewStaticRegistry([]Service{{Name: "web", Instances: []Instance{{Node: "n1", Address: bl.Addr().String()}}}})
			var l0 net.Listener
			for _, n := range []string{"n0", "n1"} {
				ep, _ := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
				defer ep.Close()
				c, cn := ca, n
				roots := ca.Roots()
				if n == "n1" {
					c, cn = mk()
					roots = c.Roots() // n1 accepts n0 only if same CA; irrelevant to dialHop check
					roots.AddCert(ca.cert)
				}
				cert, _ := c.Issue(cn, time.Hour)
				sn := "dev4"
				if c == other {
					sn = "other"
				}
				p, err := NewNodeProxy(context.Background(), ProxyConfig{Endpoint: ep, SuperNode: sn, Cert: cert, Roots: roots, Registry: reg})
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				if n == "n0" {
					l0, _ = p.ListenService("web", "127.0.0.1:0")
				}
			}
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + l0.Addr().String() + "/")
			if err == nil {
				resp.Body.Close()
			}
			if name == "control" && err != nil {
				t.Fatalf("control: %v", err)
			}
			if name != "control" && err == nil {
				t.Fatalf("%s: n0 went through to a server it should not trust", name)
			}
		})
	}
}
