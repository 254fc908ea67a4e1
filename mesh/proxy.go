package mesh

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/ubkit-io/ubkit/transport"
)

// ProxyService is the transport service node proxies accept hops on.
const ProxyService = "ubkit-proxy"

// ProxyConfig configures one node's proxy.
type ProxyConfig struct {
	// Endpoint is this node's transport endpoint. Required.
	Endpoint *transport.Endpoint
	// SuperNode names the super node (the certificates' trust domain).
	SuperNode string
	// Cert is this node's certificate from the mesh CA; Roots verifies
	// the other proxies'. Required: every hop is mutual TLS.
	Cert  tls.Certificate
	Roots *x509.CertPool
	// Registry gives the services and their endpoints.
	Registry Registry
	// Allow lists, per service, the nodes whose proxies may reach it; a
	// service not listed may be reached from any node of the super node.
	Allow map[string][]string
	// Logger gets what the proxy has to say that no call returns:
	// connections it could not carry and hops it refused (at Warn), hops
	// whose handshake failed (at Debug). Default: nothing is logged.
	Logger *slog.Logger
}

// NodeProxy is the one proxy of a node (ambient style: per node, not per
// pod). Applications talk plain TCP to it, on a local listener per service;
// it hands a connection to a backend on its own node directly, and to one
// on another node through that node's proxy, over the bus with mutual TLS.
type NodeProxy struct {
	cfg  ProxyConfig
	hops net.Listener
	log  *slog.Logger

	mu     sync.Mutex
	ls     []net.Listener
	open   map[string]net.Listener // from the control plane, by service
	conns  map[net.Conn]struct{}
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// NewNodeProxy starts accepting hops from other nodes' proxies.
func NewNodeProxy(ctx context.Context, cfg ProxyConfig) (*NodeProxy, error) {
	if cfg.Endpoint == nil || cfg.Registry == nil || cfg.Roots == nil || len(cfg.Cert.Certificate) == 0 {
		return nil, errors.New("mesh: a node proxy needs an Endpoint, a Registry, a certificate and the CA's roots")
	}
	l, err := cfg.Endpoint.Listen(ctx, "ub:///"+ProxyService)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &NodeProxy{cfg: cfg, hops: l, log: log, conns: map[net.Conn]struct{}{}, open: map[string]net.Listener{}, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptHops()
	if src, ok := cfg.Registry.(listenerSource); ok {
		p.sync(src)
		p.wg.Add(1)
		go p.follow(src)
	}
	return p, nil
}

// listenerSource is a registry that also says where a node proxy listens
// for each service (XDSRegistry: LDS).
type listenerSource interface {
	ProxyListeners() map[string]string
}

// follow opens and closes service listeners as the control plane says.
func (p *NodeProxy) follow(src listenerSource) {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-p.cfg.Registry.Changed():
			p.sync(src)
		}
	}
}

func (p *NodeProxy) sync(src listenerSource) {
	want := src.ProxyListeners()
	p.mu.Lock()
	var stale []net.Listener
	for svc, l := range p.open {
		if want[svc] != l.Addr().String() {
			stale = append(stale, l)
			delete(p.open, svc)
		}
	}
	var add []string
	for svc := range want {
		if p.open[svc] == nil {
			add = append(add, svc)
		}
	}
	p.mu.Unlock()
	for _, l := range stale {
		l.Close()
	}
	for _, svc := range add {
		l, err := p.ListenService(svc, want[svc])
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("mesh: could not open the listener the control plane asked for", "node", p.cfg.Endpoint.Node(), "service", svc, "addr", want[svc], "err", err)
			}
			continue
		}
		p.mu.Lock()
		p.open[svc] = l
		p.mu.Unlock()
	}
}

// Listening returns the listeners the control plane had this proxy open,
// by service.
func (p *NodeProxy) Listening() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for svc, l := range p.open {
		out[svc] = l.Addr().String()
	}
	return out
}

// ListenService opens a local listener (addr, e.g. "127.0.0.1:0") that
// carries connections to service.
func (p *NodeProxy) ListenService(service, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return nil, net.ErrClosed
	}
	p.ls = append(p.ls, l)
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					p.log.Warn("mesh: a service listener stopped accepting", "node", p.cfg.Endpoint.Node(), "service", service, "addr", l.Addr().String(), "err", err)
				}
				return
			}
			p.serve(c, func() { p.outbound(c, service) })
		}
	}()
	return l, nil
}

