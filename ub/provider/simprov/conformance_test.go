package simprov_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

// The suite runs on the dev4 topology: this process plays n0 and the
// suite's peers play n1, so every operation crosses a simulated 20 µs,
// 5 GB/s link. SIMTEST_OVER picks the provider underneath (peers inherit
// it).
func open() (ub.Context, error) {
	over := os.Getenv("SIMTEST_OVER")
	if over == "" {
		over = "shm"
	}
	return ub.Open(context.Background(), simprov.Name, ub.Config{Options: map[string]string{simprov.OptTopology: "dev4", simprov.OptOver: over}})
}

// privateFabric holds the link state of the nodes openNode opens: the
// faults these tests inject stay off the dev4 that other packages' tests
// run on.
var privateFabric = fmt.Sprintf("simtest-%d", os.Getpid())

func TestMain(m *testing.M) {
	ubtest.RunPeerIfChild(open)
	os.Setenv("UB_NODE", "n0")
	os.Setenv(ubtest.EnvPeerEnv, "UB_NODE=n1")
	// The suite kills a peer on purpose (peer death), which leaves its
	// segments behind as a crashed process does: shm.Sweep must take
	// them, and Main fails the run on any that remain.
	testenv.Main(m, func() { shm.Sweep() })
}

// Memory to register comes from named shm segments, which both providers
// underneath register.
func TestConformance(t *testing.T) {
	ubtest.RunWith(t, open, ubtest.Options{Memory: ubtest.ShmMemory})
}

// TestConformanceOverTCP runs the suite with the tcp provider under the
// simulation.
func TestConformanceOverTCP(t *testing.T) {
	t.Setenv("SIMTEST_OVER", "tcp")
	ubtest.RunWith(t, open, ubtest.Options{Memory: ubtest.ShmMemory})
}
