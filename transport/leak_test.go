package transport

import (
	"context"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/procstat"
)

// cycles is how many connections the leak tests make and close on each
// path.
const cycles = 1000

// leakSlack is what a path may hold after cycles connections beyond what
// it held after the first: a descriptor or goroutine of the runtime's, no
// shared memory to speak of, and 12 MiB more resident memory (before the
// fixes of issue 15 the ub path over the simulator grew by 85 MiB).
var leakSlack = procstat.Usage{FDs: 2, Shared: 2, Goroutines: 2, RSS: procstat.RSSSlack(12 << 20)}

// connectCloser makes a connection to a listener of the same process and
// closes it, a byte having gone each way.
type connectCloser struct {
	dial func(context.Context) (*Conn, error)
	l    *Listener
}

func newConnectCloser(t *testing.T, listen, dial *Endpoint, node, query string) *connectCloser {
	t.Helper()
	svc := fmt.Sprintf("leak-%d-%d", os.Getpid(), serviceSeq.Add(1))
	l, err := listen.Listen(context.Background(), "ub:///"+svc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	addr := "ub://" + node + "/" + svc + query
	return &connectCloser{l: l, dial: func(ctx context.Context) (*Conn, error) { return dial.Dial(ctx, addr) }}
}

func (cc *connectCloser) once(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1, err := cc.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := cc.l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b := []byte{1}
	if _, err := c1.Write(b); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c2, b); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Write(b); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c1, b); err != nil {
		t.Fatal(err)
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestConnectCloseReturnsEverything makes and closes cycles connections on
// every path (the ub path over the simulated super node, and over the tcp
// provider) and checks that descriptors, shared-memory mappings and
// goroutines come back to what they were after the first, and resident
// memory stays within rssSlack: Close releases both sides of a
// connection.
func TestConnectCloseReturnsEverything(t *testing.T) {
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T) *connectCloser
	}{
		{"shm", func(t *testing.T) *connectCloser { return newConnectCloser(t, def, def, "", "") }},
		{"tcp", func(t *testing.T) *connectCloser { return newConnectCloser(t, def, def, "", "?path=tcp") }},
		{"ub-sim", func(t *testing.T) *connectCloser {
			return newConnectCloser(t, dev4(t, "n0", Config{}), dev4(t, "n1", Config{}), "n0", "")
		}},
		{"ub-tcp", func(t *testing.T) *connectCloser {
			e, err := NewEndpoint(Config{Provider: "tcp"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return newConnectCloser(t, e, e, "", "?path=ub")
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cc := c.setup(t)
			cc.once(t) // the endpoints open what they keep (a ub context)
			before, err := procstat.Compact()
			if err != nil {
				t.Fatal(err)
			}
			for range cycles {
				cc.once(t)
			}
			after, err := procstat.Returned(before, leakSlack, 10*time.Second)
			if err != nil {
				t.Fatalf("%d connections made and closed: %v", cycles, err)
			}
			t.Logf("after the first connection: %v; after %d more: %v", before, cycles, after)
		})
	}
}
