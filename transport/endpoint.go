package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport/internal/deadline"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// Environment variables read by the default endpoint (besides UB_NODE and
// UB_TOPOLOGY, see package topology).
const (
	// EnvProvider names the ub provider of the ub path (default "tcp").
	EnvProvider = "UB_PROVIDER"
	// EnvPath forces a path for every Dial: "shm", "ub" or "tcp".
	EnvPath = "UBKIT_PATH"
)

// Topology labels the transport reads from a node.
const (
	// LabelRegistry is the host:port of the node's registry, which tells
	// dialers on other hosts where a service listens. Default: the node's
	// name, port 7470.
	LabelRegistry = "ubkit.io/registry"
	// LabelAddress is the IP address or host name other hosts reach the
	// node at; listeners accept remote dialers there. Default: the
	// registry's host, else loopback.
	LabelAddress = "ubkit.io/address"
)

// DefaultRegistryPort is the registry's port when the topology says none.
const DefaultRegistryPort = "7470"

// Config describes an Endpoint. The zero value reads the environment.
type Config struct {
	// Node is the node this endpoint plays. Default: UB_NODE, else the
	// topology's node for this host, else this host's name.
	Node string
	// Topology is the super node. Default: UB_TOPOLOGY, else this host
	// alone.
	Topology *topology.Topology
	// Provider is the ub provider of the ub path ("sim", "tcp", or a
	// hardware one), which the program registers by importing its
	// package, as database/sql drivers are (ub/provider/tcpprov for the
	// default, "tcp"). Default: UB_PROVIDER, else "tcp".
	Provider string
	// ProviderOptions go to the provider. One that can play any node (a
	// ub.NodeProvider, such as "sim") plays this endpoint's node of its
	// topology, which it is given with them (ub.OpenNode).
	ProviderOptions map[string]string
	// Path forces the path of every Dial. Default: UBKIT_PATH, else each
	// Dial chooses (see Endpoint.Dial).
	Path Path
	// RuntimeDir holds this host's registry: one rendezvous socket per
	// service. Default: RuntimeDir().
	RuntimeDir string
	// AllowUIDs are users besides this process's whose processes may
	// connect on this host, over unix sockets (SO_PEERCRED) and loopback
	// TCP alike (the kernel's socket table names each socket's owner).
	// Default: none.
	AllowUIDs []int
	// Identity proves this node's name to listeners and dialers on other
	// hosts, and verifies theirs (mutual TLS with the super node's CA).
	// Default: the files UBKIT_TLS_CERT, UBKIT_TLS_KEY and UBKIT_TLS_CA
	// name, else none: dialers from other hosts are refused, and dialing a
	// listener on another host fails.
	Identity *Identity
	// ListenTCP makes listeners accept TCP dialers even when the topology
	// gives this node no address other hosts reach it at (the labels
	// ubkit.io/address and ubkit.io/registry): on loopback, for tests of
	// the tcp path. Dialers on this host are held to the same user check
	// on TCP as on unix sockets. An endpoint whose forced path is tcp
	// listens on TCP too.
	ListenTCP bool

	// Flow control of the ub and tcp paths (the shm path's rings are
	// bounded by their size). A connection holds at most StreamWindow
	// bytes of stream its application has not read (default
	// DefaultStreamWindow) and MessageWindow bytes of messages it has not
	// received (default DefaultMessageWindow), which is also the largest
	// message its peer may send it; the peer's writes and sends wait for
	// room. Windows start at 256 KiB each (the least either may be) and
	// grow as they are used, drawing on ReceiveMemory, which bounds all of
	// this endpoint's connections together (default
	// DefaultReceiveMemory).
	StreamWindow, MessageWindow, ReceiveMemory int64

	// Logger gets what the endpoint has to say that no call returns: the
	// dialers its listeners accepted, with the peer node they proved (at
	// Debug), refused (at Warn) or whose handshake failed (at Debug),
	// errors accepting connections, its registry's trouble, and (through
	// ub.Config.Logger) what the ub provider has to say. Default:
	// nothing is logged.
	Logger *slog.Logger
}

