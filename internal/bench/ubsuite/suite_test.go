package ubsuite

import (
	"fmt"
	"strings"

	"github.com/ubkit-io/ubkit/shm"
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	code := m.Run()
	// Nothing of the peers' or ours may stay in /dev/shm (the simulated
	// fabric is shared state that outlives processes by design).
	names, _ := shm.Segments()
	for _, name := range names {
		if code == 0 && strings.HasPrefix(name, "ub-") && createdByUs(name) {
			fmt.Fprintf(os.Stderr, "FAIL: segment %s left behind\n", name)
			code = 1
		}
	}
	os.Exit(code)
}

// TestCasesRun runs every contender briefly across processes, so a broken
// case fails here rather than in `ubctl bench ub`.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(), 30*time.Millisecond) }

// createdByUs reports whether this process created the named segment (other
// test packages may run at the same time and have live segments).
func createdByUs(name string) bool {
	seg, err := shm.OpenSegment(name)
	if err != nil {
		return false
	}
	defer seg.Close()
	return seg.Creator().PID == uint32(os.Getpid())
}
