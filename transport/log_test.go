package transport

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// TestListenerLogs: what a listener learns and no call returns goes to
// Config.Logger: each dialer it accepted, with the node it proved and the
// path (Debug), and each it refused (Warn). Nothing else prints it.
func TestListenerLogs(t *testing.T) {
	ca := newTestCA(t, t.TempDir(), "ca")
	log, rec := testenv.NewLogRecorder()
	e, err := NewEndpoint(Config{Node: "n0", RuntimeDir: t.TempDir(), ListenTCP: true, Identity: ca.identity(t, "test", "n0"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	l, err := e.Listen(context.Background(), "ub:///logged")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveEach(l, func(c net.Conn) { io.Copy(io.Discard, c) })

	c, err := e.Dial(context.Background(), "ub:///logged")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	rec.WaitFor(t, "level=DEBUG", "transport: accepted", "addr=ub://n0/logged", "path=shm")

	id, err := NewEndpoint(Config{Node: "n1", RuntimeDir: e.dir, Identity: ca.identity(t, "test", "n1")})
	if err != nil {
		t.Fatal(err)
	}
	defer id.Close()
	c, err = id.Dial(context.Background(), "ub://n0/logged?path=tcp")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	rec.WaitFor(t, "level=DEBUG", "transport: accepted", "addr=ub://n0/logged", `peer="ub://n1/`, "path=tcp")

	// A TCP dialer that does not prove its node is refused, and the log
	// says so and why.
	raw, err := net.Dial("tcp", strings.TrimSpace(string(readFile(t, l.tcpFile))))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte{helloTCP}); err != nil {
		t.Fatal(err)
	}
	io.ReadAll(raw) // the refusal, then the listener hangs up
	rec.WaitFor(t, "level=WARN", "transport: refused a dialer", "addr=ub://n0/logged", "did not authenticate")
}