// Endpoint is a process's place on the super node: the node it plays, the
// topology it sees, and the ub context its cross-node connections use. The
// package-level Listen and Dial use one made from the environment; a
// process that plays several nodes (a simulation) makes one per node.
type Endpoint struct {
	node    string
	topo    *topology.Topology
	prov    string
	opts    map[string]string
	path    Path
	dir     string
	allow   []int
	regAddr string // this node's registry address, if it serves one
	flow    *flowConfig

	identity  *Identity // nil: no dialers from other hosts
	listenTCP bool
	log       *slog.Logger

	mu        sync.Mutex
	ubctx     ub.Context
	ubConns   map[*pktConn]struct{} // open connections over ubctx: closed before it
	listeners int
	reg       net.Listener
	regStop   chan struct{}
	closed    bool
}

// NewEndpoint makes an endpoint; nothing is opened until it is used.
func NewEndpoint(cfg Config) (*Endpoint, error) {
	t := cfg.Topology
	if t == nil {
		var err error
		if t, err = topology.FromEnv(); err != nil {
			return nil, fmt.Errorf("transport: %w", err)
		}
	}
	node := cfg.Node
	if node == "" {
		if n, err := topology.LocalNode(t); err == nil {
			node = n.Name
		} else if os.Getenv(topology.EnvNode) != "" {
			return nil, fmt.Errorf("transport: %w", err)
		} else {
			node, _ = os.Hostname()
		}
	}
	if err := checkName("node", node); err != nil {
		return nil, err
	}
	prov := cfg.Provider
	if prov == "" {
		prov = os.Getenv(EnvProvider)
	}
	if prov == "" {
		prov = "tcp"
	}
	path := cfg.Path
	if path == "" {
		var err error
		if path, err = ParsePath(os.Getenv(EnvPath)); err != nil {
			return nil, fmt.Errorf("transport: %s: %w", EnvPath, err)
		}
	}
	if _, err := ParsePath(string(path)); err != nil {
		return nil, err
	}
	dir := cfg.RuntimeDir
	if dir == "" {
		dir = RuntimeDir()
	}
	id := cfg.Identity
	if id == nil {
		var err error
		if id, err = identityFromEnv(); err != nil {
			return nil, err
		}
	}
	if id != nil {
		c := *id
		if c.SuperNode == "" {
			c.SuperNode = t.Name
		}
		if err := c.check(node); err != nil {
			return nil, err
		}
		id = &c
	}
	e := &Endpoint{node: node, topo: t, prov: prov, opts: maps.Clone(cfg.ProviderOptions), path: path, dir: dir,
		allow: slices.Clone(cfg.AllowUIDs), identity: id, listenTCP: cfg.ListenTCP || path == PathTCP,
		flow: newFlowConfig(cfg.StreamWindow, cfg.MessageWindow, cfg.ReceiveMemory), log: cfg.Logger}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if i, ok := t.NodeIndex(node); ok {
		e.regAddr = t.Nodes[i].Labels[LabelRegistry]
	}
	return e, nil
}

var defaultEndpoint = sync.OnceValues(func() (*Endpoint, error) { return NewEndpoint(Config{}) })

// Default returns the endpoint the package-level Listen and Dial use, made
// from the environment on first use.
func Default() (*Endpoint, error) { return defaultEndpoint() }

// Node returns the node the endpoint plays.
func (e *Endpoint) Node() string { return e.node }

// Topology returns the super node the endpoint sees.
func (e *Endpoint) Topology() *topology.Topology { return e.topo }

// Close closes the endpoint's ub context and registry. Close its
// listeners and connections first.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	e.stopRegistryLocked()
	conns, uctx := e.ubConns, e.ubctx
	e.ubConns = nil
	e.mu.Unlock()
	// Connections on the ub path use the context's memory until they are
	// closed: they go first, together (each may wait out its goodbye).
	var wg sync.WaitGroup
	for c := range conns {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
	if uctx != nil {
		return uctx.Close()
	}
	return nil
}

// ubConn starts a connection over a ub link of the endpoint's context,
// closed when the endpoint closes if it was not before; with the endpoint
// closed it releases the link and fails.
func (e *Endpoint) ubConn(lk *ubLink, local, remote Addr) (*pktConn, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		lk.release()
		return nil, errors.New("transport: endpoint closed")
	}
	c := newPktConn(lk, local, remote, e.flow)
	if e.ubConns == nil {
		e.ubConns = map[*pktConn]struct{}{}
	}
	e.ubConns[c] = struct{}{}
	c.onClose = func() {
		e.mu.Lock()
		delete(e.ubConns, c)
		e.mu.Unlock()
	}
	return c, nil
}

