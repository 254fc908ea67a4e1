package mqsuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

// TestOffloadCasesRun runs the offload cases once each on real brokers
// (started once for both): the consumers check counts and payload sums.
func TestOffloadCasesRun(t *testing.T) {
	b := NewBrokers()
	t.Cleanup(b.Close)
	benchtest.CasesRun(t, OffloadCases(b), 50*time.Millisecond)
}
