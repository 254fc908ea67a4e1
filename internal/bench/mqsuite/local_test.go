package mqsuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

// TestLocalCasesRun runs the local-latency cases once each on real
// brokers: the consumer processes check counts and payload sums.
func TestLocalCasesRun(t *testing.T) {
	b := NewBrokers()
	t.Cleanup(b.Close)
	benchtest.CasesRun(t, LocalCases(b), 50*time.Millisecond)
}
