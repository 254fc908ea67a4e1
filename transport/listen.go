package transport

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Listener accepts connections for one service, on every path: a
// rendezvous socket in this host's registry for dialers on this host, and
// a TCP socket for dialers on other hosts. It is a net.Listener.
type Listener struct {
	ep      *Endpoint
	addr    Addr
	ul      *net.UnixListener
	tl      *net.TCPListener
	tcpFile string
	once    sync.Once
	conns   chan *Conn
	done    chan struct{}
	slots   chan struct{} // handshakes in progress
	wg      sync.WaitGroup
}

// maxHandshakes bounds a listener's handshakes in progress.
const maxHandshakes = 128

// handshakeTimeout bounds a dialer's handshake, so a silent or stopped one
// holds nobody up.
const handshakeTimeout = 5 * time.Second

// The first byte a dialer sends says which path it wants.
const (
	helloShm = 'S'
	helloUB  = 'U'
	helloTCP = 'T'
	accepted = 'A'
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
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil && errors.Is(err, syscall.EADDRINUSE) {
		// Someone listens, or a dead listener left its socket behind: only
		// a refused connection proves the latter.
		c, derr := net.Dial("unix", path)
		if derr == nil {
			c.Close()
		}
		if !errors.Is(derr, syscall.ECONNREFUSED) {
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
	tl, err := lc.Listen(ctx, "tcp", net.JoinHostPort(e.listenHost(), "0"))
	if err != nil {
		ul.Close()
		return nil, fmt.Errorf("transport: listen on %s for other hosts: %w", a, err)
	}
	ln := &Listener{ep: e, addr: a, ul: ul, tl: tl.(*net.TCPListener), tcpFile: e.tcpFile(a),
		conns: make(chan *Conn), done: make(chan struct{}), slots: make(chan struct{}, maxHandshakes)}
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
	ln.wg.Add(2)
	go ln.acceptLoop(func() (net.Conn, error) { return ln.ul.AcceptUnix() })
	go ln.acceptLoop(func() (net.Conn, error) { return ln.tl.AcceptTCP() })
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
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		// Bound the handshakes in progress: each holds memory until it
		// finishes or times out.
		select {
		case l.slots <- struct{}{}:
		default:
			nc.Close()
			continue
		}
		go func() {
			defer func() { <-l.slots }()
			nc.SetDeadline(time.Now().Add(handshakeTimeout))
			c, keep, err := l.handshake(nc)
			if !keep || err != nil {
				nc.Close()
			}
			if err != nil {
				return // a bad dialer does not stop the listener
			}
			select {
			case l.conns <- c:
			case <-l.done:
				c.Close()
			}
		}()
	}
}

// handshake sets up the connection the dialer asks for; keep says whether
// the socket stays with it.
func (l *Listener) handshake(nc net.Conn) (c *Conn, keep bool, err error) {
	if uc, ok := nc.(*net.UnixConn); ok {
		if err := checkPeer(uc, l.ep.allow); err != nil {
			return nil, false, err
		}
	}
	var kind [1]byte
	if _, err := io.ReadFull(nc, kind[:]); err != nil {
		return nil, false, err
	}
	uc, isUnix := nc.(*net.UnixConn)
	switch {
	case kind[0] == helloShm && isUnix:
		sc, err := acceptShm(uc, l.addr)
		if err != nil {
			return nil, false, err
		}
		return &Conn{c: sc, path: PathShm}, false, nil
	case kind[0] == helloUB:
		c, err := l.acceptUB(nc)
		return c, err == nil, err
	case kind[0] == helloTCP && !isUnix:
		node, err := readLine(nc, 300)
		if err != nil {
			return nil, false, err
		}
		if err := checkName("node", node); err != nil {
			return nil, false, err
		}
		if _, err := nc.Write([]byte{accepted}); err != nil {
			return nil, false, err
		}
		nc.SetDeadline(time.Time{})
		pc := newPktConn(newTCPLink(nc), l.addr, Addr{Node: node, Service: l.addr.Service + "-peer"}, l.ep.flow)
		return &Conn{c: pc, path: PathTCP}, true, nil
	}
	return nil, false, fmt.Errorf("transport: unknown path request %q", kind[0])
}

// acceptUB answers a dialer's hello with this side's, over the socket.
func (l *Listener) acceptUB(ctl net.Conn) (*Conn, error) {
	peer, err := readHello(ctl)
	if err != nil {
		return nil, err
	}
	refuse := func(err error) (*Conn, error) {
		writeHello(ctl, ubHello{Err: err.Error()})
		return nil, err
	}
	if err := checkName("node", peer.Node); err != nil {
		return refuse(err)
	}
	uctx, err := l.ep.ubContext(context.Background())
	if err != nil {
		return refuse(err)
	}
	if peer.Provider != uctx.Provider() {
		return refuse(fmt.Errorf("transport: ub path: the dialer uses provider %q, node %s uses %q", peer.Provider, l.ep.node, uctx.Provider()))
	}
	lk, mine, err := newUBLink(uctx, ctl)
	if err != nil {
		return refuse(err)
	}
	mine.Node = l.ep.node
	if err := writeHello(ctl, mine); err != nil {
		lk.release()
		return nil, err
	}
	if err := lk.connect(uctx, peer); err != nil {
		lk.release()
		return nil, err
	}
	pc := newPktConn(lk, l.addr, Addr{Node: peer.Node, Service: l.addr.Service + "-peer"}, l.ep.flow)
	return &Conn{c: pc, path: PathUB}, nil
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
		err = errors.Join(l.ul.Close(), l.tl.Close())
		os.Remove(l.tcpFile)
		l.ep.listenerGone()
	})
	return err
}

