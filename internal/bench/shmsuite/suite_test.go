package shmsuite

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

// TestCasesRun runs every contender of every case briefly, across
// processes, so a broken case fails here rather than in `ubctl bench`. The
// contenders verify counts and checksums themselves.
func TestCasesRun(t *testing.T) { benchtest.CasesRun(t, Cases(""), 50*time.Millisecond) }

func TestShmipcBaselineBuilds(t *testing.T) {
	bin, err := BuildShmipc(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := runShmipc(bin, "pingpong-64B", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if m.P50 <= 0 {
		t.Fatalf("shmipc-go pingpong p50 %v", m.P50)
	}
}
