package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// RemoveOwnSimFabrics unlinks the simulated super nodes' shared link state
// (ubkit-sim-*) that this process created. A fabric outlives its processes
// by design, so that processes of one simulated super node share it; tests
// remove the ones they made.
func RemoveOwnSimFabrics() {
	names, _ := filepath.Glob("/dev/shm/" + shm.NamePrefix + "sim-*")
	for _, n := range names {
		seg, err := shm.OpenSegment(strings.TrimPrefix(filepath.Base(n), shm.NamePrefix))
		if err != nil {
			continue
		}
		if seg.Creator().PID == uint32(os.Getpid()) {
			seg.Unlink()
		}
		seg.Close()
	}
}

// PrivateTopology writes the shipped example topology under a name of its
// own (this process's) into dir and returns the file. A simulated super
// node on it has link state no other process shares: the faults a test
// injects there (links down, nodes crashed) cannot reach the tests of
// other packages that run the same example at the same time.
func PrivateTopology(dir, example string) (path, name string, err error) {
	src, err := topology.ExampleSource(example)
	if err != nil {
		return "", "", err
	}
	name = fmt.Sprintf("%s-private-%d", example, os.Getpid())
	lines := strings.Split(string(src), "\n")
	renamed := false
	for i, l := range lines {
		if strings.HasPrefix(l, "name:") {
			lines[i], renamed = "name: "+name, true
			break
		}
	}
	if !renamed {
		return "", "", fmt.Errorf("testenv: example %s has no top-level name", example)
	}
	path = filepath.Join(dir, name+".yaml")
	return path, name, os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600)
}
