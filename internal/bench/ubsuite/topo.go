package ubsuite

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// The topology cases: loading the CloudMatrix384-shaped topology in a fresh
// process (time and resident memory), and path-cost queries on it. Their
// baseline "limit" is the bound the topology must stay within (1 s, 1 GiB,
// 1 million queries/s).

func topoCases() []bench.Case {
	limit := func(v float64) bench.Contender {
		return bench.Contender{Name: "limit", Role: bench.Limit, Run: func(time.Duration) (bench.Measurement, error) { return bench.Measurement{Value: v}, nil }}
	}
	return []bench.Case{
		{Name: "cm384-load", Unit: "ms", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(time.Duration) (bench.Measurement, error) { return loadCM384(false) }}, limit(1000)}},
		{Name: "cm384-rss", Unit: "MiB", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(time.Duration) (bench.Measurement, error) { return loadCM384(true) }}, limit(1024)}},
		{Name: "pathcost", Unit: "queries/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: pathCostRate}, limit(1e6)}},
	}
}

type loadReport struct {
	Millis float64 `json:"ms"`
	RSSMiB float64 `json:"rssMiB"`
	Nodes  int     `json:"nodes"`
}

func init() {
	bench.RegisterPeer("cm384-load", func(json.RawMessage) error {
		start := time.Now()
		t, err := topology.Example("cm384")
		if err != nil {
			return err
		}
		el := time.Since(start)
		runtime.KeepAlive(t)
		rss, err := residentMiB()
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(loadReport{Millis: float64(el) / 1e6, RSSMiB: rss, Nodes: len(t.Nodes)})
	})
}

// residentMiB reads this process's resident set size from /proc.
func residentMiB() (float64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/self/status")
}

// loadCM384 loads the topology in a fresh process and reports the time or
// the resident memory afterwards (the whole process, runtime included).
func loadCM384(rss bool) (bench.Measurement, error) {
	p, err := bench.StartPeerPipe("cm384-load", nil)
	if err != nil {
		return bench.Measurement{}, err
	}
	var r loadReport
	err = json.NewDecoder(p.Stdout()).Decode(&r)
	p.Wait()
	if err != nil {
		return bench.Measurement{}, fmt.Errorf("cm384-load peer: %w", err)
	}
	if r.Nodes < 48 {
		return bench.Measurement{}, fmt.Errorf("cm384 has %d nodes", r.Nodes)
	}
	if rss {
		return bench.Measurement{Value: r.RSSMiB}, nil
	}
	return bench.Measurement{Value: r.Millis}, nil
}

// pathCostRate asks for path costs between random node pairs of cm384.
func pathCostRate(d time.Duration) (bench.Measurement, error) {
	t, err := topology.Example("cm384")
	if err != nil {
		return bench.Measurement{}, err
	}
	n := len(t.Nodes)
	rng := rand.New(rand.NewPCG(1, 2))
	pairs := make([][2]int, 4096)
	for i := range pairs {
		pairs[i] = [2]int{rng.IntN(n), rng.IntN(n)}
	}
	var sink time.Duration
	q := 0
	start := time.Now()
	for time.Since(start) < d {
		for _, p := range pairs {
			sink += t.PathCostIdx(p[0], p[1], int64(q&1)<<20).Transfer
			q++
		}
	}
	el := time.Since(start)
	if sink < 0 {
		return bench.Measurement{}, fmt.Errorf("negative path cost")
	}
	return bench.Measurement{Value: float64(q) / el.Seconds()}, nil
}
