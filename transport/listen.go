package transport

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/internal/rundir"
	"github.com/ubkit-io/ubkit/shm"
)

// Listener accepts connections for one service, on every path: a
// rendezvous socket in this host's registry for dialers on this host, and,
// when the node can be reached from other hosts (or Config.ListenTCP asks
// for it), a TCP socket. It is a net.Listener.
type Listener struct {
	ep      *Endpoint
	addr    Addr
	ul      *net.UnixListener
	tl      *net.TCPListener // nil: no dialers from other hosts
	tcpFile string
	once    sync.Once
	conns   chan *Conn
	done    chan struct{}
	gate    *gate // handshakes in progress
	wg      sync.WaitGroup

	accepted, refusedUser, refusedAuth, failed atomic.Uint64
}

// Bounds on a listener's handshakes in progress: each holds a socket and a
// goroutine until it finishes or times out. A new dialer beyond a bound
// cuts short the oldest handshake of the source with the most (see gate).
const (
	maxHandshakes          = 512
	maxHandshakesPerSource = 64
)

// handshakeTimeout bounds a dialer's handshake, so a silent or stopped one
// holds nobody up. A variable only so that a test whose burst of TLS
// handshakes outlasts it on a loaded machine, and which is about
// something else, can raise it.
var handshakeTimeout = 5 * time.Second

// The first byte a dialer sends says which path it wants; helloTLS says
// that mutual TLS comes first, then one of the others inside it.
const (
	helloShm = 'S'
	helloUB  = 'U'
	helloTCP = 'T'
	helloTLS = 'L'
	accepted = 'A'
	refused  = 'R'
)

var _ net.Listener = (*Listener)(nil)

// Listen listens on addr with the default endpoint (see Default).
func Listen(ctx context.Context, addr string) (*Listener, error) {
	e, err := Default()
	if err != nil {
		return nil, err
	}
	return e.Listen(ctx, addr)
}

// Dial connects to addr with the default endpoint (see Default).
func Dial(ctx context.Context, addr string) (*Conn, error) {
	e, err := Default()
	if err != nil {
		return nil, err
	}
	return e.Dial(ctx, addr)
}

// Listen listens on addr, "ub://<node>/<service>", where the node is this
// endpoint's (or empty). A stale rendezvous socket left by a dead listener
// is replaced; a live one makes Listen fail.
func (e *Endpoint) Listen(ctx context.Context, addr string) (*Listener, error) {
	a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	a = e.resolve(a)
	if a.Node != e.node {
		return nil, fmt.Errorf("transport: listen on %s: this endpoint plays node %s", a, e.node)
	}
	a.Path = ""
	if err := e.ensureDirs(a.Node); err != nil {
		return nil, err
	}
	path := e.socketPath(a)
	if err := rundir.CheckSocketPath(path); err != nil {
		return nil, fmt.Errorf("transport: listen on %s: %w", a, err)
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil && errors.Is(err, shm.ErrAddrInUse) {
		// Someone listens, or a dead listener left its socket behind: only
		// a refused connection proves the latter.
		c, derr := net.Dial("unix", path)
		if derr == nil {
			c.Close()
		}
		if !errors.Is(derr, shm.ErrConnRefused) {
			return nil, fmt.Errorf("transport: %s is already being listened on", a)
		}
		os.Remove(path)
		l, err = lc.Listen(ctx, "unix", path)
	}
	if err != nil {
		return nil, fmt.Errorf("transport: listen on %s: %w", a, err)
	}
	ul := l.(*net.UnixListener)
	ul.SetUnlinkOnClose(true)
	ln := &Listener{ep: e, addr: a, ul: ul, tcpFile: e.tcpFile(a),
		conns: make(chan *Conn), done: make(chan struct{}), gate: newGate(maxHandshakes, maxHandshakesPerSource)}
	// A listener killed before its Close may have left its TCP entry.
	os.Remove(ln.tcpFile)
	if host, ok := e.remoteHost(); ok {
		tl, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			ul.Close()
			return nil, fmt.Errorf("transport: listen on %s for other hosts: %w", a, err)
		}
		ln.tl = tl.(*net.TCPListener)
		tmp := ln.tcpFile + ".tmp"
		err = os.WriteFile(tmp, []byte(tl.Addr().String()+"\n"), 0o600)
		if err == nil {
			err = os.Rename(tmp, ln.tcpFile)
		}
		if err != nil {
			ul.Close()
			tl.Close()
			return nil, fmt.Errorf("transport: registry entry of %s: %w", a, err)
		}
	}
	ln.wg.Add(1)
	go ln.acceptLoop(func() (net.Conn, error) { return ln.ul.AcceptUnix() })
	if ln.tl != nil {
		ln.wg.Add(1)
		go ln.acceptLoop(func() (net.Conn, error) { return ln.tl.AcceptTCP() })
	}
	e.startRegistry()
	return ln, nil
}

