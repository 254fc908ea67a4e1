package ub_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// fakeContext is a context that only says where it is and whether it was
// closed; its other methods are never called.
type fakeContext struct {
	ub.Context
	node   string
	topo   *topology.Topology
	closed bool
}

func (c *fakeContext) Node() string                 { return c.node }
func (c *fakeContext) Topology() *topology.Topology { return c.topo }
func (c *fakeContext) Close() error                 { c.closed = true; return nil }

// plainProvider opens contexts that say nothing of where they are.
type plainProvider struct{ opened *int }

func (p plainProvider) Open(context.Context, ub.Config) (ub.Context, error) {
	*p.opened++
	return struct{ ub.Context }{}, nil
}

// nodeProvider plays any node, through OpenNode only.
type nodeProvider struct{ last **fakeContext }

func (nodeProvider) Open(context.Context, ub.Config) (ub.Context, error) {
	return nil, errors.New("Open called on a NodeProvider that OpenNode should have opened")
}

func (p nodeProvider) OpenNode(_ context.Context, t *topology.Topology, node string, _ ub.Config) (ub.Context, error) {
	*p.last = &fakeContext{node: node, topo: t}
	return *p.last, nil
}

// fixedProvider plays one node, whatever it is asked.
type fixedProvider struct{ last **fakeContext }

func (p fixedProvider) Open(context.Context, ub.Config) (ub.Context, error) {
	*p.last = &fakeContext{node: "n3", topo: &topology.Topology{Name: "dev4"}}
	return *p.last, nil
}

var (
	plainOpened         int
	nodeLast, fixedLast *fakeContext
)

func init() {
	ub.Register("test-plain", plainProvider{&plainOpened})
	ub.Register("test-node", nodeProvider{&nodeLast})
	ub.Register("test-fixed", fixedProvider{&fixedLast})
}

// TestOpenNode: OpenNode hands the node to a NodeProvider, opens other
// providers with Open, and refuses a context that is elsewhere.
func TestOpenNode(t *testing.T) {
	ctx := context.Background()
	dev4, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ub.OpenNode(ctx, "test-node", dev4, "n1", ub.Config{}); err != nil {
		t.Fatal(err)
	}
	if nodeLast.node != "n1" || nodeLast.topo != dev4 {
		t.Errorf("a NodeProvider opened node %q of %v, want n1 of dev4", nodeLast.node, nodeLast.topo)
	}
	opened := plainOpened
	if _, err := ub.OpenNode(ctx, "test-plain", dev4, "n1", ub.Config{}); err != nil || plainOpened != opened+1 {
		t.Errorf("a plain provider: %v, opened %d times", err, plainOpened-opened)
	}
	if _, err := ub.OpenNode(ctx, "test-fixed", dev4, "n3", ub.Config{}); err != nil {
		t.Errorf("a provider on the node asked for: %v", err)
	}
	_, err = ub.OpenNode(ctx, "test-fixed", dev4, "n1", ub.Config{})
	if err == nil || !strings.Contains(err.Error(), `node "n3"`) || !strings.Contains(err.Error(), `"n1"`) {
		t.Errorf("a provider on another node: %v, want an error naming both", err)
	}
	if !fixedLast.closed {
		t.Error("the context on the wrong node was left open")
	}
	if _, err := ub.OpenNode(ctx, "test-node", nil, "n1", ub.Config{}); err == nil {
		t.Error("OpenNode without a topology succeeded")
	}
	if _, err := ub.OpenNode(ctx, "test-node", dev4, "", ub.Config{}); err == nil {
		t.Error("OpenNode without a node succeeded")
	}
}

// TestOpenUnknown: opening a provider nobody registered says what to
// import: the package, for the providers ubkit ships.
func TestOpenUnknown(t *testing.T) {
	for name, want := range map[string]string{
		"tcp":   `_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov"`,
		"sim":   `_ "github.com/ubkit-io/ubkit/ub/provider/simprov"`,
		"other": "github.com/ubkit-io/ubkit/ub/provider/...",
	} {
		_, err := ub.Open(context.Background(), name, ub.Config{})
		if !errors.Is(err, ub.ErrUnknownProvider) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "registered: shm") {
			t.Errorf("Open(%q): %v; want ErrUnknownProvider, %s and the registered providers", name, err, want)
		}
		dev4, _ := topology.Example("dev4")
		if _, err := ub.OpenNode(context.Background(), name, dev4, "n0", ub.Config{}); !errors.Is(err, ub.ErrUnknownProvider) {
			t.Errorf("OpenNode(%q): %v; want ErrUnknownProvider", name, err)
		}
	}
}
