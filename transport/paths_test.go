package transport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// connect listens with one endpoint and dials with another, and checks the
// path the dial took.
func connect(t testing.TB, listen, dial *Endpoint, node, query string, want Path) (*Conn, *Conn) {
	t.Helper()
	svc := fmt.Sprintf("paths-%d-%d", os.Getpid(), serviceSeq.Add(1))
	l, err := listen.Listen(context.Background(), "ub:///"+svc)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	errc := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			errc <- err
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1, err := dial.Dial(ctx, "ub://"+node+"/"+svc+query)
	if err != nil {
		t.Fatal(err)
	}
	var c2 net.Conn
	select {
	case c2 = <-accepted:
	case err := <-errc:
		c1.Close()
		t.Fatal(err)
	}
	if c1.Path() != want || c2.(*Conn).Path() != want {
		t.Fatalf("paths %s and %s, want %s", c1.Path(), c2.(*Conn).Path(), want)
	}
	return c1, c2.(*Conn)
}

func dev4(t testing.TB, node string, cfg Config) *Endpoint {
	t.Helper()
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Node, cfg.Topology, cfg.Provider = node, topo, "sim"
	e, err := NewEndpoint(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// pathCases are the ways two endpoints can be joined: each path, and the
// ub path over each provider.
func pathCases(t *testing.T) map[string]func() (*Conn, *Conn) {
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]func() (*Conn, *Conn){
		"shm": func() (*Conn, *Conn) { return connect(t, def, def, "", "", PathShm) },
		// The tcp path's packets over the listener's unix socket, and
		// over loopback TCP when the listener opens a TCP socket.
		"tcp": func() (*Conn, *Conn) { return connect(t, def, def, "", "?path=tcp", PathTCP) },
		"tcp-loopback": func() (*Conn, *Conn) {
			ca := newTestCA(t, t.TempDir(), "ca")
			e, err := NewEndpoint(Config{Node: "n0", ListenTCP: true, Identity: ca.identity(t, "test", "n0")})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return connect(t, e, e, "", "?path=tcp", PathTCP)
		},
		"ub-tcp": func() (*Conn, *Conn) {
			e, err := NewEndpoint(Config{Provider: "tcp"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return connect(t, e, e, "", "?path=ub", PathUB)
		},
		// Two nodes of a simulated super node: the path is chosen.
		"ub-sim": func() (*Conn, *Conn) {
			return connect(t, dev4(t, "n0", Config{}), dev4(t, "n1", Config{}), "n0", "", PathUB)
		},
	}
}

func TestNetConnEveryPath(t *testing.T) {
	for name, mk := range pathCases(t) {
		t.Run(name, func(t *testing.T) {
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				a, b := mk()
				return a, b, func() { a.Close(); b.Close() }, nil
			})
		})
	}
}

// TestEveryPathCarriesEverything: stream bytes both ways, half-close,
// messages (one larger than a packet) and Close, on every path.
func TestEveryPathCarriesEverything(t *testing.T) {
	for name, mk := range pathCases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk()
			defer a.Close()
			defer b.Close()
			data := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16)
			go func() {
				a.Write(data)
				a.CloseWrite()
			}()
			got, err := io.ReadAll(b)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read %d of %d bytes: %v", len(got), len(data), err)
			}
			// Messages still flow after CloseWrite.
			for _, n := range []int{0, 1, 300 << 10} {
				m, err := a.Loan(n)
				if err != nil {
					t.Fatal(err)
				}
				for i := range m.Bytes() {
					m.Bytes()[i] = byte(i * 7)
				}
				if err := a.Send(m); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := b.Recv(ctx)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				if len(r.Bytes()) != n {
					t.Fatalf("message of %d bytes, want %d", len(r.Bytes()), n)
				}
				for i, c := range r.Bytes() {
					if c != byte(i*7) {
						t.Fatalf("message byte %d is %d", i, c)
					}
				}
				r.Release()
			}
			// The other way, then Close delivers what was written first.
			go func() {
				b.Write([]byte("last words"))
				b.Close()
			}()
			got, err = io.ReadAll(a)
			if string(got) != "last words" {
				t.Fatalf("read %q (%v)", got, err)
			}
		})
	}
}

