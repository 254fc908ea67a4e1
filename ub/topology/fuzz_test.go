package topology

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds Parse arbitrary bytes. It must never panic, and whatever it
// accepts must validate and give finite, symmetric path costs between its
// first nodes.
func FuzzParse(f *testing.F) {
	// Not cm384: at 20 kB it makes each run and each minimisation slow,
	// and it holds nothing the small examples do not.
	for _, name := range []string{"laptop", "dev4"} {
		data, _ := ExampleSource(name)
		f.Add(data)
	}
	files, _ := filepath.Glob("testdata/*/*")
	for _, file := range files {
		if data, err := os.ReadFile(file); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(smallYAML))
	f.Add([]byte(smallJSON))
	f.Add([]byte(`{"name":"j","nodes":[{"name":"a"},{"name":"b"}],"links":[{"a":"a","b":"b","bandwidth":"1kB/s","latency":"1ns"}]}`))
	f.Add([]byte("name: m\nx-t: &t {cpus: 1}\nnodes: [{<<: *t, name: a}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := Parse(data)
		if err != nil {
			return
		}
		if err := topo.Validate(); err != nil {
			t.Fatalf("Parse accepted a topology that does not validate: %v", err)
		}
		n := min(len(topo.Nodes), 10)
		for i := range n {
			for j := range n {
				for _, size := range []int64{0, 64, 1 << 30} {
					c, err := topo.PathCost(topo.Nodes[i].Name, topo.Nodes[j].Name, size)
					if err != nil {
						t.Fatalf("PathCost(%d, %d): %v", i, j, err)
					}
					back := topo.PathCostIdx(j, i, size)
					if c != back {
						t.Fatalf("PathCost(%d, %d, %d) = %+v, back %+v", i, j, size, c, back)
					}
					finite := c.Latency >= 0 && c.Transfer >= c.Latency && c.Hops >= 0 && !math.IsNaN(c.Bandwidth) && c.Bandwidth > 0
					if i != j {
						finite = finite && !math.IsInf(c.Bandwidth, 0) && c.Hops > 0 && c.Transfer < math.MaxInt64
					}
					if !finite {
						t.Fatalf("PathCost(%d, %d, %d) = %+v", i, j, size, c)
					}
				}
			}
		}
	})
}