// acceptLoop takes dialers and runs each handshake on its own, so one slow
// dialer delays nobody else.
func (l *Listener) acceptLoop(accept func() (net.Conn, error)) {
	defer l.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		nc, err := accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, an aborted connection...: the listener
			// stays, as net/http's does, and tries again.
			l.ep.log.Warn("transport: accept failed; retrying", "addr", l.addr.String(), "retry", backoff, "err", err)
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		src, err := l.source(nc)
		if err != nil {
			l.refusedUser.Add(1)
			l.ep.log.Warn("transport: refused a dialer", "addr", l.addr.String(), "err", err)
			nc.Close()
			continue
		}
		h := l.gate.enter(src, nc, l.done)
		if h == nil {
			nc.Close()
			return
		}
		go func() {
			nc.SetDeadline(time.Now().Add(handshakeTimeout))
			c, keep, err := l.handshake(nc, h)
			if !l.gate.leave(h) {
				// Evicted: the socket is closed under the connection.
				if c != nil {
					c.Close()
				}
				nc.Close()
				return
			}
			if !keep || err != nil {
				nc.Close()
			}
			if err != nil {
				var re *refusal
				switch {
				case !errors.As(err, &re):
					l.failed.Add(1)
					l.ep.log.Debug("transport: a dialer's handshake failed", "addr", l.addr.String(), "from", src, "err", err)
				case re.user:
					l.refusedUser.Add(1)
					l.ep.log.Warn("transport: refused a dialer", "addr", l.addr.String(), "from", src, "err", err)
				default:
					l.refusedAuth.Add(1)
					l.ep.log.Warn("transport: refused a dialer", "addr", l.addr.String(), "from", src, "err", err)
				}
				return // a bad dialer does not stop the listener
			}
			l.accepted.Add(1)
			l.ep.log.Debug("transport: accepted", "addr", l.addr.String(), "peer", c.RemoteAddr().String(), "path", string(c.Path()), "from", src)
			select {
			case l.conns <- c:
			case <-l.done:
				c.Close()
			}
		}()
	}
}

// source names where a dialer comes from, for the bounds on handshakes in
// progress: a process on this host (the unix socket tells which, and a
// dialer running as another user is refused here at once), else an IP
// address (an IPv6 one by its /64, which one host usually has whole).
func (l *Listener) source(nc net.Conn) (string, error) {
	if uc, ok := nc.(*net.UnixConn); ok {
		cred, err := shm.PeerCredentials(uc)
		if err != nil {
			return "", err
		}
		if err := allowedUID(cred.UID, l.ep.allow); err != nil {
			return "", err
		}
		return "pid:" + strconv.Itoa(cred.PID), nil
	}
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return ipSource(ta.AddrPort().Addr()), nil
	}
	return nc.RemoteAddr().String(), nil
}

// ipSource keys an address for the per-source bounds.
func ipSource(a netip.Addr) string {
	a = a.Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "ip:" + p.String()
	}
	return "ip:" + a.String()
}

