package transport

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Addr is a transport address, ub://<node>/<service>.
type Addr struct {
	Node    string
	Service string
}

// Network returns "ub".
func (a Addr) Network() string { return "ub" }

func (a Addr) String() string { return "ub://" + a.Node + "/" + a.Service }

// ParseAddr parses "ub://<node>/<service>". The node may be empty (this
// host).
func ParseAddr(s string) (Addr, error) {
	rest, ok := strings.CutPrefix(s, "ub://")
	if !ok {
		return Addr{}, fmt.Errorf("transport: address %q does not start with ub://", s)
	}
	node, service, ok := strings.Cut(rest, "/")
	if !ok || service == "" {
		return Addr{}, fmt.Errorf("transport: address %q lacks a service (ub://<node>/<service>)", s)
	}
	bad := service == "." || service == ".."
	for _, c := range service {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			bad = true
		}
	}
	if bad {
		return Addr{}, fmt.Errorf("transport: service %q may only hold letters, digits, '-', '_' and '.'", service)
	}
	return Addr{Node: node, Service: service}, nil
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
	return filepath.Join(os.TempDir(), "ubkit-"+strconv.Itoa(os.Getuid()))
}

func socketPath(a Addr) string { return filepath.Join(RuntimeDir(), a.Service+".sock") }

var _ net.Addr = Addr{}
