package layers_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// TestTransportNamesTheProviderToImport: a program that imports no ub
// provider (this test imports none, and TestLayers keeps transport from
// importing one) still gets the shm path, and when it first needs the ub
// path an error that names the package of the default provider.
func TestTransportNamesTheProviderToImport(t *testing.T) {
	if got := ub.Providers(); len(got) != 0 {
		t.Fatalf("providers %v are registered in a binary that imports none: a package above ub imports one", got)
	}
	t.Setenv(transport.EnvProvider, "")
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	endpoint := func(node string) *transport.Endpoint {
		e, err := transport.NewEndpoint(transport.Config{Node: node, Topology: topo, RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	n0, n1 := endpoint("n0"), endpoint("n1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := n0.Listen(ctx, "ub://n0/svc")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()

	c, err := n0.Dial(ctx, "ub://n0/svc")
	if err != nil {
		t.Fatalf("the shm path without providers: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatalf("accept on the shm path: %v", err)
	}

	c, err = n1.Dial(ctx, "ub://n0/svc")
	if err == nil {
		c.Close()
		t.Fatal("the ub path worked without a provider")
	}
	const pkg = "github.com/ubkit-io/ubkit/ub/provider/tcpprov"
	if !errors.Is(err, ub.ErrUnknownProvider) || !strings.Contains(err.Error(), pkg) {
		t.Errorf("the ub path without the default provider: %v; want ub.ErrUnknownProvider and the package to import, %s", err, pkg)
	}
}
