package ub

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// Open opens a device endpoint of the named provider.
func Open(ctx context.Context, provider string, cfg Config) (Context, error) {
	registry.RLock()
	p, ok := registry.providers[provider]
	registry.RUnlock()
	if !ok {
		names := Providers()
		hint := "none are registered: import a provider package, e.g. _ \"github.com/ubkit-io/ubkit/ub/provider/shmprov\""
		if len(names) > 0 {
			hint = "registered: " + strings.Join(names, ", ")
		}
		return nil, fmt.Errorf("%w %q (%s)", ErrUnknownProvider, provider, hint)
	}
	return p.Open(ctx, cfg)
}
