package topology_test

import (
	"fmt"
	"os"

	"github.com/ubkit-io/ubkit/ub/topology"
)

func ExampleParse() {
	topo, err := topology.Parse([]byte(`
name: two-racks
nodes:
  - {name: a, cpus: 64, memory: 256GiB, devices: [{kind: NPU, count: 8, memory: 64GiB}]}
  - {name: b, cpus: 64, memory: 256GiB}
  - {name: sw, kind: switch}
links:
  - {a: a, b: b, bandwidth: 10GB/s, latency: 1us}    # a narrow direct cable
  - {a: a, b: sw, bandwidth: 400GB/s, latency: 1us}  # and the switch plane
  - {a: sw, b: b, bandwidth: 400GB/s, latency: 1us}
`))
	if err != nil {
		panic(err)
	}
	for _, size := range []int64{64, 1 << 20} {
		c, _ := topo.PathCost("a", "b", size)
		fmt.Printf("%s: %v over %d hops at %s\n", topology.FormatBytes(size), c.Transfer, c.Hops, topology.FormatBandwidth(c.Bandwidth))
	}
	path, _ := topo.Path("a", "b")
	fmt.Println("fastest path:", path)
	// Output:
	// 64B: 1.006µs over 1 hops at 10GB/s
	// 1MiB: 4.621µs over 2 hops at 400GB/s
	// fastest path: [a b]
}

func ExampleParse_errors() {
	_, err := topology.Parse([]byte(`
name: broken
nodes:
  - {name: n0}
  - {name: n1}
  - {name: n0}
links:
  - {a: n0, b: n9, bandwidth: 5GB/s, latency: 1us}
  - {a: n0, b: n1, bandwidth: -5GB/s, latency: 1us}
`))
	fmt.Println(err)
	// Output:
	// topology "broken": 3 problems:
	// 	nodes[2].name: duplicate node "n0" (first at nodes[0]) (line 6)
	// 	links[0].b: unknown node "n9" (line 8)
	// 	links[1].bandwidth: must be positive, got -5GB/s (line 9)
}

func ExampleExample() {
	topo, err := topology.Example("dev4")
	if err != nil {
		panic(err)
	}
	fmt.Println(topo.Name, "has", len(topo.Nodes), "nodes and", len(topo.Links), "links")
	c, _ := topo.PathCost("n0", "n3", 1<<20)
	fmt.Println("n0 → n3, 1 MiB:", c)
	// Output:
	// dev4 has 4 nodes and 6 links
	// n0 → n3, 1 MiB: 20µs, 5GB/s, 1 hops, transfer 229.715µs
}

func ExampleTopology_PathCostIdx() {
	topo, _ := topology.Example("cm384")
	// Resolve names once; then each query is two table reads.
	from, _ := topo.NodeIndex("node00")
	to, _ := topo.NodeIndex("node47")
	c := topo.PathCostIdx(from, to, 64<<20)
	fmt.Println(c.Latency, topology.FormatBandwidth(c.Bandwidth), c.Hops, c.Transfer)
	// Output: 1µs 392GB/s 2 172.196µs
}

func ExampleLocalNode() {
	// A simulated super node runs one process per node; each is told which
	// node it plays (without UB_NODE: the node named like the host, or the
	// only compute node).
	os.Setenv(topology.EnvNode, "n2")
	defer os.Unsetenv(topology.EnvNode)
	topo, _ := topology.Example("dev4")
	n, err := topology.LocalNode(topo)
	if err != nil {
		panic(err)
	}
	fmt.Println(n.Name, n.DeviceCount(topology.GPU), "GPU")
	// Output: n2 1 GPU
}

func ExampleParseBandwidth() {
	for _, s := range []string{"392GB/s", "100Gbit/s", "1.5GiB/s"} {
		bps, _ := topology.ParseBandwidth(s)
		fmt.Printf("%s = %.0f bytes/s\n", s, bps)
	}
	_, err := topology.ParseBandwidth("100Gb/s")
	fmt.Println(err)
	// Output:
	// 392GB/s = 392000000000 bytes/s
	// 100Gbit/s = 12500000000 bytes/s
	// 1.5GiB/s = 1610612736 bytes/s
	// invalid bandwidth "100Gb/s": ambiguous unit "Gb/s": write GB/s for bytes or Gbit/s for bits per second
}