// refusal is a dialer the listener would not admit: another user on this
// host, or a dialer from another host that did not prove its node.
type refusal struct {
	user bool
	err  error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// handshake sets up the connection the dialer asks for; keep says whether
// the socket stays with it. A dialer over TCP, from this host or another,
// must first prove with mutual TLS which node it is: the user check of the
// unix socket has no equivalent on TCP that a dialer cannot dodge (a
// socket that closes at once leaves the kernel's table with no owner).
func (l *Listener) handshake(nc net.Conn, h *handshakeSlot) (c *Conn, keep bool, err error) {
	_, isUnix := nc.(*net.UnixConn)
	kind, err := readByte(nc)
	if err != nil {
		return nil, false, err
	}
	l.gate.spoke(h)
	authNode := "" // the node a verified certificate names
	if !isUnix {
		if kind != helloTLS {
			err := &refusal{err: fmt.Errorf("transport: refusing a TCP dialer from %s: it did not authenticate as a node of the super node (TLS with a certificate of its CA)", nc.RemoteAddr())}
			refuse(nc, kind, err)
			return nil, false, err
		}
		if l.ep.identity == nil {
			return nil, false, &refusal{err: fmt.Errorf("transport: a dialer from %s wants TLS, but node %s has no identity (Config.Identity)", nc.RemoteAddr(), l.ep.node)}
		}
		tc := tls.Server(nc, l.ep.identity.serverConfig())
		if err := tc.Handshake(); err != nil {
			return nil, false, &refusal{err: fmt.Errorf("transport: TLS with the dialer at %s: %w", nc.RemoteAddr(), err)}
		}
		// The chain was verified in the handshake (serverConfig).
		if authNode, err = certNode(tc.ConnectionState().PeerCertificates[0], l.ep.identity.SuperNode); err != nil {
			return nil, false, &refusal{err: err}
		}
		l.gate.trust(h)
		nc = tc
		if kind, err = readByte(nc); err != nil {
			return nil, false, err
		}
	}
	// claims checks who a dialer says it is, and what it dialed.
	claims := func(node, service string) error {
		if err := checkName("node", node); err != nil {
			return err
		}
		if authNode != "" && node != authNode {
			return &refusal{err: fmt.Errorf("transport: a dialer whose certificate names node %s claims to be node %s", authNode, node)}
		}
		if service != l.addr.Service {
			return fmt.Errorf("transport: a dialer for service %q reached %s", service, l.addr)
		}
		return nil
	}
	switch {
	case kind == helloShm && isUnix:
		sc, err := acceptShm(nc.(*net.UnixConn), l.addr)
		if err != nil {
			return nil, false, err
		}
		return &Conn{c: sc, path: PathShm}, false, nil
	case kind == helloUB:
		c, err := l.acceptUB(nc, claims)
		return c, err == nil, err
	case kind == helloTCP:
		line, err := readLine(nc, 600)
		if err != nil {
			return nil, false, err
		}
		node, service, _ := strings.Cut(line, "/")
		if err := claims(node, service); err != nil {
			refuse(nc, kind, err)
			return nil, false, err
		}
		if _, err := nc.Write([]byte{accepted}); err != nil {
			return nil, false, err
		}
		nc.SetDeadline(time.Time{})
		pc := newPktConn(newTCPLink(nc), l.addr, Addr{Node: node, Service: l.addr.Service + "-peer"}, l.ep.flow)
		return &Conn{c: pc, path: PathTCP}, true, nil
	}
	return nil, false, fmt.Errorf("transport: unknown path request %q", kind)
}

// refuse tells a dialer why it is not admitted, where its path's protocol
// has room for it (the tcp and ub paths).
func refuse(nc net.Conn, kind byte, err error) {
	switch kind {
	case helloTCP:
		nc.Write(append([]byte{refused}, oneLine(err.Error())+"\n"...))
	case helloUB:
		if _, herr := readHello(nc); herr == nil {
			writeHello(nc, refusalHello(err))
		}
	}
}

// oneLine keeps a message on one line of at most 500 bytes.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 500 {
		s = strings.ToValidUTF8(s[:500], "")
	}
	return s
}

func readByte(c net.Conn) (byte, error) {
	var b [1]byte
	_, err := io.ReadFull(c, b[:])
	return b[0], err
}

