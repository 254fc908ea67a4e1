// Package mesh is ubkit's service mesh: an xDS control plane (on
// github.com/envoyproxy/go-control-plane) that publishes services with
// super-node locality and weights from the topology's path costs, and
// helpers for proxyless gRPC whose calls to endpoints in the super node go
// over the bus.
//
// Region is the super node, zone the node: each requesting node gets its
// own endpoint view, with the endpoints it reaches most cheaply in priority
// 0 and farther ones behind them, so grpc-go's own xDS client prefers its
// node and fails over along the topology.
package mesh

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"

	"github.com/ubkit-io/ubkit/transport"
)

// Service is a named service and where it runs.
type Service struct {
	Name string `yaml:"name" json:"name"`
	// Instances are where the service runs. In registry files their key
	// is "endpoints", xDS's name for them.
	Instances []Instance `yaml:"endpoints" json:"endpoints"`
	// ProxyPort, if set, is the loopback port every node proxy listens on
	// for this service, for the applications of its node (published over
	// LDS as "proxy:<name>").
	ProxyPort int `yaml:"proxy_port,omitempty" json:"proxy_port,omitempty"`
}

// Instance is one instance of a service: what xDS calls an endpoint.
type Instance struct {
	// Node is the super node's node the instance runs on.
	Node string `yaml:"node" json:"node"`
	// Address is its TCP host:port, reachable by any client.
	Address string `yaml:"address" json:"address"`
	// Bus, if set, is the transport service ("ub://<node>/<service>")
	// where the instance also listens: ubkit clients dial it instead.
	Bus string `yaml:"bus,omitempty" json:"bus,omitempty"`
}

// Endpoint is the old name of Instance, which said the same as
// transport.Endpoint in programs that import both.
//
// Deprecated: use Instance.
type Endpoint = Instance

// Registry is where the control plane learns services.
type Registry interface {
	// Services returns the current services.
	Services(ctx context.Context) ([]Service, error)
	// Changed is signalled (without blocking) whenever Services would
	// return something new.
	Changed() <-chan struct{}
}

// StaticRegistry is a Registry whose services are set by the program or
// read from a file.
type StaticRegistry struct {
	mu       sync.Mutex
	services []Service
	changed  chan struct{}
}

// NewStaticRegistry returns a registry holding services.
func NewStaticRegistry(services []Service) (*StaticRegistry, error) {
	r := &StaticRegistry{changed: make(chan struct{}, 1)}
	return r, r.Set(services)
}

// LoadRegistry reads a YAML (or JSON) file: {services: [{name, endpoints:
// [{node, address, bus}]}]}.
func LoadRegistry(path string) (*StaticRegistry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := parseRegistry(b)
	if err != nil {
		return nil, fmt.Errorf("mesh: %s: %w", path, err)
	}
	return r, nil
}

// parseRegistry reads a registry file's contents. A field it does not know
// is an error, not a silently ignored typo (an "addr:" meant as "address:").
func parseRegistry(b []byte) (*StaticRegistry, error) {
	var f struct {
		Services []Service `yaml:"services"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && err != io.EOF {
		return nil, err
	}
	return NewStaticRegistry(f.Services)
}

// Set replaces the services.
func (r *StaticRegistry) Set(services []Service) error {
	seen := map[string]bool{}
	for i, s := range services {
		if s.Name == "" || seen[s.Name] {
			return fmt.Errorf("mesh: service %d: a name that is empty or repeated (%q)", i, s.Name)
		}
		if strings.IndexFunc(s.Name, notPrintable) >= 0 {
			return fmt.Errorf("mesh: service %q: a name with spaces or control characters", s.Name)
		}
		seen[s.Name] = true
		if s.ProxyPort < 0 || s.ProxyPort > 65535 {
			return fmt.Errorf("mesh: service %s: proxy port %d", s.Name, s.ProxyPort)
		}
		for j, e := range s.Instances {
			if err := checkHostPort(e.Address); err != nil {
				return fmt.Errorf("mesh: service %s instance %d: %w", s.Name, j, err)
			}
			if e.Node == "" || strings.IndexFunc(e.Node, notPrintable) >= 0 {
				return fmt.Errorf("mesh: service %s instance %d: node %q", s.Name, j, e.Node)
			}
			if e.Bus != "" {
				if _, err := transport.ParseAddr(e.Bus); err != nil {
					return fmt.Errorf("mesh: service %s instance %d: %w", s.Name, j, err)
				}
			}
		}
	}
	r.mu.Lock()
	r.services = slices.Clone(services)
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// checkHostPort says what is wrong with addr as an endpoint's TCP address,
// if anything: a host and a port from 1 to 65535, nothing else.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || strings.IndexFunc(addr, notPrintable) >= 0 {
		return fmt.Errorf("address %q is not host:port", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("bad port in %q", addr)
	}
	return nil
}

// Services returns a copy of the services.
func (r *StaticRegistry) Services(context.Context) ([]Service, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.services), nil
}

// Changed is signalled by Set.
func (r *StaticRegistry) Changed() <-chan struct{} { return r.changed }

// busAddress returns the bus address of the instance at a TCP address.
func busAddress(services []Service, addr string) (string, bool) {
	for _, s := range services {
		for _, e := range s.Instances {
			if e.Address == addr && e.Bus != "" {
				return e.Bus, true
			}
		}
	}
	return "", false
}
