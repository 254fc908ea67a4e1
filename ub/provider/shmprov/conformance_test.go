package shmprov_test

import (
	"context"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/shmprov"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

func open() (ub.Context, error) { return ub.Open(context.Background(), shmprov.Name, ub.Config{}) }

func TestMain(m *testing.M) {
	ubtest.RunPeerIfChild(open)
	testenv.RegisterChild("regwriter", regWriterChild)
	testenv.RegisterChild("regreader", regReaderChild)
	// The suite kills a peer on purpose (peer death), which leaves its
	// segments behind as a crashed process does: shm.Sweep must take
	// them, and Main fails the run on any that remain.
	testenv.Main(m, func() { shm.Sweep() })
}

// shm registers only memory in named shm segments.
func TestConformance(t *testing.T) {
	ubtest.RunWith(t, open, ubtest.Options{Memory: ubtest.ShmMemory})
}
