package shmsuite

import (
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	os.Exit(m.Run())
}

// TestCasesRun runs every contender of every case briefly, across
// processes, so a broken case fails here rather than in `ubctl bench`. The
// contenders verify counts and checksums themselves.
func TestCasesRun(t *testing.T) {
	for _, c := range Cases("") {
		for _, k := range c.Contenders {
			t.Run(c.Name+"/"+k.Name, func(t *testing.T) {
				m, err := k.Run(50 * time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				if m.Value <= 0 {
					t.Fatalf("value %v", m.Value)
				}
				if c.Latency && len(m.Samples) == 0 {
					t.Fatal("latency case without samples")
				}
			})
		}
	}
}

func TestShmipcBaselineBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shmipc-go baseline module; skipped in -short mode")
	}
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
