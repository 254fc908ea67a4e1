package transport

import (
	"io"
	"testing"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// BenchmarkUBEchoSim is a 1 KB round trip over the ub path between two
// nodes of the simulated cm384 (links of 1 µs), in this process.
func BenchmarkUBEchoSim(b *testing.B) {
	topo, err := topology.Example("cm384")
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	mk := func(n string) *Endpoint {
		e, err := NewEndpoint(Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	a, c := connect(b, mk("node00"), mk("node01"), "node00", "", PathUB)
	defer a.Close()
	defer c.Close()
	go io.Copy(a, a)
	buf := make([]byte, 1024)
	b.SetBytes(2 * int64(len(buf)))
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
}