// acceptUB answers a dialer's hello with this side's, over the socket.
func (l *Listener) acceptUB(ctl net.Conn, claims func(node, service string) error) (*Conn, error) {
	peer, err := readHello(ctl)
	if err != nil {
		return nil, err
	}
	refuse := func(err error) (*Conn, error) {
		writeHello(ctl, refusalHello(err))
		return nil, err
	}
	if err := claims(peer.Node, peer.Service); err != nil {
		return refuse(err)
	}
	uctx, err := l.ep.ubContext(context.Background())
	if err != nil {
		return refuse(err)
	}
	if peer.Provider != uctx.Provider() {
		return refuse(fmt.Errorf("transport: ub path: the dialer uses provider %q, node %s uses %q", peer.Provider, l.ep.node, uctx.Provider()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	err = checkHome(ctx, uctx, ctl, peer)
	cancel()
	if err != nil {
		return refuse(err)
	}
	lk, mine, err := newUBLink(uctx, ctl)
	if err != nil {
		return refuse(err)
	}
	// The dialer's half is imported before this side answers: a failure
	// is then this side's refusal, which says why, and not the dialer's
	// import of a half that this side released meanwhile.
	if err := lk.importPeer(uctx, peer); err != nil {
		refuse(err)
		lk.release()
		return nil, err
	}
	mine.Node = l.ep.node
	if err := writeHello(ctl, mine); err != nil {
		lk.release()
		return nil, err
	}
	if err := lk.ready(); err != nil {
		lk.release()
		return nil, err
	}
	pc, err := l.ep.ubConn(lk, l.addr, Addr{Node: peer.Node, Service: l.addr.Service + "-peer"})
	if err != nil {
		return nil, err
	}
	return &Conn{c: pc, path: PathUB, dev: uctx}, nil
}

func writeHello(c net.Conn, h ubHello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	_, err = c.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(b))))
	if err == nil {
		_, err = c.Write(b)
	}
	return err
}

func readHello(c net.Conn) (ubHello, error) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return ubHello{}, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > 64<<10 {
		return ubHello{}, fmt.Errorf("transport: ub path: a hello of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		return ubHello{}, err
	}
	var h ubHello
	if err := json.Unmarshal(b, &h); err != nil {
		return ubHello{}, fmt.Errorf("transport: ub path: malformed hello: %w", err)
	}
	return h, nil
}

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops listening and removes the service from the registry.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.done)
		err = l.ul.Close()
		if l.tl != nil {
			err = errors.Join(err, l.tl.Close())
			os.Remove(l.tcpFile)
		}
		l.ep.listenerGone()
	})
	return err
}

// ListenerStats counts what a listener did with its dialers.
type ListenerStats struct {
	// Accepted counts handshakes completed.
	Accepted uint64
	// InProgress is the number of handshakes under way.
	InProgress int
	// RefusedUser counts dialers on this host running as a user the
	// endpoint does not admit (Config.AllowUIDs).
	RefusedUser uint64
	// RefusedAuth counts dialers from other hosts that did not prove with
	// the super node's certificates which node they are.
	RefusedAuth uint64
	// Evicted counts handshakes cut short to make room for newer dialers
	// (the oldest of the source with the most in progress).
	Evicted uint64
	// Failed counts handshakes that failed otherwise: a malformed
	// request, a timeout, a dialer that went away.
	Failed uint64
}

// Stats returns the listener's counters.
func (l *Listener) Stats() ListenerStats {
	in, ev := l.gate.counts()
	return ListenerStats{Accepted: l.accepted.Load(), InProgress: in, RefusedUser: l.refusedUser.Load(),
		RefusedAuth: l.refusedAuth.Load(), Evicted: ev, Failed: l.failed.Load()}
}

