package ubsuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	testenv.Main(m)
}

// TestCasesRun runs every contender briefly across processes, so a broken
// case fails here rather than in `ubctl bench ub`.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(), 30*time.Millisecond) }
