package meshsuite

import (
	"strconv"
	"strings"
	"context"
	"os"
	"runtime/trace"
	"testing"
	"time"
)

func TestExplore(t *testing.T) {
	mk := grpcPaths
	if os.Getenv("EXP_HTTP") != "" {
		mk = httpPaths
	}
	via, direct, stop, err := mk()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	for i := 0; i < 500; i++ {
		via()
		direct()
	}
	if f := os.Getenv("EXP_TRACE"); f != "" {
		w, _ := os.Create(f)
		trace.Start(w)
		defer func() { trace.Stop(); w.Close() }()
	}
	sysc := func() (int, int) {
		b, _ := os.ReadFile("/proc/self/io")
		var r, w int
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "syscr: ") {
				r, _ = strconv.Atoi(l[7:])
			}
			if strings.HasPrefix(l, "syscw: ") {
				w, _ = strconv.Atoi(l[7:])
			}
		}
		return r, w
	}
	for r := 0; r < 3; r++ {
		r0, w0 := sysc()
		var vs, ds []float64
		for start := time.Now(); time.Since(start) < time.Second; {
			var v time.Duration
			var err error
			if os.Getenv("EXP_NOVIA") == "" {
				trace.WithRegion(context.Background(), "via", func() { v, err = via() })
			}
			if err != nil {
				t.Fatal(err)
			}
			var w time.Duration
			if os.Getenv("EXP_NODIRECT") == "" {
				trace.WithRegion(context.Background(), "direct", func() { w, err = direct() })
				if err != nil {
					t.Fatal(err)
				}
			}
			vs, ds = append(vs, float64(v)), append(ds, float64(w))
		}
		r1, w1 := sysc()
		t.Logf("syscalls per iteration: read %.2f write %.2f", float64(r1-r0)/float64(len(vs)), float64(w1-w0)/float64(len(vs)))
		t.Logf("via p50 %.1f direct p50 %.1f added %.1f (n=%d)", percentile(vs, 50)/1e3, percentile(ds, 50)/1e3, (percentile(vs, 50)-percentile(ds, 50))/1e3, len(vs))
	}
}


func TestExploreBursts(t *testing.T) {
	mk := grpcPaths
	if os.Getenv("EXP_HTTP") != "" {
		mk = httpPaths
	}
	via, direct, stop, err := mk()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	gap, _ := time.ParseDuration(os.Getenv("EXP_GAP"))
	burst := 200 * time.Millisecond
	if b, err := time.ParseDuration(os.Getenv("EXP_BURST")); err == nil {
		burst = b
	}
	var vs, ds []float64
	for r := 0; r < 10; r++ {
		for _, p := range []struct {
			f   func() (time.Duration, error)
			out *[]float64
		}{{via, &vs}, {direct, &ds}} {
			for i := 0; i < 50; i++ {
				p.f()
			}
			for start := time.Now(); time.Since(start) < burst; {
				v, err := p.f()
				if err != nil {
					t.Fatal(err)
				}
				*p.out = append(*p.out, float64(v))
				if gap > 0 {
					time.Sleep(gap)
				}
			}
		}
	}
	t.Logf("bursts of %v gap %v: via p50 %.1f direct p50 %.1f added %.1f (n=%d/%d)", burst, gap, percentile(vs, 50)/1e3, percentile(ds, 50)/1e3, (percentile(vs, 50)-percentile(ds, 50))/1e3, len(vs), len(ds))
}
