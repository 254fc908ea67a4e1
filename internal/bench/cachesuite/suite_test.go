package cachesuite

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

// TestCasesRun runs every contender of every case briefly, clients and
// servers in their own processes, against real redis-server and
// memcached. The contenders check every value they read.
func TestCasesRun(t *testing.T) {
	e := NewEnv()
	defer e.Close()
	benchtest.CasesRun(t, e.Cases(), 30*time.Millisecond)
}