// ubContext opens the endpoint's ub context on first use.
func (e *Endpoint) ubContext(ctx context.Context) (ub.Context, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errors.New("transport: endpoint closed")
	}
	if e.ubctx != nil {
		return e.ubctx, nil
	}
	c, err := ub.OpenNode(ctx, e.prov, e.topo, e.node, ub.Config{Options: e.opts, Logger: e.log})
	if err != nil {
		return nil, fmt.Errorf("transport: ub path of node %s: %w", e.node, err)
	}
	e.ubctx = c
	return c, nil
}

// resolve fills in an address's node.
func (e *Endpoint) resolve(a Addr) Addr {
	if a.Node == "" || a.Node == "localhost" {
		a.Node = e.node
	}
	return a
}

// choose picks the path to a node: this node → shm, another node of the
// super node → ub, anything else → tcp.
func (e *Endpoint) choose(a Addr) Path {
	switch {
	case a.Path != "":
		return a.Path
	case e.path != "":
		return e.path
	case a.Node == e.node:
		return PathShm
	}
	if i, ok := e.topo.NodeIndex(a.Node); ok && !e.topo.Nodes[i].IsSwitch() {
		return PathUB
	}
	return PathTCP
}

// ensureDirs makes the registry directories for node, and refuses ones
// another user could have planted or could change: each must be a real
// directory (not a symbolic link) owned by this user that no one else may
// write to. The node's directory must leave room for a socket's name.
func (e *Endpoint) ensureDirs(node string) error { return ensureRegistryDirs(e.dir, node) }

// nodeDir is where a node's rendezvous sockets live on this host.
func (e *Endpoint) nodeDir(node string) string { return filepath.Join(e.dir, node) }

func (e *Endpoint) socketPath(a Addr) string {
	return filepath.Join(e.nodeDir(a.Node), a.Service+".sock")
}

// tcpFile records where a service accepts dialers from other hosts.
func (e *Endpoint) tcpFile(a Addr) string {
	return filepath.Join(e.nodeDir(a.Node), a.Service+".tcp")
}

// registryAddr is where node's registry answers.
func (e *Endpoint) registryAddr(node string) string {
	if i, ok := e.topo.NodeIndex(node); ok {
		if r := e.topo.Nodes[i].Labels[LabelRegistry]; r != "" {
			return r
		}
	}
	return net.JoinHostPort(node, DefaultRegistryPort)
}

// remoteHost is the address a listener accepts TCP dialers on, and
// whether it should: when the topology says other hosts reach this node
// there, or when asked (Config.ListenTCP, a forced tcp path), on loopback.
func (e *Endpoint) remoteHost() (string, bool) {
	if i, ok := e.topo.NodeIndex(e.node); ok {
		labels := e.topo.Nodes[i].Labels
		if a := labels[LabelAddress]; a != "" {
			return a, true
		}
		if host, _, err := net.SplitHostPort(labels[LabelRegistry]); err == nil && host != "" {
			return host, true
		}
	}
	return "127.0.0.1", e.listenTCP
}

// checkName keeps node and service names usable as file names.
func checkName(what, s string) error {
	bad := s == "" || s == "." || s == ".." || len(s) > 253
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("transport: %s %q must be 1 to 253 letters, digits, '-', '_' or '.'", what, s)
	}
	return nil
}

// The registry: a line protocol on TCP, "lookup <node> <service>\n"
// answered by "ok <host:port>\n" or "error <why>\n".

