package testenv

import (
	"os"
	"strings"

	"github.com/ubkit-io/ubkit/shm"
)

// RemoveOwnSimFabrics unlinks the simulated super nodes' shared link state
// (ubkit-sim-*) that this process created. A fabric outlives its processes
// by design, so that processes of one simulated super node share it; tests
// remove the ones they made.
func RemoveOwnSimFabrics() {
	names, _ := shm.Segments()
	for _, n := range names {
		if !strings.HasPrefix(n, "sim-") {
			continue
		}
		seg, err := shm.OpenSegment(n)
		if err != nil {
			continue
		}
		if seg.Creator().PID == uint32(os.Getpid()) {
			seg.Unlink()
		}
		seg.Close()
	}
}
