package cachesuite

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/osproc"
)

// readers is how many reader processes pool-multi-process runs.
const readers = 2

// multiProcess: readers processes GET uniformly random keys, one at a
// time, from the filled pool (ubkit) or from redis-server over TCP; they
// warm up, then all start on one signal and run for d. The value is the
// sum of their rates.
func multiProcess(e *Env, kind string, d time.Duration) (bench.Measurement, error) {
	addr, done, err := serverAddr(e, kind)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer done()
	peers := make([]*bench.Peer, readers)
	outs := make([]*bufio.Reader, readers)
	defer func() {
		for _, p := range peers {
			if p != nil {
				p.Kill()
			}
		}
	}()
	for i := range peers {
		p, err := bench.StartPeerPipe("cache-reader", peerArgs{Kind: kind, Addr: addr, Seed: 40 + uint64(i), Duration: d})
		if err != nil {
			return bench.Measurement{}, err
		}
		peers[i], outs[i] = p, bufio.NewReader(p.Stdout())
	}
	for i, out := range outs {
		if line, err := out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
			return bench.Measurement{}, fmt.Errorf("cache-reader %d: %q, %v (%v)", i, line, err, peers[i].Wait())
		}
	}
	for _, p := range peers {
		if err := osproc.SignalStart(p.PID()); err != nil {
			return bench.Measurement{}, err
		}
	}
	var rate float64
	for i, out := range outs {
		r, err := readResult(peers[i], out)
		if err != nil {
			return bench.Measurement{}, fmt.Errorf("cache-reader %d: %w", i, err)
		}
		rate += float64(r.Ops) / (float64(r.NS) / 1e9)
	}
	return bench.Measurement{Value: rate}, nil
}

// readerPeer warms up for a tenth of d, says "ready", and on the start
// signal (osproc.SignalStart) GETs
// random keys for d, checking every value.
func readerPeer(a peerArgs) error {
	go1 := make(chan os.Signal, 1)
	osproc.NotifyStart(go1)
	g, err := newGetter(a.Kind, a.Addr)
	if err != nil {
		return err
	}
	defer g.close()
	r := rng(a.Seed, 0)
	var dst []byte
	get := func() error {
		k := r.IntN(Keys)
		v, err := g.get(k, dst)
		if err != nil {
			return err
		}
		dst = v[:0]
		return check(v, k)
	}
	for start := time.Now(); time.Since(start) < a.Duration/10; {
		if err := get(); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	select {
	case <-go1:
	case <-time.After(30 * time.Second):
		return errors.New("no start signal")
	}
	var n uint64
	start := time.Now()
	for time.Since(start) < a.Duration {
		for range checkEvery {
			if err := get(); err != nil {
				return err
			}
		}
		n += checkEvery
	}
	return report(peerResult{Ops: n, NS: int64(time.Since(start))})
}
