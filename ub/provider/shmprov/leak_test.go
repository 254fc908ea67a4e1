package shmprov

import (
	"context"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/leaktest"
)

// TestCloseReturnsEverything: connections made and closed between two
// long-lived contexts leave neither descriptors nor mappings behind (the
// peer's segments a sender mapped to deliver into go with its target),
// and the contexts hold nothing of them.
func TestCloseReturnsEverything(t *testing.T) {
	a, b := openForTest(t), openForTest(t)
	before, after := leaktest.Cycle(t, a, b, 200)
	t.Logf("before %v; after 200 connections %v", before, after)
	for _, c := range []*Context{a, b} {
		c.mu.Lock()
		n := c.objects.Len()
		c.mu.Unlock()
		if n != 0 {
			t.Errorf("the context still holds %d closed objects", n)
		}
	}
}

func openForTest(t *testing.T) *Context {
	t.Helper()
	c, err := provider{}.Open(context.Background(), ub.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*Context)
}
