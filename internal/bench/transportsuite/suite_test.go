package transportsuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

func TestMain(m *testing.M) { benchtest.Main(m) }

// TestCasesRun runs every contender briefly across processes.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(), 30*time.Millisecond) }
