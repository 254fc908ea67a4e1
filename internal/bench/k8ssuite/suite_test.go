package k8ssuite

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

// TestCasesRun runs every case once on real binaries, the -5000 ones at
// a small scale (3 super nodes of 4): a new controller process each run
// makes every SuperNode correct again, and reports its RSS.
func TestCasesRun(t *testing.T) {
	e := &Env{SuperNodes: 3, NodesPerSuperNode: 4}
	defer e.Close()
	benchtest.CasesRun(t, e.Cases(), time.Millisecond)
	if len(e.want) != 3 || e.want["sn002"] != 4 {
		t.Errorf("super nodes %v, want 3 of 4 members", e.want)
	}
}