// Close stops the proxy and its connections.
func (p *NodeProxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		close(p.stop)
	}
	p.closed = true
	for _, l := range p.ls {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.hops.Close()
	p.wg.Wait()
	return err
}

// track registers a second leg of a served connection so Close ends it.
func (p *NodeProxy) track(c net.Conn) (untrack func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		return func() {}
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	return func() { p.mu.Lock(); delete(p.conns, c); p.mu.Unlock() }
}

// serve runs f for connection c, tracked so Close can end it.
func (p *NodeProxy) serve(c net.Conn, f func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer func() {
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
			c.Close()
		}()
		f()
	}()
}

// pick chooses an instance of service: one on this node if there is one, else
// one on the node the topology reaches most cheaply.
func (p *NodeProxy) pick(service string) (Instance, error) {
	services, err := p.cfg.Registry.Services(context.Background())
	if err != nil {
		return Instance{}, err
	}
	self, topo := p.cfg.Endpoint.Node(), p.cfg.Endpoint.Topology()
	var best Instance
	bestCost := time.Duration(-1)
	for _, s := range services {
		if s.Name != service {
			continue
		}
		for _, e := range s.Instances {
			cost := time.Duration(0)
			if e.Node != self {
				c, err := topo.PathCost(self, e.Node, 1024)
				if err != nil {
					continue // not in the super node: not reachable through a proxy
				}
				cost = c.Transfer
			}
			if bestCost < 0 || cost < bestCost {
				best, bestCost = e, cost
			}
		}
	}
	if bestCost < 0 {
		return Instance{}, fmt.Errorf("mesh: no instance of %s in super node %s", service, p.cfg.SuperNode)
	}
	return best, nil
}

// outbound carries an application's connection to service; when it
// cannot, the application's connection closes and the log says why.
func (p *NodeProxy) outbound(app net.Conn, service string) {
	e, err := p.pick(service)
	if err != nil {
		p.log.Warn("mesh: could not carry a connection", "node", p.cfg.Endpoint.Node(), "service", service, "err", err)
		return
	}
	fail := func(err error) {
		level := slog.LevelWarn
		select {
		case <-p.stop:
			level = slog.LevelDebug // cut short by Close
		default:
		}
		p.log.Log(context.Background(), level, "mesh: could not carry a connection", "node", p.cfg.Endpoint.Node(), "service", service,
			"instance", e.Address, "instance_node", e.Node, "err", err)
	}
	if e.Node == p.cfg.Endpoint.Node() {
		be, err := net.DialTimeout("tcp", e.Address, 5*time.Second)
		if err != nil {
			fail(err)
			return
		}
		defer be.Close()
		defer p.track(be)()
		splice(app, be)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	hop, err := p.dialHop(ctx, e.Node)
	cancel()
	if err != nil {
		fail(fmt.Errorf("hop to node %s's proxy: %w", e.Node, err))
		return
	}
	defer hop.Close()
	defer p.track(hop)()
	hop.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(hop, formatHopRequest(service, e.Address)); err != nil {
		fail(fmt.Errorf("hop to node %s's proxy: %w", e.Node, err))
		return
	}
	line, err := readLine(hop)
	if err != nil {
		fail(fmt.Errorf("hop to node %s's proxy: %w", e.Node, err))
		return
	}
	if line != "ok" {
		fail(fmt.Errorf("node %s's proxy answered %q", e.Node, line))
		return
	}
	hop.SetDeadline(time.Time{})
	splice(app, hop)
}

// dialHop opens a mutual-TLS hop to node's proxy, checking that the
// certificate it presents is that node's.
func (p *NodeProxy) dialHop(ctx context.Context, node string) (*tls.Conn, error) {
	c, err := p.cfg.Endpoint.Dial(ctx, "ub://"+node+"/"+ProxyService)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, &tls.Config{
		Certificates: []tls.Certificate{p.cfg.Cert},
		RootCAs:      p.cfg.Roots,
		ServerName:   node,
		MinVersion:   tls.VersionTLS13,
		// Identities are SPIFFE URIs, not host names.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if err := verifyChain(cs, p.cfg.Roots, x509.ExtKeyUsageServerAuth); err != nil {
				return err
			}
			got, err := peerNode(cs, p.cfg.SuperNode)
			if err == nil && got != node {
				err = fmt.Errorf("mesh: dialed node %s's proxy, its certificate names %s", node, got)
			}
			return err
		},
	})
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

