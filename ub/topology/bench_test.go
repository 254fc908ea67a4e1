package topology

import (
	"testing"
)

// BenchmarkLoadCM384 parses, validates and precomputes the CloudMatrix384-
// shaped example (56 nodes, 384 links).
func BenchmarkLoadCM384(b *testing.B) {
	data, err := ExampleSource("cm384")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPathCostCM384 queries every ordered pair of cm384 nodes in turn
// through the index variant.
func BenchmarkPathCostCM384(b *testing.B) {
	topo, err := Example("cm384")
	if err != nil {
		b.Fatal(err)
	}
	n := len(topo.Nodes)
	b.ReportAllocs()
	i, j := 0, 1
	var sink int64
	for b.Loop() {
		c := topo.PathCostIdx(i, j, 1<<20)
		sink += int64(c.Transfer)
		if j++; j == n {
			j = 0
			if i++; i == n {
				i = 0
			}
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "queries/s")
	if sink < 0 {
		b.Fatal("negative transfer time")
	}
}

// BenchmarkPathCostByName is PathCost with its two name look-ups.
func BenchmarkPathCostByName(b *testing.B) {
	topo, err := Example("cm384")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := topo.PathCost("node03", "node41", 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}
