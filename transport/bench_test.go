package transport

import (
	"context"
	"fmt"
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

// packetPair connects two endpoints over a packet path: "tcp" (loopback)
// or "ub-sim" (two nodes of the simulated dev4).
func packetPair(b *testing.B, path string) (*Conn, *Conn) {
	b.Helper()
	var a, c *Conn
	switch path {
	case "tcp":
		def, err := Default()
		if err != nil {
			b.Fatal(err)
		}
		a, c = connect(b, def, def, "", "?path=tcp", PathTCP)
	case "ub-sim":
		a, c = connect(b, dev4(b, "n0", Config{}), dev4(b, "n1", Config{}), "n0", "", PathUB)
	}
	b.Cleanup(func() { c.Close(); a.Close() })
	return a, c
}

// BenchmarkPacketStream is a one-way stream of 64 KiB writes over the tcp
// and ub paths, every byte read by the other side.
func BenchmarkPacketStream(b *testing.B) {
	for _, path := range []string{"tcp", "ub-sim"} {
		b.Run(path, func(b *testing.B) {
			a, c := packetPair(b, path)
			done := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.Discard, a)
				done <- err
			}()
			buf := make([]byte, 64<<10)
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			c.CloseWrite()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkPacketMessages sends messages of 1 KiB and 1 MiB one way over
// the tcp and ub paths; the receiver takes each one.
func BenchmarkPacketMessages(b *testing.B) {
	for _, path := range []string{"tcp", "ub-sim"} {
		for _, size := range []int{1 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%s/%dKiB", path, size>>10), func(b *testing.B) {
				a, c := packetPair(b, path)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				done := make(chan struct{})
				go func() {
					defer close(done)
					for {
						m, err := a.Recv(ctx)
						if err != nil {
							return
						}
						m.Release()
					}
				}()
				b.SetBytes(int64(size))
				for b.Loop() {
					m, err := c.Loan(size)
					if err != nil {
						b.Fatal(err)
					}
					if err := c.Send(m); err != nil {
						b.Fatal(err)
					}
				}
				cancel()
				<-done
			})
		}
	}
}
