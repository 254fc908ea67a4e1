package tcpprov_test

import (
	"context"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/tcpprov"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

func open() (ub.Context, error) { return ub.Open(context.Background(), tcpprov.Name, ub.Config{}) }

func TestMain(m *testing.M) {
	ubtest.RunPeerIfChild(open)
	testenv.Main(m)
}

// TestConformance runs the suite over loopback; TestAcrossNetns runs it
// between two network namespaces.
func TestConformance(t *testing.T) { ubtest.Run(t, open) }
