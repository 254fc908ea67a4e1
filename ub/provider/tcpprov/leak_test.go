package tcpprov

import (
	"context"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/leaktest"
)

// TestCloseReturnsEverything: connections made and closed between two
// long-lived contexts leave no descriptors, mappings or goroutines
// behind, and the contexts hold nothing of them; the connection between
// the contexts is the one thing kept, and a peer that goes away takes it
// along.
func TestCloseReturnsEverything(t *testing.T) {
	a, b := openContext(t), openContext(t)
	leaktest.Cycle(t, a, b, 200)
	for _, c := range []*Context{a, b} {
		c.mu.Lock()
		n, conns := c.objects.Len(), len(c.conns)
		c.mu.Unlock()
		if n != 0 || conns != 1 {
			t.Errorf("the context holds %d closed objects and %d connections to peers, want none and 1", n, conns)
		}
	}
	// b goes away: a's connection to it breaks, and a forgets it.
	b.Close()
	deadline := time.Now().Add(hangGuard)
	for {
		a.mu.Lock()
		conns := len(a.conns)
		a.mu.Unlock()
		if conns == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a still holds %d connections to a peer that closed", conns)
		}
		// Polling: nothing tells when a has dropped the connection.
		time.Sleep(10 * time.Millisecond)
	}
}

// openContext opens a context that the test closes at its end.
func openContext(t *testing.T) *Context {
	t.Helper()
	c, err := provider{}.Open(context.Background(), ub.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*Context)
}
