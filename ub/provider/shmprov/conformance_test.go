package shmprov_test

import (
	"fmt"
	"path/filepath"
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
	if entries, _ := os.ReadDir(shm.ShmDir); code == 0 {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), shm.NamePrefix+"ub-") {
				if p, err := os.ReadFile(filepath.Join(shm.ShmDir, e.Name())); err == nil && len(p) > 0 {
					fmt.Fprintf(os.Stderr, "FAIL: %s left behind\n", e.Name())
					code = 1
				}
			}
		}
	}
	os.Exit(code)
}

func TestConformance(t *testing.T) { ubtest.Run(t, open) }
