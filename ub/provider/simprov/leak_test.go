package simprov

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/leaktest"
)

// TestCloseReturnsEverything: connections made and closed between two
// nodes' long-lived contexts, over either provider underneath, leave no
// descriptors, mappings or goroutines behind, and the contexts hold none
// of their jetties (each with its scheduler's queue).
func TestCloseReturnsEverything(t *testing.T) {
	for _, over := range []string{"shm", "tcp"} {
		t.Run(over, func(t *testing.T) {
			open := func(node string) *Context {
				c, err := ub.Open(context.Background(), Name, ub.Config{Options: map[string]string{
					OptTopology: "dev4", OptNode: node, OptOver: over, OptFabric: fmt.Sprintf("simleak-%d", os.Getpid())}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c.(*Context)
			}
			a, b := open("n0"), open("n1")
			t.Cleanup(func() { a.Fabric().Remove() })
			before, after := leaktest.Cycle(t, a, b, 200)
			t.Logf("before %v; after 200 connections %v", before, after)
			for _, c := range []*Context{a, b} {
				c.mu.Lock()
				n := len(c.jets)
				c.mu.Unlock()
				if n != 0 {
					t.Errorf("node %s's context still holds %d closed jetties", c.node, n)
				}
			}
		})
	}
}