func verifyChain(cs tls.ConnectionState, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("mesh: the peer presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

func (p *NodeProxy) acceptHops() {
	defer p.wg.Done()
	cfg := &tls.Config{
		Certificates: []tls.Certificate{p.cfg.Cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.cfg.Roots,
		MinVersion:   tls.VersionTLS13,
	}
	for {
		c, err := p.hops.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.log.Warn("mesh: the proxy stopped accepting hops", "node", p.cfg.Endpoint.Node(), "err", err)
			}
			return
		}
		p.serve(c, func() { p.inbound(tls.Server(c, cfg)) })
	}
}

// inbound serves a hop: a verified peer node, an allowed service, and an
// endpoint of that service on this node.
func (p *NodeProxy) inbound(tc *tls.Conn) {
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		// No valid credentials: refused.
		p.log.Debug("mesh: a hop's handshake failed", "node", p.cfg.Endpoint.Node(), "err", err)
		return
	}
	// refuse answers the hop with why it is refused, and logs it.
	refuse := func(from, answer string) {
		p.log.Warn("mesh: refused a hop", "node", p.cfg.Endpoint.Node(), "from", from, "answer", answer)
		io.WriteString(tc, answer+"\n")
	}
	from, err := peerNode(tc.ConnectionState(), p.cfg.SuperNode)
	if err != nil {
		refuse("", fmt.Sprintf("denied: %v", err))
		return
	}
	line, err := readLine(tc)
	if err != nil {
		p.log.Debug("mesh: a hop sent no request", "node", p.cfg.Endpoint.Node(), "from", from, "err", err)
		return
	}
	service, addr, err := parseHopRequest(line)
	if err != nil {
		refuse(from, fmt.Sprintf("denied: %v", err))
		return
	}
	if allowed, listed := p.cfg.Allow[service]; listed && !slices.Contains(allowed, from) {
		refuse(from, fmt.Sprintf("denied: node %s may not reach %s", from, service))
		return
	}
	if !p.local(service, addr) {
		refuse(from, fmt.Sprintf("denied: %s is no endpoint of %s on node %s", addr, service, p.cfg.Endpoint.Node()))
		return
	}
	be, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		refuse(from, fmt.Sprintf("unavailable: %v", err))
		return
	}
	defer be.Close()
	defer p.track(be)()
	if _, err := io.WriteString(tc, "ok\n"); err != nil {
		return
	}
	tc.SetDeadline(time.Time{})
	splice(tc, be)
}

// local says whether addr is an instance of service on this node: a proxy
// only hands hops to its own node's backends.
func (p *NodeProxy) local(service, addr string) bool {
	services, err := p.cfg.Registry.Services(context.Background())
	if err != nil {
		return false
	}
	for _, s := range services {
		if s.Name == service {
			for _, e := range s.Instances {
				if e.Address == addr && e.Node == p.cfg.Endpoint.Node() {
					return true
				}
			}
		}
	}
	return false
}

// A hop opens with one line from the dialing proxy, "service host:port\n":
// the service, and the endpoint of it on the far node the hop is for. The
// far proxy answers "ok\n", or a line saying why not, and closes.
func formatHopRequest(service, addr string) string { return service + " " + addr + "\n" }

// parseHopRequest reads a hop's request line (without its newline). It
// comes from a peer that holds a certificate of the mesh, but nothing else
// about it is trusted.
func parseHopRequest(line string) (service, addr string, err error) {
	service, addr, ok := strings.Cut(line, " ")
	switch {
	case !ok:
		return "", "", errors.New("malformed request: want \"service host:port\"")
	case service == "" || strings.IndexFunc(service, notPrintable) >= 0:
		return "", "", fmt.Errorf("malformed request: service %q", service)
	}
	if err := checkHostPort(addr); err != nil {
		return "", "", fmt.Errorf("malformed request: %w", err)
	}
	return service, addr, nil
}

// notPrintable is true for spaces, control characters and anything else
// that has no place in a service name or an address.
func notPrintable(r rune) bool { return r <= ' ' || r == 0x7f || !unicode.IsPrint(r) }

func readLine(c net.Conn) (string, error) {
	var b []byte
	var one [1]byte
	for len(b) < 1024 {
		if _, err := c.Read(one[:]); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return "", errors.New("mesh: line too long")
}

// splice copies both ways until either side ends, passing half-closes on.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}
