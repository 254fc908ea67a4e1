package ubtest_test

import (
	"context"
	"os"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

// A provider's conformance test: the suite starts peer processes by
// re-executing the test binary, so TestMain must hand them over first.
func Example() {
	open := func() (ub.Context, error) {
		return ub.Open(context.Background(), "my-provider", ub.Config{})
	}
	// In the provider's _test.go:
	//
	//	func TestMain(m *testing.M) {
	//		ubtest.RunPeerIfChild(open)
	//		os.Exit(m.Run())
	//	}
	//
	//	func TestConformance(t *testing.T) { ubtest.Run(t, open) }
	_ = func(m *testing.M) {
		ubtest.RunPeerIfChild(open)
		os.Exit(m.Run())
	}
	_ = func(t *testing.T) { ubtest.Run(t, open) }
}

// A provider that registers only some memory (shm: memory in a named shm
// segment) tells the suite where to get memory for its RegisterSegment
// checks.
func ExampleRunWith() {
	open := func() (ub.Context, error) {
		return ub.Open(context.Background(), "my-provider", ub.Config{})
	}
	// In the provider's _test.go, with RunPeerIfChild in TestMain:
	//
	//	func TestConformance(t *testing.T) {
	//		ubtest.RunWith(t, open, ubtest.Options{Memory: ubtest.ShmMemory})
	//	}
	_ = func(t *testing.T) {
		ubtest.RunWith(t, open, ubtest.Options{Memory: ubtest.ShmMemory})
	}
}
