package mqsuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	testenv.Main(m, testBrokers.Close)
}

// TestCasesRun runs every case briefly across processes; the contenders
// check counts and checksums themselves.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(), 50*time.Millisecond) }