// Accept waits for a dialer that has completed its handshake: net.Listener's
// Accept, a *Conn underneath.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptConn(context.Background())
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptConn is Accept returning the *Conn (its path, messages and
// sessions without a type assertion), until ctx ends or the listener
// closes.
func (l *Listener) AcceptConn(ctx context.Context) (*Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "ub", Addr: l.addr, Err: net.ErrClosed}
	case <-ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: "ub", Addr: l.addr, Err: ctx.Err()}
	}
}

// checkPeer refuses a dialer that runs as another user, unless allowed.
func checkPeer(uc *net.UnixConn, allow []int) error {
	cred, err := shm.PeerCredentials(uc)
	if err != nil {
		return err
	}
	return allowedUID(cred.UID, allow)
}

// Dial connects to addr, "ub://<node>/<service>[?path=...]". The path is
// the address's, else the endpoint's forced one, else chosen: the
// endpoint's own node → shm; another compute node of its topology → ub;
// any other node → tcp (the node's registry says where).
func (e *Endpoint) Dial(ctx context.Context, addr string) (*Conn, error) {
	a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	a = e.resolve(a)
	path := e.choose(a)
	a.Path = ""
	c, err := e.dial(ctx, a, path)
	// A listener flooded by dialers that say nothing cuts short the
	// handshakes that have not spoken yet (its gate): on a loaded machine
	// that may be ours, which a second try gets through.
	for try := 1; err != nil && try <= dialRetries && cutShort(err); try++ {
		t := time.NewTimer(time.Duration(try) * 10 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("transport: dial %s over %s: %w (after %v)", a, path, ctx.Err(), err)
		}
		c, err = e.dial(ctx, a, path)
	}
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s over %s: %w", a, path, fdlimit.Hint(err))
	}
	return c, nil
}

// dialRetries is how many times Dial tries again after a listener cut its
// handshake short.
const dialRetries = 3

// cutShort says whether a handshake failed because the listener hung up
// before it answered, as its gate does to a handshake it evicts.
func cutShort(err error) bool {
	return errors.Is(err, shm.ErrConnReset) || errors.Is(err, shm.ErrBrokenPipe) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func (e *Endpoint) dial(ctx context.Context, a Addr, path Path) (*Conn, error) {
	var (
		nc  net.Conn
		err error
		d   net.Dialer
	)
	switch path {
	case PathShm:
		if a.Node != e.node {
			return nil, fmt.Errorf("the shm path reaches only this endpoint's node, %s", e.node)
		}
		nc, err = d.DialContext(ctx, "unix", e.socketPath(a))
	case PathUB:
		// This host's registry first, then the node's; but a dialer out
		// of descriptors says so, rather than what the other registry
		// answers.
		nc, err = d.DialContext(ctx, "unix", e.socketPath(a))
		if _, noFDs := fdlimit.Errno(err); err != nil && !noFDs {
			var where string
			if where, err = e.lookup(ctx, a); err == nil {
				nc, err = d.DialContext(ctx, "tcp", where)
			}
		}
	case PathTCP:
		// On this host: the listener's TCP socket if it opened one, else
		// its unix socket (the same packets, over a stream this host's
		// user check guards); elsewhere, where the node's registry says.
		if b, ferr := os.ReadFile(e.tcpFile(a)); ferr == nil {
			nc, err = d.DialContext(ctx, "tcp", strings.TrimSpace(string(b)))
		} else if nc, err = d.DialContext(ctx, "unix", e.socketPath(a)); err != nil {
			var where string
			if where, err = e.lookup(ctx, a); err == nil {
				nc, err = d.DialContext(ctx, "tcp", where)
			}
		}
	default:
		return nil, fmt.Errorf("unknown path %q", path)
	}
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	} else {
		nc.SetDeadline(time.Now().Add(handshakeTimeout))
	}
	// The listener must be this user too (or one allowed): the registry is
	// a directory, and the dialer hands over memory. One reached over TCP
	// must prove it is the node dialed.
	secure := false
	switch x := nc.(type) {
	case *net.UnixConn:
		err = checkPeer(x, e.allow)
	case *net.TCPConn:
		x.SetNoDelay(true)
		secure = true
		if e.identity == nil {
			err = fmt.Errorf("node %s listens on TCP (%s), and proving who we are there needs an identity (Config.Identity, or %s, %s and %s)", a.Node, nc.RemoteAddr(), EnvCert, EnvKey, EnvCA)
		}
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	// A cancelled ctx ends the handshake too; once it is done, a late
	// cancellation must not reach the live connection.
	raw := nc
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	if secure {
		nc, err = e.dialTLS(ctx, raw, a.Node)
	}
	var c *Conn
	if err == nil {
		c, err = e.handshake(ctx, nc, a, path)
	}
	if !stop() && err == nil {
		c.Close()
		return nil, ctx.Err()
	}
	return c, err
}

// dialTLS runs mutual TLS on a connection to a listener on another host,
// which must prove it is node.
func (e *Endpoint) dialTLS(ctx context.Context, nc net.Conn, node string) (net.Conn, error) {
	if _, err := nc.Write([]byte{helloTLS}); err != nil {
		nc.Close()
		return nil, err
	}
	tc := tls.Client(nc, e.identity.clientConfig(node))
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("TLS with node %s: %w", node, err)
	}
	return tc, nil
}