// Accept waits for a dialer that has completed its handshake.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "ub", Addr: l.addr, Err: net.ErrClosed}
	}
}

// checkPeer refuses a dialer that runs as another user, unless allowed.
func checkPeer(uc *net.UnixConn, allow []int) error {
	raw, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil {
		return err
	}
	if cerr != nil {
		return cerr
	}
	if int(cred.Uid) != os.Geteuid() && !slices.Contains(allow, int(cred.Uid)) {
		return fmt.Errorf("transport: refusing a dialer running as uid %d", cred.Uid)
	}
	return nil
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
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s over %s: %w", a, path, err)
	}
	return c, nil
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
		// This host's registry first, then the node's.
		nc, err = d.DialContext(ctx, "unix", e.socketPath(a))
		if err != nil {
			var where string
			if where, err = e.lookup(ctx, a); err == nil {
				nc, err = d.DialContext(ctx, "tcp", where)
			}
		}
	case PathTCP:
		var where string
		if where, err = e.lookup(ctx, a); err == nil {
			nc, err = d.DialContext(ctx, "tcp", where)
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
	if uc, ok := nc.(*net.UnixConn); ok {
		// The listener must be this user too (or one allowed): the
		// registry is a directory, and the dialer hands over memory.
		if err := checkPeer(uc, e.allow); err != nil {
			nc.Close()
			return nil, err
		}
	}
	// A cancelled ctx ends the handshake too; once it is done, a late
	// cancellation must not reach the live connection.
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	c, err := e.handshake(ctx, nc, a, path)
	if !stop() && err == nil {
		c.Close()
		return nil, ctx.Err()
	}
	return c, err
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
	if _, err := fmt.Fprintf(nc, "%c%s\n", helloTCP, e.node); err != nil {
		nc.Close()
		return nil, err
	}
	var ok [1]byte
	if _, err := io.ReadFull(nc, ok[:]); err != nil || ok[0] != accepted {
		nc.Close()
		return nil, fmt.Errorf("not accepted: %v", err)
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
		err = errors.New(peer.Err)
	}
	if err == nil {
		err = lk.connect(uctx, peer)
	}
	if err != nil {
		lk.release()
		return nil, err
	}
	return &Conn{c: newPktConn(lk, local, a, e.flow), path: PathUB, dialed: true}, nil
}
