package transport

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Addr is a transport address, ub://<node>/<service>, optionally with
// ?path=shm|ub|tcp to force a path.
type Addr struct {
	Node    string
	Service string
	Path    Path
}

// Network returns "ub".
func (a Addr) Network() string { return "ub" }

func (a Addr) String() string {
	s := "ub://" + a.Node + "/" + a.Service
	if a.Path != "" {
		s += "?path=" + string(a.Path)
	}
	return s
}

// ParseAddr parses "ub://<node>/<service>[?path=<path>]". The node may be
// empty: the dialing or listening endpoint's own.
func ParseAddr(s string) (Addr, error) {
	rest, ok := strings.CutPrefix(s, "ub://")
	if !ok {
		return Addr{}, fmt.Errorf("transport: address %q does not start with ub://", s)
	}
	rest, query, hasQuery := strings.Cut(rest, "?")
	node, service, ok := strings.Cut(rest, "/")
	if !ok || service == "" {
		return Addr{}, fmt.Errorf("transport: address %q lacks a service (ub://<node>/<service>)", s)
	}
	if err := checkName("service", service); err != nil {
		return Addr{}, err
	}
	if node != "" {
		if err := checkName("node", node); err != nil {
			return Addr{}, err
		}
	}
	a := Addr{Node: node, Service: service}
	if hasQuery {
		v, ok := strings.CutPrefix(query, "path=")
		p, err := ParsePath(v)
		if !ok || err != nil || p == "" {
			return Addr{}, fmt.Errorf("transport: address %q: the only option is path=shm|ub|tcp", s)
		}
		a.Path = p
	}
	return a, nil
}

// RuntimeDir is where rendezvous sockets live: $XDG_RUNTIME_DIR/ubkit, else
// /tmp/ubkit-<uid>. UBKIT_RUNTIME_DIR overrides both.
func RuntimeDir() string {
	if d := os.Getenv("UBKIT_RUNTIME_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "ubkit")
	}
	return filepath.Join(os.TempDir(), "ubkit-"+strconv.Itoa(os.Geteuid()))
}

var _ net.Addr = Addr{}
