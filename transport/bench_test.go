package transport

import (
	"io"
	"testing"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// simEcho connects node01 to an echo on node00 of the simulated cm384
// (links of 1 µs), in this process, over the ub path.
func simEcho(tb testing.TB) *Conn {
	tb.Helper()
	topo, err := topology.Example("cm384")
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	mk := func(n string) *Endpoint {
		e, err := NewEndpoint(Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { e.Close() })
		return e
	}
	a, c := connect(tb, mk("node00"), mk("node01"), "node00", "", PathUB)
	tb.Cleanup(func() { c.Close(); a.Close() })
	go io.Copy(a, a)
	return c
}

// BenchmarkUBEchoSim is a 1 KB round trip over the ub path between two
// nodes of the simulated cm384 (links of 1 µs), in this process.
func BenchmarkUBEchoSim(b *testing.B) {
	c := simEcho(b)
	buf := make([]byte, 1024)
	b.SetBytes(2 * int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// TestUBPathAllocations bounds what a round trip of 1 KiB each way over the
// ub path (the sim provider over shm) allocates in steady state: each
// packet used to allocate its work requests, a completion array, the
// receive's segment name and a wake-up channel (15 objects a round trip, 20
// with the race detector); now mostly the waits that sleep do.
func TestUBPathAllocations(t *testing.T) {
	c := simEcho(t)
	buf := make([]byte, 1024)
	roundTrip := func() {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
	}
	for range 100 {
		roundTrip()
	}
	// Both goroutines of the round trip count (the echo's too). The race
	// detector's build allocates a few more.
	want := 4.0
	if raceEnabled {
		want = 8
	}
	if n := testing.AllocsPerRun(2000, roundTrip); n > want {
		t.Errorf("a round trip allocates %.1f objects, want at most %.0f", n, want)
	} else {
		t.Logf("a round trip allocates %.1f objects", n)
	}
}