// TestPathChoice: this node → shm, another node of the super node → ub,
// a node outside it → tcp; a forced path wins.
func TestPathChoice(t *testing.T) {
	n0 := dev4(t, "n0", Config{})
	for _, c := range []struct {
		addr string
		want Path
	}{
		{"ub:///s", PathShm},
		{"ub://n0/s", PathShm},
		{"ub://localhost/s", PathShm},
		{"ub://n3/s", PathUB},
		{"ub://elsewhere.example/s", PathTCP},
		{"ub://n3/s?path=tcp", PathTCP},
		{"ub:///s?path=ub", PathUB},
	} {
		a, err := ParseAddr(c.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := n0.choose(n0.resolve(a)); got != c.want {
			t.Errorf("%s: path %s, want %s", c.addr, got, c.want)
		}
	}
	forced := dev4(t, "n0", Config{Path: PathTCP})
	if got := forced.choose(forced.resolve(Addr{Node: "n3", Service: "s"})); got != PathTCP {
		t.Errorf("forced tcp: got %s", got)
	}
	if _, err := n0.Dial(context.Background(), "ub://n3/s?path=shm"); err == nil {
		t.Error("the shm path reached another node")
	}
	if _, err := ParseAddr("ub://n0/s?path=carrier-pigeon"); err == nil {
		t.Error("unknown path accepted")
	}
}

// TestRemoteRendezvous: two "hosts" (separate registries) find each other's
// services through the registry the topology names, on the tcp and ub
// paths.
func TestRemoteRendezvous(t *testing.T) {
	port := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	topo, err := topology.Parse([]byte(fmt.Sprintf(`name: two
nodes:
  - {name: ha, labels: {%[1]s: "%[2]s"}}
  - {name: hb, labels: {%[1]s: "%[3]s"}}
links:
  - {a: ha, b: hb, bandwidth: 10GB/s, latency: 5us}
`, LabelRegistry, port(), port())))
	if err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t, t.TempDir(), "ca")
	host := func(node string) *Endpoint {
		e, err := NewEndpoint(Config{Node: node, Topology: topo, Provider: "tcp", RuntimeDir: filepath.Join(t.TempDir(), node),
			Identity: ca.identity(t, "two", node)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	ha, hb := host("ha"), host("hb")
	l, err := ha.Listen(context.Background(), "ub:///svc")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveEach(l, func(c net.Conn) { io.Copy(c, c) })
	for _, c := range []struct {
		query string
		want  Path
	}{{"", PathUB}, {"?path=tcp", PathTCP}} {
		// The registry starts in the background, and nothing tells when
		// it listens: polling, with a hang guard.
		var conn *Conn
		for end := time.Now().Add(10 * time.Second); ; {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn, err = hb.Dial(ctx, "ub://ha/svc"+c.query)
			cancel()
			if err == nil || time.Now().After(end) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		if conn.Path() != c.want {
			t.Errorf("path %s, want %s", conn.Path(), c.want)
		}
		if _, err := conn.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("read %q: %v", buf, err)
		}
		conn.Close()
	}
	if _, err := hb.Dial(context.Background(), "ub://ha/nobody"); err == nil {
		t.Error("dialed a service nobody listens on")
	}
}

// TestSweep: a registry entry whose listener died is removed, a live one
// stays.
func TestSweep(t *testing.T) {
	e, err := NewEndpoint(Config{RuntimeDir: t.TempDir(), ListenTCP: true})
	if err != nil {
		t.Fatal(err)
	}
	live, err := e.Listen(context.Background(), "ub:///live")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead := e.socketPath(e.resolve(Addr{Service: "dead"}))
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: dead, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	os.WriteFile(e.tcpFile(e.resolve(Addr{Service: "dead"})), []byte("127.0.0.1:1\n"), 0o600)
	if n, err := e.Sweep(); n != 1 || err != nil {
		t.Fatalf("swept %d (%v), want 1", n, err)
	}
	left, _ := filepath.Glob(filepath.Join(e.nodeDir(e.Node()), "*"))
	if len(left) != 2 {
		t.Errorf("left %v, want the live service's socket and address", left)
	}
}

// serveEach runs fn on every connection l accepts, then closes it, until l
// closes.
func serveEach(l net.Listener, fn func(net.Conn)) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			fn(c)
			c.Close()
		}()
	}
}
