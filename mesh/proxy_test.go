package mesh

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// proxies starts node proxies on n0, n1 and n2 of the simulated dev4 with
// an HTTP service "web" on n1, and returns each node's local listener for
// it, the nodes' endpoints, the mesh's CA and the backend's address. The
// proxies log to log, if it is not nil.
func proxies(t *testing.T, allow map[string][]string, log *slog.Logger) (web map[string]string, eps map[string]*transport.Endpoint, ca *CA, backendAddr string) {
	t.Helper()
	topo, _ := topology.Example("dev4")
	dir := t.TempDir()
	ca, err := NewCA("dev4", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "n1 served %s %s (%d bytes)", r.Method, r.URL.Path, len(body))
	})}
	bl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go backend.Serve(bl)
	t.Cleanup(func() { backend.Close() })
	reg, err := NewStaticRegistry([]Service{{Name: "web", Instances: []Instance{{Node: "n1", Address: bl.Addr().String()}}}})
	if err != nil {
		t.Fatal(err)
	}
	eps, web = map[string]*transport.Endpoint{}, map[string]string{}
	for _, n := range []string{"n0", "n1", "n2"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() })
		eps[n] = ep
		cert, err := ca.Issue(n, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		p, err := NewNodeProxy(context.Background(), ProxyConfig{Endpoint: ep, SuperNode: "dev4", Cert: cert, Roots: ca.Roots(), Registry: reg, Allow: allow, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		l, err := p.ListenService("web", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		web[n] = l.Addr().String()
	}
	return web, eps, ca, bl.Addr().String()
}

// TestNodeProxyHTTP: an application on n0 talks plain HTTP to its node's
// proxy; the request crosses to n1's proxy over the bus (mutual TLS) and
// reaches the backend there.
func TestNodeProxyHTTP(t *testing.T) {
	web, _, _, _ := proxies(t, nil, nil)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for i := range 3 {
		resp, err := client.Post("http://"+web["n0"]+"/hello", "text/plain", strings.NewReader(strings.Repeat("x", 1000*i)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("n1 served POST /hello (%d bytes)", 1000*i); string(b) != want {
			t.Fatalf("got %q, want %q", b, want)
		}
	}
}

// TestNodeProxyRefusals: a peer without the mesh CA's certificate is
// refused at the handshake, and a node not on a service's allow list is
// turned away.
func TestNodeProxyRefusals(t *testing.T) {
	log, rec := testenv.NewLogRecorder()
	web, eps, _, _ := proxies(t, map[string][]string{"web": {"n2"}}, log)
	// n2 is allowed to reach web...
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + web["n2"] + "/")
	if err != nil {
		t.Fatalf("from n2, on the allow list: %v", err)
	}
	resp.Body.Close()
	// ...n0 is not.
	c, err := net.Dial("tcp", web["n0"])
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.0\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, _ := io.ReadAll(c)
	c.Close()
	if len(b) != 0 {
		t.Fatalf("a node off the allow list got an answer: %q", b)
	}
	// Both proxies say why in their logs, which are the only place that
	// can: the application's connection just closes.
	rec.WaitFor(t, "level=WARN", "mesh: refused a hop", "node=n1", "from=n0", "node n0 may not reach web")
	rec.WaitFor(t, "level=WARN", "mesh: could not carry a connection", "node=n0", "service=web", "instance_node=n1")
	// A rogue with a certificate from another CA, straight at n1's proxy.
	rogueCA, _ := NewCA("dev4", time.Hour)
	cert, _ := rogueCA.Issue("n2", time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw, err := eps["n2"].Dial(ctx, "ub://n1/"+ProxyService)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(raw, &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	err = tc.Handshake()
	if err == nil {
		// TLS 1.3 clients learn of a refused certificate on their first read.
		fmt.Fprintf(tc, "web 127.0.0.1:1\n")
		_, err = tc.Read(make([]byte, 64))
	}
	tc.Close()
	if err == nil {
		t.Fatal("a peer with a certificate from another CA was let in")
	}
	t.Logf("rogue refused: %v", err)
	rec.WaitFor(t, "level=DEBUG", "mesh: a hop's handshake failed", "node=n1")
}

// TestNodeProxyHostileHops: a peer with a valid certificate of the mesh
// (n2's) sends n1's proxy request lines it must refuse, each on a hop of
// its own: malformed ones, an endpoint that is not the service's on n1
// (which would make the proxy a way into anything n1 reaches), an unknown
// service, and a line that never ends. Each gets a refusal or a closed
// hop, never a connection, a crash or a hang; a well-formed request on the
// same kind of hop is served, so the refusals are the requests'.
func TestNodeProxyHostileHops(t *testing.T) {
	_, eps, ca, backendAddr := proxies(t, nil, nil)
	cert, err := ca.Issue("n2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	hop := func(request string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		raw, err := eps["n2"].Dial(ctx, "ub://n1/"+ProxyService)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(raw, &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: ca.Roots(), InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
		defer tc.Close()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(tc, request); err != nil {
			return "", err
		}
		line, err := readLine(tc)
		if err == nil && line != "ok" {
			// Nothing follows a refusal: the proxy closes the hop.
			if n, rerr := tc.Read(make([]byte, 1)); n > 0 || !errors.Is(rerr, io.EOF) {
				t.Errorf("after %q the hop stayed open (%d, %v)", line, n, rerr)
			}
		}
		return line, err
	}
	if line, err := hop(formatHopRequest("web", backendAddr)); err != nil || line != "ok" {
		t.Fatalf("a well-formed request for web's endpoint on n1: %q, %v", line, err)
	}
	for _, c := range []struct{ request, want string }{
		{"garbage\n", "denied: malformed request"},
		{" 127.0.0.1:80\n", "denied: malformed request: service"},
		{"web \n", "denied: malformed request: address"},
		{"web 127.0.0.1\n", "denied: malformed request: address"},
		{"web 127.0.0.1:80 extra\n", "denied: malformed request: address"},
		{"we\x00b " + backendAddr + "\n", "denied: malformed request: service"},
		{"web 127.0.0.1:22\n", "denied: 127.0.0.1:22 is no endpoint of web on node n1"},
		{"web " + backendAddr + "0\n", "denied: "},
		{"nosuch " + backendAddr + "\n", "denied: " + backendAddr + " is no endpoint of nosuch on node n1"},
	} {
		line, err := hop(c.request)
		if err != nil || !strings.HasPrefix(line, c.want) {
			t.Errorf("request %q: got %q, %v; want %q...", c.request, line, err, c.want)
		}
	}
	// A line that never ends is cut off at 1 KiB.
	if line, err := hop(strings.Repeat("x", 4096)); err == nil {
		t.Errorf("an endless line got an answer: %q", line)
	}
}

// TestNodeProxyFromXDS: the proxies learn everything from the control plane
// over ADS: the listener to open for the service (LDS), the service's
// cluster and endpoints (CDS, EDS).
func TestNodeProxyFromXDS(t *testing.T) {
	topo, _ := topology.Example("dev4")
	dir := t.TempDir()
	ca, _ := NewCA("dev4", time.Hour)
	backend := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "n2 says hi") })}
	bl, _ := net.Listen("tcp", "127.0.0.1:0")
	go backend.Serve(bl)
	defer backend.Close()
	free, _ := net.Listen("tcp", "127.0.0.1:0")
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	reg, _ := NewStaticRegistry([]Service{{Name: "hello", ProxyPort: port, Instances: []Instance{{Node: "n2", Address: bl.Addr().String()}}}})
	cp := NewControlPlane(topo, reg)
	cl, _ := net.Listen("tcp", "127.0.0.1:0")
	go cp.Serve(cl)
	defer cp.Close()
	proxies := map[string]*NodeProxy{}
	for _, n := range []string{"n0", "n2"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		xr := newXDS(t, n, cl.Addr().String())
		defer xr.Close()
		select {
		case <-xr.Ready():
		case <-time.After(hangGuard):
			t.Fatal("no endpoints from the control plane")
		}
		cert, _ := ca.Issue(n, time.Hour)
		p, err := NewNodeProxy(context.Background(), ProxyConfig{Endpoint: ep, SuperNode: "dev4", Cert: cert, Roots: ca.Roots(), Registry: xr})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		proxies[n] = p
	}
	// n0's proxy opens the listener LDS names, on its own.
	want := fmt.Sprintf("127.0.0.1:%d", port)
	for end := time.Now().Add(hangGuard); proxies["n0"].Listening()["hello"] != want; {
		if time.Now().After(end) {
			t.Fatalf("n0's proxy listens on %v, want hello on %s", proxies["n0"].Listening(), want)
		}
		// Polling: the proxy takes the registry's changes, and nothing
		// else tells when it opened its listener.
		time.Sleep(5 * time.Millisecond)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + want + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "n2 says hi" {
		t.Fatalf("got %q", b)
	}
}

// FuzzHopRequest: any line parses without a crash, and one that parses is
// exactly what formatHopRequest makes of its parts, with an address that
// splits into host and port.
func FuzzHopRequest(f *testing.F) {
	for _, s := range []string{"web 127.0.0.1:8080", "web [::1]:80", "garbage", " x:1", "web ", "a b c:1", "we\x00b h:1", "web h:1\r"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		service, addr, err := parseHopRequest(line)
		if err != nil {
			return
		}
		if got := formatHopRequest(service, addr); got != line+"\n" {
			t.Fatalf("%q parsed as %q %q, which formats as %q", line, service, addr, got)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			t.Fatalf("%q: accepted address %q: %v", line, addr, err)
		}
	})
}