func (e *Endpoint) handshake(ctx context.Context, nc net.Conn, a Addr, path Path) (*Conn, error) {
	local := Addr{Node: e.node, Service: a.Service + "-peer"}
	switch path {
	case PathShm:
		defer nc.Close()
		if _, err := nc.Write([]byte{helloShm}); err != nil {
			return nil, err
		}
		sc, err := dialShm(nc.(*net.UnixConn), a)
		if err != nil {
			return nil, err
		}
		return &Conn{c: sc, path: PathShm, dialed: true}, nil
	case PathUB:
		c, err := e.dialUB(ctx, nc, local, a)
		if err != nil {
			nc.Close()
			return nil, err
		}
		return c, nil
	}
	if _, err := fmt.Fprintf(nc, "%c%s/%s\n", helloTCP, e.node, a.Service); err != nil {
		nc.Close()
		return nil, err
	}
	answer, err := readByte(nc)
	if err == nil && answer == refused {
		why, _ := readLine(nc, 600)
		err = errors.New(why)
	} else if err == nil && answer != accepted {
		err = fmt.Errorf("the listener answered %q", answer)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("not accepted: %w", err)
	}
	nc.SetDeadline(time.Time{})
	pc := newPktConn(newTCPLink(nc), local, a, e.flow)
	return &Conn{c: pc, path: PathTCP, dialed: true}, nil
}

func (e *Endpoint) dialUB(ctx context.Context, ctl net.Conn, local, a Addr) (*Conn, error) {
	uctx, err := e.ubContext(ctx)
	if err != nil {
		return nil, err
	}
	lk, mine, err := newUBLink(uctx, ctl)
	if err != nil {
		return nil, err
	}
	mine.Node, mine.Service = e.node, a.Service
	if _, err := ctl.Write([]byte{helloUB}); err != nil {
		lk.release()
		return nil, err
	}
	if err := writeHello(ctl, mine); err != nil {
		lk.release()
		return nil, err
	}
	peer, err := readHello(ctl)
	if err == nil && peer.Err != "" {
		err = peer.refused(a.Node)
	}
	if err == nil {
		err = checkHome(ctx, uctx, ctl, peer)
	}
	if err == nil {
		err = lk.importPeer(uctx, peer)
	}
	if err == nil {
		err = lk.ready()
	}
	if err != nil {
		lk.release()
		return nil, err
	}
	pc, err := e.ubConn(lk, local, a)
	if err != nil {
		return nil, err
	}
	return &Conn{c: pc, path: PathUB, dialed: true, dev: uctx}, nil
}

// allowedUID says whether a process of uid may talk to this endpoint on
// this host.
func allowedUID(uid int, allow []int) error {
	if uid != os.Geteuid() && !slices.Contains(allow, uid) {
		return fmt.Errorf("transport: refusing a peer running as uid %d (this process runs as uid %d; Config.AllowUIDs admits others)", uid, os.Geteuid())
	}
	return nil
}
