package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// demoSim opens the four nodes of the dev4 simulated super node in this
// process and shows one-sided writes crossing it at the configured costs,
// then a fault.
func demoSim(w io.Writer) error {
	t, err := topology.Example("dev4")
	if err != nil {
		return err
	}
	type node struct {
		c   ub.Context
		seg ub.Segment
	}
	nodes := map[string]node{}
	// A fabric of the demo's own: the fault it injects below must not reach
	// other simulations of dev4 on this host.
	fabric := fmt.Sprintf("demo-%d", os.Getpid())
	for _, n := range []string{"n0", "n1", "n2", "n3"} {
		c, err := ub.Open(context.Background(), simprov.Name, ub.Config{Options: map[string]string{simprov.OptTopology: "dev4", simprov.OptNode: n, simprov.OptFabric: fabric}})
		if err != nil {
			return err
		}
		defer c.Close()
		seg, err := c.AllocSegment(2<<20, ub.SegmentConfig{Access: ub.AccessWrite, Token: 7})
		if err != nil {
			return err
		}
		nodes[n] = node{c, seg}
	}
	src := nodes["n0"]
	f := src.c.(*simprov.Context).Fabric()
	// The simulation's shared state goes when the demo ends.
	defer f.Remove()
	cq, err := src.c.NewCQ(ub.CQConfig{})
	if err != nil {
		return err
	}
	j, err := src.c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	write := func(to string, size int) (ub.Completion, time.Duration, error) {
		r, err := src.c.ImportSegment(nodes[to].seg.Desc(), 7)
		if err != nil {
			return ub.Completion{}, 0, err
		}
		defer r.Close()
		best := time.Duration(1 << 62)
		var comp ub.Completion
		for range 5 {
			start := time.Now()
			if _, err := j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: src.seg, Len: size}, Remote: ub.Remote{Seg: r}}}); err != nil {
				return ub.Completion{}, 0, err
			}
			out := make([]ub.Completion, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for {
				if err := cq.Wait(ctx); err != nil {
					cancel()
					return ub.Completion{}, 0, err
				}
				if n, _ := cq.Poll(out); n == 1 {
					break
				}
			}
			cancel()
			comp = out[0]
			best = min(best, time.Since(start))
		}
		return comp, best, nil
	}
	fmt.Fprintf(w, "\na simulated 4-node super node (dev4: every link %v, %s), this process playing all four nodes:\n",
		t.Links[0].Latency, topology.FormatBandwidth(t.Links[0].Bandwidth))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "write\tsize\tconfigured\tmeasured (best of 5)\tstatus\t")
	for _, to := range []string{"n1", "n2", "n3"} {
		for _, size := range []int{64, 1 << 20} {
			cost, err := t.PathCost("n0", to, int64(size))
			if err != nil {
				return err
			}
			comp, took, err := write(to, size)
			if err != nil {
				return err
			}
			fmt.Fprintf(tw, "n0 -> %s\t%s\t%v\t%v\t%v\t\n", to, topology.FormatBytes(int64(size)), cost.Transfer.Round(100*time.Nanosecond), took.Round(100*time.Nanosecond), comp.Status)
		}
	}
	tw.Flush()
	if err := f.SetLinkDown("n0", "n3", true); err != nil {
		return err
	}
	defer f.SetLinkDown("n0", "n3", false)
	c3, _, err := write("n3", 64)
	if err != nil {
		return err
	}
	c1, _, err := write("n1", 64)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "with link n0-n3 down: a write to n3 completes with %q, a write to n1 with %q\n", c3.Status, c1.Status)
	return nil
}
