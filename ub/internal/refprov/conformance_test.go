package refprov_test

import (
	"context"
	"os"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/leaktest"
	"github.com/ubkit-io/ubkit/ub/internal/refprov"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

func open() (ub.Context, error) { return ub.Open(context.Background(), refprov.Name, ub.Config{}) }

func TestMain(m *testing.M) {
	ubtest.RunPeerIfChild(open)
	os.Exit(m.Run())
}

// TestConformance is the point of the package: a provider written from
// docs/ub.md alone passes the suite.
func TestConformance(t *testing.T) { ubtest.Run(t, open) }

// TestCloseReturnsEverything: connections of the transport's shape made
// and closed between two long-lived contexts leave no descriptors or
// goroutines behind.
func TestCloseReturnsEverything(t *testing.T) {
	a, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	leaktest.Cycle(t, a, b, 200)
}
