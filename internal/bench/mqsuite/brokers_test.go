package mqsuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

// testBrokers serve every broker case of the tests, started on first use
// (once for all: a start takes tens of seconds) and stopped by TestMain.
var testBrokers = &Brokers{quick: true}

// TestOffloadCasesRun runs the offload cases once each on real brokers:
// the consumers check counts and payload sums.
func TestOffloadCasesRun(t *testing.T) {
	benchtest.CasesRun(t, OffloadCases(testBrokers), 50*time.Millisecond)
}

// TestLocalCasesRun runs the local-latency cases once each on real
// brokers: the consumer processes check counts and payload sums.
func TestLocalCasesRun(t *testing.T) {
	benchtest.CasesRun(t, LocalCases(testBrokers), 50*time.Millisecond)
}