// startRegistry serves this node's registry if the topology gives it an
// address; when another process on the host already does, it retries in
// the background so the registry outlives whichever process serves it.
func (e *Endpoint) startRegistry() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.listeners++
	if e.regAddr == "" || e.regStop != nil || e.closed {
		return
	}
	e.regStop = make(chan struct{})
	stop := e.regStop
	go func() {
		for {
			l, err := net.Listen("tcp", e.regAddr)
			if err == nil {
				e.mu.Lock()
				if deadline.IsClosed(stop) {
					e.mu.Unlock()
					l.Close()
					return
				}
				e.reg = l
				e.mu.Unlock()
				e.serveRegistry(l, stop)
			} else {
				// Usually another process of this host serves it.
				e.log.Debug("transport: the registry's address is taken; retrying", "node", e.node, "addr", e.regAddr, "err", err)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
}

// listenerGone stops serving the registry with the endpoint's last
// listener.
func (e *Endpoint) listenerGone() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.listeners--
	if e.listeners == 0 {
		e.stopRegistryLocked()
	}
}

func (e *Endpoint) stopRegistryLocked() {
	if e.regStop != nil {
		close(e.regStop)
		e.regStop = nil
	}
	if e.reg != nil {
		e.reg.Close()
		e.reg = nil
	}
}

// Bounds on the lookups a registry answers at once, in total and per
// source; beyond them, silent askers are cut short as a listener's silent
// dialers are (see gate).
const (
	maxRegistryLookups          = 64
	maxRegistryLookupsPerSource = 16
)

func (e *Endpoint) serveRegistry(l net.Listener, stop <-chan struct{}) {
	g := newGate(maxRegistryLookups, maxRegistryLookupsPerSource)
	for {
		c, err := l.Accept()
		if err != nil {
			select {
			case <-stop:
			default:
				e.log.Warn("transport: the registry stopped accepting; listening again", "node", e.node, "addr", e.regAddr, "err", err)
			}
			return
		}
		src := c.RemoteAddr().String()
		if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			src = ipSource(ta.AddrPort().Addr())
		}
		h := g.enter(src, c, stop)
		if h == nil {
			c.Close()
			return
		}
		go func() {
			defer g.leave(h)
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Second))
			line, err := readLine(c, 600)
			if err != nil {
				return
			}
			f := strings.Fields(line)
			if len(f) != 3 || f[0] != "lookup" {
				fmt.Fprintf(c, "error bad request\n")
				return
			}
			if checkName("node", f[1]) != nil || checkName("service", f[2]) != nil {
				fmt.Fprintf(c, "error bad name\n")
				return
			}
			b, err := os.ReadFile(e.tcpFile(Addr{Node: f[1], Service: f[2]}))
			if err != nil {
				fmt.Fprintf(c, "error no service %s on node %s here\n", f[2], f[1])
				return
			}
			fmt.Fprintf(c, "ok %s\n", strings.TrimSpace(string(b)))
		}()
	}
}

// readLine reads up to a newline, at most max bytes, one byte at a time
// (the connection carries nothing after it that must not be consumed).
func readLine(c net.Conn, max int) (string, error) {
	var b []byte
	var one [1]byte
	for len(b) < max {
		if _, err := c.Read(one[:]); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return "", errors.New("transport: registry line too long")
}

// lookup asks node's registry where service listens for remote dialers.
func (e *Endpoint) lookup(ctx context.Context, a Addr) (string, error) {
	if b, err := os.ReadFile(e.tcpFile(a)); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	reg := e.registryAddr(a.Node)
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", reg)
	if err != nil {
		return "", fmt.Errorf("transport: registry of node %s at %s (topology label %s): %w", a.Node, reg, LabelRegistry, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(handshakeTimeout))
	}
	if _, err := fmt.Fprintf(c, "lookup %s %s\n", a.Node, a.Service); err != nil {
		return "", err
	}
	line, err := readLine(c, 600)
	if err != nil {
		return "", fmt.Errorf("transport: registry of node %s at %s: %w", a.Node, reg, err)
	}
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		return rest, nil
	}
	return "", fmt.Errorf("transport: registry of node %s at %s: %s", a.Node, reg, strings.TrimPrefix(line, "error "))
}

// Sweep removes registry entries on this host whose listener died without
// closing them (a killed process), and returns how many it removed.
// Listen replaces a stale entry anyway; Sweep keeps the directory tidy.
func (e *Endpoint) Sweep() (int, error) {
	socks, err := filepath.Glob(filepath.Join(e.dir, "*", "*.sock"))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range socks {
		c, err := net.DialTimeout("unix", s, time.Second)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, shm.ErrConnRefused) {
			os.Remove(s)
			os.Remove(strings.TrimSuffix(s, ".sock") + ".tcp")
			n++
		}
	}
	return n, nil
}
