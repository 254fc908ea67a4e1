package ub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/ubkit-io/ubkit/ub/topology"
)

// Provider opens device endpoints. Providers register themselves with
// Register from an init function, like database/sql drivers.
type Provider interface {
	Open(ctx context.Context, cfg Config) (Context, error)
}

// Config configures a device endpoint. The zero value is valid.
type Config struct {
	// Name is an optional label that providers may show in names and logs.
	Name string
	// Options are provider-specific settings.
	Options map[string]string
	// Logger gets what the provider has to say that no call returns (a
	// peer it hung up on, and why). Default: nothing is logged.
	Logger *slog.Logger
}

var registry = struct {
	sync.RWMutex
	providers map[string]Provider
}{providers: map[string]Provider{}}

// Register makes a provider available by name. It panics if the name is
// taken or p is nil, as database/sql.Register does.
func Register(name string, p Provider) {
	registry.Lock()
	defer registry.Unlock()
	if p == nil {
		panic("ub: Register provider is nil")
	}
	if _, dup := registry.providers[name]; dup {
		panic("ub: Register called twice for provider " + name)
	}
	registry.providers[name] = p
}

// Providers returns the registered provider names, sorted.
func Providers() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.providers))
	for n := range registry.providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ErrUnknownProvider is returned by Open for a name nobody registered.
var ErrUnknownProvider = errors.New("ub: unknown provider")

// shipped are the packages of the providers ubkit ships, by name: the
// error of opening one that no import registered names its package.
var shipped = map[string]string{
	"shm": "github.com/ubkit-io/ubkit/ub/provider/shmprov",
	"tcp": "github.com/ubkit-io/ubkit/ub/provider/tcpprov",
	"sim": "github.com/ubkit-io/ubkit/ub/provider/simprov",
}

// lookup returns the provider registered as name, or an error that says
// what to import.
func lookup(name string) (Provider, error) {
	registry.RLock()
	p, ok := registry.providers[name]
	registry.RUnlock()
	if ok {
		return p, nil
	}
	names := Providers()
	registered := "none are registered"
	if len(names) > 0 {
		registered = "registered: " + strings.Join(names, ", ")
	}
	if pkg, ok := shipped[name]; ok {
		return nil, fmt.Errorf("%w %q: the program registers it by importing its package, _ %q (%s)", ErrUnknownProvider, name, pkg, registered)
	}
	return nil, fmt.Errorf("%w %q: import the package of a provider of that name (%s; ubkit's own are in github.com/ubkit-io/ubkit/ub/provider/...)", ErrUnknownProvider, name, registered)
}

// Open opens a device endpoint of the named provider.
func Open(ctx context.Context, provider string, cfg Config) (Context, error) {
	p, err := lookup(provider)
	if err != nil {
		return nil, err
	}
	return p.Open(ctx, cfg)
}

// NodeProvider is implemented by providers whose contexts can play any
// compute node of a super node, as the simulator does: a process says
// which one through OpenNode. A provider of real hardware plays the node
// it runs on and needs only Open.
type NodeProvider interface {
	Provider
	// OpenNode opens a context that plays node of t, as Open would with
	// cfg.
	OpenNode(ctx context.Context, t *topology.Topology, node string, cfg Config) (Context, error)
}

// NodeInfo is implemented by contexts that know which node of which super
// node they are on.
type NodeInfo interface {
	Node() string
	Topology() *topology.Topology
}

// OpenNode opens a device endpoint of the named provider for a process
// that plays node of t: through the provider's OpenNode if it is a
// NodeProvider, else with Open. A context that says where it is (NodeInfo)
// and is elsewhere is closed, and OpenNode fails naming both places.
func OpenNode(ctx context.Context, provider string, t *topology.Topology, node string, cfg Config) (Context, error) {
	if t == nil || node == "" {
		return nil, fmt.Errorf("ub: open %q on a node: give the topology and the node (got node %q)", provider, node)
	}
	p, err := lookup(provider)
	if err != nil {
		return nil, err
	}
	var c Context
	if np, ok := p.(NodeProvider); ok {
		c, err = np.OpenNode(ctx, t, node, cfg)
	} else {
		c, err = p.Open(ctx, cfg)
	}
	if err != nil {
		return nil, err
	}
	if ni, ok := c.(NodeInfo); ok {
		at, of := ni.Node(), ""
		if ni.Topology() != nil {
			of = ni.Topology().Name
		}
		if at != node || of != t.Name {
			c.Close()
			return nil, fmt.Errorf("ub: provider %q is on node %q of super node %q, not on %q of %q: configure the provider for that node, or play its node", provider, at, of, node, t.Name)
		}
	}
	return c, nil
}
