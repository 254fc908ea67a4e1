package testenv

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/ubkit-io/ubkit/shm"
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
