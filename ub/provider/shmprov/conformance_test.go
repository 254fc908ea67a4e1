package shmprov_test

import (
	"fmt"
	"strings"

	"context"
	"github.com/ubkit-io/ubkit/shm"
	"os"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/shmprov"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

func open() (ub.Context, error) { return ub.Open(context.Background(), shmprov.Name, ub.Config{}) }

func TestMain(m *testing.M) {
	ubtest.RunPeerIfChild(open)
	code := m.Run()
	// Peers killed on purpose leave their segments behind, as crashed
	// processes do; Sweep must take them, and nothing else may remain.
	if _, err := shm.Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		code = 1
	}
	if names, _ := shm.Segments(); code == 0 {
		for _, name := range names {
			if !strings.HasPrefix(name, "ub-") {
				continue
			}
			// Other test packages may run now: only ours count.
			if seg, err := shm.OpenSegment(name); err == nil {
				if seg.Creator().PID == uint32(os.Getpid()) {
					fmt.Fprintf(os.Stderr, "FAIL: segment %s left behind\n", name)
					code = 1
				}
				seg.Close()
			}
		}
	}
	os.Exit(code)
}

func TestConformance(t *testing.T) { ubtest.Run(t, open) }
