package meshsuite

import (
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	dir, err := os.MkdirTemp("", "ubkit-meshsuite-")
	if err != nil {
		panic(err)
	}
	os.Setenv("UBKIT_RUNTIME_DIR", dir)
	code := m.Run()
	os.RemoveAll(dir)
	testenv.RemoveOwnSimFabrics()
	shm.Sweep()
	os.Exit(code)
}

// TestCasesRun runs every contender briefly.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(), 30*time.Millisecond) }
