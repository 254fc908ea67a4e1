package simprov

import (
	"context"
	"fmt"
	"os"
	"runtime"
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
			leaktest.Cycle(t, a, b, 200)
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

// TestHeldQueue: held-back operations come out in order; the queue takes
// queueDepth of them and no more, and one that never empties (the
// scheduler always a little behind) stays within twice that.
func TestHeldQueue(t *testing.T) {
	h := held{wake: make(chan struct{}, 1)}
	if cap(h.ops) != 0 {
		t.Fatal("an empty queue holds memory")
	}
	next, want := uint64(0), uint64(0)
	push := func(n int) {
		for range n {
			if !h.push(scheduled{ctx: next}) {
				t.Fatalf("push %d refused", next)
			}
			next++
		}
	}
	pop := func(n int) {
		for range n {
			s, ok := h.pop()
			if !ok || s.ctx != want {
				t.Fatalf("pop: %d, %v; want %d", s.ctx, ok, want)
			}
			want++
		}
	}
	push(queueDepth)
	if h.push(scheduled{}) {
		t.Fatalf("a queue holding %d took one more", queueDepth)
	}
	pop(queueDepth)
	push(100)
	for range 10 * queueDepth / 7 {
		push(7)
		pop(7)
	}
	if c := cap(h.ops); c > 2*queueDepth {
		t.Fatalf("a queue holding at most %d grew to %d", queueDepth, c)
	}
	pop(int(next - want))
	if _, ok := h.pop(); ok {
		t.Fatal("popped from an empty queue")
	}
}

// TestObjectsCostLittleMemory: a connection side's queues and jetties (3
// and 2, as the transport's ub path makes them) allocate what they hold,
// not their full depth up front: that was 2.3 MB a side, which every
// connection paid, and the collector scanned.
func TestObjectsCostLittleMemory(t *testing.T) {
	c, err := ub.Open(context.Background(), Name, ub.Config{Options: map[string]string{
		OptTopology: "dev4", OptNode: "n0", OptFabric: fmt.Sprintf("simleak-%d", os.Getpid())}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer c.(*Context).Fabric().Remove()
	side := func() {
		var qs [3]ub.CQ
		for i := range qs {
			if qs[i], err = c.NewCQ(ub.CQConfig{}); err != nil {
				t.Fatal(err)
			}
		}
		j1, err := c.NewJetty(ub.JettyConfig{Mode: ub.ReliableConnection, SendCQ: qs[0], RecvCQ: qs[1]})
		if err != nil {
			t.Fatal(err)
		}
		j2, err := c.NewJetty(ub.JettyConfig{SendCQ: qs[2], RecvCQ: qs[2]})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range []interface{ Close() error }{j1, j2, qs[0], qs[1], qs[2]} {
			o.Close()
		}
	}
	side()
	const n = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		side()
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("a connection side's queues and jetties allocate %d KiB", per>>10)
	if per > 256<<10 {
		t.Fatalf("a connection side's queues and jetties allocate %d KiB", per>>10)
	}
}

// TestNewJettyRacesClose: a Close that runs while NewJetty is making a
// jetty (after the jetty underneath exists, before it is recorded) makes
// NewJetty fail with the context closed, and leaves neither the jetty's
// scheduler nor the jetty underneath behind (it once wrote into the
// emptied jetty set: a panic).
func TestNewJettyRacesClose(t *testing.T) {
	for _, over := range []string{"shm", "tcp"} {
		t.Run(over, func(t *testing.T) {
			c, err := ub.Open(context.Background(), Name, ub.Config{Options: map[string]string{
				OptTopology: "dev4", OptNode: "n0", OptOver: over, OptFabric: fmt.Sprintf("simrace-%d", os.Getpid())}})
			if err != nil {
				t.Fatal(err)
			}
			sc := c.(*Context)
			defer sc.Fabric().Remove()
			cq, err := c.NewCQ(ub.CQConfig{})
			if err != nil {
				t.Fatal(err)
			}
			goroutines := runtime.NumGoroutine()
			closed := make(chan error, 1)
			testHookNewJetty = func(*Context) { closed <- c.Close() }
			defer func() { testHookNewJetty = nil }()
			j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			if err == nil {
				j.Close()
				t.Fatal("NewJetty succeeded on a context closed meanwhile")
			}
			t.Logf("NewJetty: %v", err)
			if n := runtime.NumGoroutine(); n > goroutines {
				t.Errorf("%d goroutines after the refused jetty, from %d", n, goroutines)
			}
		})
	}
}
