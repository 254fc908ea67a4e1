package transport

import (
	"fmt"
	"net"
	"strings"

	"github.com/ubkit-io/ubkit/internal/rundir"
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

// RuntimeDir is where rendezvous sockets live by default: this user's
// private runtime directory, $UBKIT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/ubkit,
// else /run/user/<uid>/ubkit if /run/user/<uid> is private, else
// <tmp>/ubkit-<uid> (os.TempDir()) unless another user holds that name, in
// which case $HOME/.cache/ubkit/run (os.UserCacheDir()). It creates the last
// two when it chooses them, so that another user cannot take the choice
// away and every process of the user finds the same directory.
func RuntimeDir() string {
	dir, _ := rundir.Dir() // a failure shows in Listen, which checks the directory
	return dir
}

var _ net.Addr = Addr{}
