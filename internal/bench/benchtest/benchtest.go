// Package benchtest helps the tests of benchmark suites.
package benchtest

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

// Main is TestMain for suites whose cases listen on transport addresses:
// it serves as a peer when re-executed as one, gives the run a private
// registry directory, and runs the tests with testenv.Main.
func Main(m *testing.M) {
	bench.RunPeerIfChild()
	testenv.RunChildIfAsked()
	dir, err := os.MkdirTemp("", "ubkit-benchtest-")
	if err != nil {
		panic(err)
	}
	os.Setenv("UBKIT_RUNTIME_DIR", dir)
	testenv.Main(m, func() { os.RemoveAll(dir) })
}

// CasesRun runs every contender of every case for d, as a subtest, so a
// broken case fails in `go test` rather than in `ubctl bench`. The
// contenders check their own results (counts, checksums); a latency case
// must also return samples.
func CasesRun(t *testing.T, cases []bench.Case, d time.Duration) {
	t.Helper()
	for _, c := range cases {
		for _, k := range c.Contenders {
			t.Run(c.Name+"/"+k.Name, func(t *testing.T) {
				m, err := k.Run(d)
				if err != nil {
					t.Fatal(err)
				}
				// A difference ("ns added", "fds added") may come out zero
				// or below in a run this short; anything else must be
				// positive.
				if math.IsNaN(m.Value) || m.Value <= 0 && !strings.HasSuffix(c.Unit, " added") {
					t.Fatalf("value %v", m.Value)
				}
				if c.Latency && len(m.Samples) == 0 && m.P50 == 0 {
					t.Fatal("latency case without samples")
				}
			})
		}
	}
}
