package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func simCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(out)
	topo := fs.String("topology", "", "topology: a shipped example (laptop, dev4, cm384) or a file (default UB_TOPOLOGY)")
	fabric := fs.String("fabric", "", "the simulation's shared state, as named by its processes' \"fabric\" option (default: the topology's)")
	var down, slow, crash, up listFlag
	fs.Var(&down, "link-down", "take the link A-B down (repeatable)")
	fs.Var(&up, "link-up", "bring the link A-B back up (repeatable)")
	fs.Var(&slow, "slow", "make link A-B FACTOR times slower, as A-B=FACTOR (repeatable; 1 restores)")
	fs.Var(&crash, "crash", "mark a node crashed (repeatable)")
	clearAll := fs.Bool("clear", false, "clear every fault first")
	hold := fs.Bool("hold", false, "keep running until interrupted, then remove the simulation's shared state")
	probe := fs.Bool("probe", true, "measure this host and say which links it cannot honour")
	if err := fs.Parse(args); err != nil {
		return err
	}
	t, err := loadTopo(*topo)
	if err != nil {
		return err
	}
	f, err := simprov.OpenFabricNamed(t, *fabric)
	if err != nil {
		return err
	}
	defer f.Close()
	if *clearAll {
		for _, l := range t.Links {
			f.SetLinkDown(l.A, l.B, false)
			f.SetLinkSlow(l.A, l.B, 1)
		}
		for _, n := range t.Nodes {
			f.SetNodeCrashed(n.Name, false)
		}
	}
	pair := func(s string) (string, string, error) {
		a, b, ok := strings.Cut(s, "-")
		if !ok {
			return "", "", fmt.Errorf("link %q: want A-B", s)
		}
		return a, b, nil
	}
	for _, s := range down {
		a, b, err := pair(s)
		if err == nil {
			err = f.SetLinkDown(a, b, true)
		}
		if err != nil {
			return err
		}
	}
	for _, s := range up {
		a, b, err := pair(s)
		if err == nil {
			err = f.SetLinkDown(a, b, false)
		}
		if err != nil {
			return err
		}
	}
	for _, s := range slow {
		link, factor, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("-slow %q: want A-B=FACTOR", s)
		}
		x, err := strconv.ParseFloat(factor, 64)
		if err != nil {
			return fmt.Errorf("-slow %q: %w", s, err)
		}
		a, b, err := pair(link)
		if err == nil {
			err = f.SetLinkSlow(a, b, x)
		}
		if err != nil {
			return err
		}
	}
	for _, n := range crash {
		if err := f.SetNodeCrashed(n, true); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "simulated super node %q: %d nodes, %d links (shared state in /dev/shm)\n", t.Name, len(t.Nodes), len(t.Links))
	var host hostLimits
	if *probe {
		if host, err = probeHost(); err != nil {
			return fmt.Errorf("probe this host: %w", err)
		}
		fmt.Fprintf(out, "this host under it: %v per small write, %.1f GB/s per 1 MiB write (shm provider)\n", host.latency.Round(time.Nanosecond), host.bandwidth/1e9)
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "link\tlatency\tbandwidth\tstate\t")
	for _, l := range t.Links {
		state := f.LinkState(l.A, l.B)
		if *probe {
			if l.Latency > 0 && l.Latency < host.latency {
				state += fmt.Sprintf("; latency below this host's %v: not reached", host.latency.Round(time.Nanosecond))
			}
			if l.Bandwidth > host.bandwidth {
				state += fmt.Sprintf("; bandwidth above this host's %.1f GB/s: not reached", host.bandwidth/1e9)
			}
		}
		fmt.Fprintf(tw, "%s-%s\t%v\t%s\t%s\t\n", l.A, l.B, l.Latency, topology.FormatBandwidth(l.Bandwidth), state)
	}
	tw.Flush()
	fmt.Fprintf(out, "\nrun a node's process with UB_TOPOLOGY=%s UB_NODE=<node> and ub.Open(ctx, \"sim\", ...)\n", topoRef(*topo))
	if !*hold {
		return nil
	}
	fmt.Fprintln(out, "holding; interrupt to remove the simulation's shared state")
	sig := make(chan os.Signal, 1)
	osproc.NotifyStop(sig)
	<-sig
	return f.Remove()
}

func topoRef(s string) string {
	if s == "" {
		return "$UB_TOPOLOGY"
	}
	if _, err := topology.Example(s); err == nil {
		return "example:" + s
	}
	return s
}

func loadTopo(s string) (*topology.Topology, error) {
	if s == "" {
		return topology.FromEnv()
	}
	if t, err := topology.Example(s); err == nil {
		return t, nil
	}
	return topology.Load(s)
}

type hostLimits struct {
	latency   time.Duration
	bandwidth float64
}

// probeHost measures what the shm provider does on this host: a 64-byte
// write and 1 MiB writes, in one process.
func probeHost() (hostLimits, error) {
	c, err := ub.Open(context.Background(), "shm", ub.Config{})
	if err != nil {
		return hostLimits{}, err
	}
	defer c.Close()
	seg, err := c.AllocSegment(2<<20, ub.SegmentConfig{Access: ub.AccessWrite, Token: 1})
	if err != nil {
		return hostLimits{}, err
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		return hostLimits{}, err
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return hostLimits{}, err
	}
	r, err := c.ImportSegment(seg.Desc(), 1)
	if err != nil {
		return hostLimits{}, err
	}
	comp := make([]ub.Completion, 1)
	timeOf := func(n, rounds int) (time.Duration, error) {
		wr := []ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: seg, Len: n}, Remote: ub.Remote{Seg: r, Offset: 1 << 20}}}
		start := time.Now()
		for range rounds {
			if _, err := j.PostSend(wr); err != nil {
				return 0, err
			}
			if k, _ := cq.Poll(comp); k != 1 || comp[0].Status != ub.StatusSuccess {
				return 0, errors.New("probe write failed")
			}
		}
		return time.Since(start) / time.Duration(rounds), nil
	}
	lat, err := timeOf(64, 20000)
	if err != nil {
		return hostLimits{}, err
	}
	big, err := timeOf(1<<20, 200)
	if err != nil {
		return hostLimits{}, err
	}
	return hostLimits{latency: lat, bandwidth: float64(1<<20) / big.Seconds()}, nil
}
