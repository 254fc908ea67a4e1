package topology

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
)

//go:embed examples/*.yaml
var examples embed.FS

// Example returns one of the topologies shipped in ub/topology/examples:
//   - "laptop": one node, nothing to route;
//   - "dev4": a 4-node development super node whose links (20µs, 5GB/s) are
//     slower than a host's shared memory, so a simulator can honour them;
//   - "cm384": a CloudMatrix384-shaped super node, 48 nodes of 8 NPUs each
//     joined by UB switches (see docs/topology.md for the public figures it
//     rests on and where it approximates).
//
// Each call parses the file again and returns a Topology of its own.
func Example(name string) (*Topology, error) {
	data, err := ExampleSource(name)
	if err != nil {
		return nil, err
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("example %s: %w", name, err)
	}
	return t, nil
}

// ExampleSource returns the YAML text of a shipped example topology.
func ExampleSource(name string) ([]byte, error) {
	data, err := examples.ReadFile("examples/" + name + ".yaml")
	if err != nil || strings.ContainsAny(name, "/\\") {
		return nil, fmt.Errorf("topology: no example %q (have %s)", name, strings.Join(ExampleNames(), ", "))
	}
	return data, nil
}

// ExampleNames lists the shipped example topologies, sorted.
func ExampleNames() []string {
	files, _ := fs.Glob(examples, "examples/*.yaml")
	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, strings.TrimSuffix(path.Base(f), ".yaml"))
	}
	slices.Sort(names)
	return names
}
