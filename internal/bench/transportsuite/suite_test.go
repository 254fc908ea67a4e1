package transportsuite

import (
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	dir, err := os.MkdirTemp("", "ubkit-transportsuite-")
	if err != nil {
		panic(err)
	}
	os.Setenv("UBKIT_RUNTIME_DIR", dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestCasesRun runs every contender briefly across processes.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(), 30*time.Millisecond) }
