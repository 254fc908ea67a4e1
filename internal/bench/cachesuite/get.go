package cachesuite

import (
	"time"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/internal/bench"
)

// serverAddr returns where a client of kind finds the data: a filled pool
// (made now; done removes it) or a filled server of env.
func serverAddr(e *Env, kind string) (addr string, done func(), err error) {
	switch kind {
	case "ubkit":
		name := poolName()
		p, err := filledPool(name)
		if err != nil {
			return "", nil, err
		}
		return name, func() { p.Close(); cache.Remove(name) }, nil
	case "memcached":
		s, err := e.Memcached()
		if err != nil {
			return "", nil, err
		}
		return s.Addr, func() {}, nil
	}
	s, err := e.Redis()
	if err != nil {
		return "", nil, err
	}
	if kind == "redis-unix" {
		return s.Socket, func() {}, nil
	}
	return s.Addr, func() {}, nil
}

// getLatency: this process holds the data (fills the pool, or the server
// was filled); a client process GETs one key at a time for d, timing
// each GET and checking each value, and reports p50 and p99.
func getLatency(e *Env, kind string, d time.Duration) (bench.Measurement, error) {
	addr, done, err := serverAddr(e, kind)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer done()
	p, err := bench.StartPeerPipe("cache-get", peerArgs{Kind: kind, Addr: addr, Seed: 1, Duration: d})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer p.Kill()
	r, err := readResult(p, p.Stdout())
	if err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: r.P50, P50: r.P50, P99: r.P99}, nil
}

// getPeer is the client of pool-get-64B: after a tenth of d unmeasured,
// GETs of uniformly random keys for d, each timed from before the request
// to after its value's checksum.
func getPeer(a peerArgs) error {
	g, err := newGetter(a.Kind, a.Addr)
	if err != nil {
		return err
	}
	defer g.close()
	r := rng(a.Seed, 0)
	dst := make([]byte, 0, ValueSize)
	get := func(k int) error {
		_, err := g.getChecked(k, dst)
		return err
	}
	for start := time.Now(); time.Since(start) < a.Duration/10; {
		if err := get(r.IntN(Keys)); err != nil {
			return err
		}
	}
	h := new(hist)
	start := time.Now()
	for {
		k := r.IntN(Keys)
		t0 := time.Now()
		if t0.Sub(start) >= a.Duration {
			break
		}
		if err := get(k); err != nil {
			return err
		}
		h.add(int64(time.Since(t0)))
	}
	return report(peerResult{Ops: h.n, NS: int64(time.Since(start)), P50: h.quantile(0.5), P99: h.quantile(0.99)})
}
