package tcpprov_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub/ubtest"
)

// TestAcrossNetns runs the conformance suite between two hosts: this test
// binary runs the suite inside network namespace A, listening on A's
// address, and the suite's peers run inside namespace B, joined to A by a
// veth pair. Nothing goes over loopback.
func TestAcrossNetns(t *testing.T) {
	pair := testenv.NewNetnsPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := pair.CommandContext(ctx, pair.A, os.Args[0], "-test.run=^TestConformance$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"UB_TCP_LISTEN="+pair.AddrA+":0",
		ubtest.EnvPeerWrap+"=ip netns exec "+pair.B,
		ubtest.EnvPeerEnv+"=UB_TCP_LISTEN="+pair.AddrB+":0",
		"GORACE=atexit_sleep_ms=0",
	)
	out, err := cmd.CombinedOutput()
	t.Logf("suite in %s with peers in %s:\n%s", pair.A, pair.B, out)
	if err != nil {
		t.Fatalf("conformance across namespaces: %v", err)
	}
}
