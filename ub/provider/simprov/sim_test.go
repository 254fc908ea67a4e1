package simprov_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// node is one simulated node's endpoint, with a segment and an RM jetty.
type node struct {
	c   ub.Context
	seg ub.Segment
	cq  ub.CQ
	j   ub.Jetty
}

func openNode(t *testing.T, name string) *node { return openNodeOver(t, name, "shm") }

// openNodeOver is openNode with the provider underneath the simulation.
// The nodes are dev4's, in this process's fabric (privateFabric).
func openNodeOver(t *testing.T, name, over string) *node {
	t.Helper()
	c, err := ub.Open(context.Background(), simprov.Name, ub.Config{Options: map[string]string{simprov.OptTopology: "dev4", simprov.OptNode: name, simprov.OptOver: over, simprov.OptFabric: privateFabric}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	seg, err := c.AllocSegment(1<<20, ub.SegmentConfig{Access: ub.AccessAtomic, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &node{c: c, seg: seg, cq: cq, j: j}
}

// write writes n bytes to dst and returns the completion and how long it
// took to arrive.
func (a *node) write(t *testing.T, dst ub.RemoteSegment, n int) (ub.Completion, time.Duration) {
	t.Helper()
	start := time.Now()
	if _, err := a.j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: a.seg, Len: n}, Remote: ub.Remote{Seg: dst}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]ub.Completion, 1)
	for {
		if err := a.cq.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if k, _ := a.cq.Poll(out); k == 1 {
			return out[0], time.Since(start)
		}
	}
}

func importSeg(t *testing.T, from, to *node) ub.RemoteSegment {
	t.Helper()
	r, err := from.c.ImportSegment(to.seg.Desc(), 1)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCostsAreHonoured checks that nothing arrives before the simulated
// path allows: a lower bound, which is correctness, not speed (how close
// the simulator gets to the configured figures is `ubctl bench ub`'s job).
func TestCostsAreHonoured(t *testing.T) {
	n0, n1 := openNode(t, "n0"), openNode(t, "n1")
	remote := importSeg(t, n0, n1)
	for _, size := range []int{64, 1 << 20} {
		// dev4 links: 20 µs and 5 GB/s.
		floor := 20*time.Microsecond + time.Duration(float64(size)/5e9*1e9)
		c, took := n0.write(t, remote, size)
		if c.Status != ub.StatusSuccess {
			t.Fatalf("write of %d bytes: %v", size, c.Status)
		}
		if took < floor {
			t.Errorf("write of %d bytes completed after %v, before the path allows (%v)", size, took, floor)
		}
	}
	// The same node: no link, no delay to honour, and it works.
	if c, _ := n0.write(t, importSeg(t, n0, n0), 64); c.Status != ub.StatusSuccess {
		t.Fatalf("write to self: %v", c.Status)
	}
}

// TestFaultsTouchOnlyTheirOperations takes a link down, slows one, crashes a
// node, and checks which operations notice.
func TestFaultsTouchOnlyTheirOperations(t *testing.T) {
	n0, n1, n2 := openNode(t, "n0"), openNode(t, "n1"), openNode(t, "n2")
	to1, to2 := importSeg(t, n0, n1), importSeg(t, n0, n2)
	f := n0.c.(*simprov.Context).Fabric()
	t.Cleanup(func() {
		f.SetLinkDown("n0", "n1", false)
		f.SetLinkSlow("n0", "n2", 1)
		f.SetNodeCrashed("n2", false)
	})

	if err := f.SetLinkDown("n0", "n1", true); err != nil {
		t.Fatal(err)
	}
	if c, _ := n0.write(t, to1, 64); c.Status != ub.StatusLinkDown {
		t.Errorf("write across the down link: %v, want link down", c.Status)
	}
	if c, _ := n0.write(t, to2, 64); c.Status != ub.StatusSuccess {
		t.Errorf("write over another link: %v", c.Status)
	}
	f.SetLinkDown("n0", "n1", false)
	if c, _ := n0.write(t, to1, 64); c.Status != ub.StatusSuccess {
		t.Errorf("write after the link came back: %v", c.Status)
	}

	if err := f.SetLinkSlow("n0", "n2", 10); err != nil {
		t.Fatal(err)
	}
	if c, took := n0.write(t, to2, 64); c.Status != ub.StatusSuccess || took < 200*time.Microsecond {
		t.Errorf("write over a 10x slower 20 µs link: %v after %v", c.Status, took)
	}
	f.SetLinkSlow("n0", "n2", 1)

	if err := f.SetNodeCrashed("n2", true); err != nil {
		t.Fatal(err)
	}
	if c, _ := n0.write(t, to2, 64); c.Status != ub.StatusPeerDead {
		t.Errorf("write to a crashed node: %v, want peer dead", c.Status)
	}
	if c, _ := n0.write(t, to1, 64); c.Status != ub.StatusSuccess {
		t.Errorf("write to a live node while another is down: %v", c.Status)
	}
	for _, bad := range [][2]string{{"n0", "nope"}, {"n0", "n0"}} {
		if err := f.SetLinkDown(bad[0], bad[1], true); err == nil {
			t.Errorf("SetLinkDown(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestOpenErrors(t *testing.T) {
	for name, opts := range map[string]map[string]string{
		"unknown node":    {simprov.OptTopology: "dev4", simprov.OptNode: "n9"},
		"unknown topo":    {simprov.OptTopology: "/no/such/file.yaml", simprov.OptNode: "n0"},
		"sim over itself": {simprov.OptTopology: "dev4", simprov.OptNode: "n0", simprov.OptOver: "sim"},
	} {
		if c, err := ub.Open(context.Background(), simprov.Name, ub.Config{Options: opts}); err == nil {
			c.Close()
			t.Errorf("%s: opened", name)
		}
	}
}

// TestOpenNode: ub.OpenNode plays the node and topology it is given, even
// a topology that is no example and no file, and refuses options that
// say otherwise.
func TestOpenNode(t *testing.T) {
	dev4, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	custom := *dev4
	custom.Name = "made-in-code"
	for _, topo := range []*topology.Topology{dev4, &custom} {
		c, err := ub.OpenNode(context.Background(), simprov.Name, topo, "n2", ub.Config{Options: map[string]string{simprov.OptFabric: privateFabric}})
		if err != nil {
			t.Fatalf("%s: %v", topo.Name, err)
		}
		sc := c.(*simprov.Context)
		if sc.Node() != "n2" || sc.Topology() != topo {
			t.Errorf("plays %q of %q, want n2 of %q", sc.Node(), sc.Topology().Name, topo.Name)
		}
		c.Close()
	}
	for _, opt := range []string{simprov.OptNode, simprov.OptTopology} {
		c, err := ub.OpenNode(context.Background(), simprov.Name, dev4, "n2", ub.Config{Options: map[string]string{opt: "n1", simprov.OptFabric: privateFabric}})
		if err == nil {
			c.Close()
			t.Errorf("OpenNode with Options[%q] set: opened", opt)
		} else if !strings.Contains(err.Error(), "leave it unset") {
			t.Errorf("OpenNode with Options[%q] set: %v", opt, err)
		}
	}
	if c, err := ub.OpenNode(context.Background(), simprov.Name, dev4, "n9", ub.Config{}); err == nil {
		c.Close()
		t.Error("OpenNode of a node dev4 lacks: opened")
	}
}

// A completion the sim decides itself (here a fault) ends every wait in
// progress on its queue, though the provider underneath knows nothing of
// it: waits asleep on the inner queue's bell and on its futex alike.
func TestOwnCompletionEndsEveryWait(t *testing.T) {
	for _, over := range []string{"shm", "tcp"} {
		t.Run(over, func(t *testing.T) {
			n0, n1 := openNodeOver(t, "n0", over), openNodeOver(t, "n1", over)
			to1 := importSeg(t, n0, n1)
			f := n0.c.(*simprov.Context).Fabric()
			t.Cleanup(func() { f.SetLinkDown("n0", "n1", false) })
			if err := f.SetLinkDown("n0", "n1", true); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			errs := make(chan error, 3)
			for range 3 {
				go func() { errs <- n0.cq.Wait(ctx) }()
			}
			testenv.WaitParked(t, 3, "", "simprov.(*cq).WaitInterrupt(")
			if _, err := n0.j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: n0.seg, Len: 64}, Remote: ub.Remote{Seg: to1}}}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if err := <-errs; err != nil {
					t.Fatalf("a wait did not end on the sim's own completion: %v", err)
				}
			}
			out := make([]ub.Completion, 2)
			if k, _ := n0.cq.Poll(out); k != 1 || out[0].Status != ub.StatusLinkDown {
				t.Fatalf("Poll: %d completions %v, want one link down", k, out[:k])
			}
		})
	}
}

// Simulations of one topology under different fabric names share no
// faults, and a fabric name that could leave the shared-memory directory
// is refused.
func TestFabricNames(t *testing.T) {
	n0, n1 := openNode(t, "n0"), openNode(t, "n1")
	to1 := importSeg(t, n0, n1)
	other, err := ub.Open(context.Background(), simprov.Name, ub.Config{Options: map[string]string{simprov.OptTopology: "dev4", simprov.OptNode: "n0", simprov.OptFabric: privateFabric + "-other"}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	f := other.(*simprov.Context).Fabric()
	defer f.Remove()
	if err := f.SetLinkDown("n0", "n1", true); err != nil {
		t.Fatal(err)
	}
	if c, _ := n0.write(t, to1, 64); c.Status != ub.StatusSuccess {
		t.Fatalf("a fault in another fabric reached this one: %v", c.Status)
	}
	for _, bad := range []string{"../x", "a/b", strings.Repeat("x", 65)} {
		if c, err := ub.Open(context.Background(), simprov.Name, ub.Config{Options: map[string]string{simprov.OptTopology: "dev4", simprov.OptNode: "n0", simprov.OptFabric: bad}}); err == nil {
			c.Close()
			t.Errorf("fabric name %q accepted", bad)
		}
	}
}
