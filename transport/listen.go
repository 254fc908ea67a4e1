package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// Listener accepts connections for one service. It is a net.Listener.
type Listener struct {
	addr  Addr
	path  string
	l     *net.UnixListener
	once  sync.Once
	conns chan *Conn
	done  chan struct{}
	err   error // why accepting stopped (set before done closes)
}

// handshakeTimeout bounds a dialer's handshake, so a silent or stopped one
// holds nobody up.
const handshakeTimeout = 5 * time.Second

var _ net.Listener = (*Listener)(nil)

// Listen listens on addr, "ub://<node>/<service>", creating the service's
// rendezvous socket. A stale socket left by a dead listener is replaced; a
// live one makes Listen fail.
func Listen(ctx context.Context, addr string) (*Listener, error) {
	a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(RuntimeDir(), 0o700); err != nil {
		return nil, fmt.Errorf("transport: runtime directory: %w", err)
	}
	path := socketPath(a)
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
	ln := &Listener{addr: a, path: path, l: ul, conns: make(chan *Conn), done: make(chan struct{})}
	go ln.acceptLoop()
	return ln, nil
}

// acceptLoop takes dialers and runs each handshake on its own, so one slow
// dialer delays nobody else.
func (l *Listener) acceptLoop() {
	for {
		uc, err := l.l.AcceptUnix()
		if err != nil {
			l.err = err
			close(l.done)
			return
		}
		go func() {
			uc.SetDeadline(time.Now().Add(handshakeTimeout))
			c, err := l.handshake(uc)
			uc.Close()
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

// Addr returns the listener's address.
func (l *Listener) Addr() net.Addr { return l.addr }

// Close stops listening and removes the rendezvous socket.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() { err = l.l.Close() })
	return err
}

// Accept waits for a dialer that has completed its handshake: it runs as
// this user and handed over the connection's shared memory.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

func (l *Listener) handshake(uc *net.UnixConn) (*Conn, error) {
	if err := checkPeer(uc); err != nil {
		return nil, err
	}
	seg, err := shm.ReceiveSegment(uc, nil)
	if err != nil {
		return nil, err
	}
	// Then the read end of ring a's notification pipe and the write end of
	// ring b's.
	files, err := receiveFiles(uc, 2)
	if err != nil {
		seg.Close()
		return nil, err
	}
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	offA, offB, offCtl, _ := ringOffsets()
	fail := func(err error) (*Conn, error) {
		closeFiles()
		seg.Close()
		return nil, err
	}
	ra, err := shm.OpenSPSC(seg, offA)
	if err != nil {
		return fail(err)
	}
	rb, err := shm.OpenSPSC(seg, offB)
	if err != nil {
		return fail(err)
	}
	waitA, err := seg.Uint32At(offCtl)
	if err != nil {
		return fail(err)
	}
	waitB, err := seg.Uint32At(offCtl + 128)
	if err != nil {
		return fail(err)
	}
	cons, err := ra.Consumer(shm.Wait{})
	if err != nil {
		return fail(err)
	}
	prod, err := rb.Producer(shm.Wait{})
	if err != nil {
		cons.Close()
		return fail(err)
	}
	msgs, err := attachMessages(seg, offCtl+256, false)
	if err != nil {
		prod.Close()
		cons.Close()
		return fail(err)
	}
	// Tell the dialer its connection is accepted.
	if _, err := uc.Write([]byte{1}); err != nil {
		msgs.close()
		prod.Close()
		cons.Close()
		return fail(err)
	}
	c := newConn(seg, prod, cons, waitA, waitB, files[0], files[1], l.addr, Addr{Node: l.addr.Node, Service: l.addr.Service + "-peer"})
	c.msgs = msgs
	return c, nil
}

// checkPeer refuses a dialer that runs as another user.
func checkPeer(uc *net.UnixConn) error {
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
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("transport: refusing a dialer running as uid %d", cred.Uid)
	}
	return nil
}

// Dial connects to addr, "ub://<node>/<service>", on this host: it makes
// the connection's rings in a sealed anonymous segment and hands it to the
// listener.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	a, err := ParseAddr(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socketPath(a))
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", a, err)
	}
	uc := nc.(*net.UnixConn)
	defer uc.Close()
	if dl, ok := ctx.Deadline(); ok {
		uc.SetDeadline(dl)
	}
	// A cancelled ctx ends the handshake too.
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	offA, offB, offCtl, _ := ringOffsets()
	_, _, _, size := messageLayout(offCtl + 256)
	seg, err := shm.CreateMemfd("transport", size, nil)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Conn, error) {
		seg.Close()
		return nil, fmt.Errorf("transport: dial %s: %w", a, err)
	}
	ra, err := shm.CreateSPSC(seg, offA, ringCapacity)
	if err != nil {
		return fail(err)
	}
	rb, err := shm.CreateSPSC(seg, offB, ringCapacity)
	if err != nil {
		return fail(err)
	}
	if err := createMessages(seg, offCtl+256); err != nil {
		return fail(err)
	}
	if err := seg.Seal(); err != nil {
		return fail(err)
	}
	prod, err := ra.Producer(shm.Wait{})
	if err != nil {
		return fail(err)
	}
	cons, err := rb.Consumer(shm.Wait{})
	if err != nil {
		prod.Close()
		return fail(err)
	}
	closeEnds := func(err error) (*Conn, error) {
		prod.Close()
		cons.Close()
		return fail(err)
	}
	// Notification pipes: a for ring a (we write, the listener reads), b
	// for ring b (the listener writes, we read).
	aR, aW, err := os.Pipe()
	if err != nil {
		return closeEnds(err)
	}
	bR, bW, err := os.Pipe()
	if err != nil {
		aR.Close()
		aW.Close()
		return closeEnds(err)
	}
	closePipes := func(err error) (*Conn, error) {
		for _, f := range []*os.File{aR, aW, bR, bW} {
			f.Close()
		}
		return closeEnds(err)
	}
	waitA, _ := seg.Uint32At(offCtl)
	waitB, _ := seg.Uint32At(offCtl + 128)
	if err := shm.SendSegment(uc, seg); err != nil {
		return closePipes(err)
	}
	if err := sendFiles(uc, aR, bW); err != nil {
		return closePipes(err)
	}
	var ok [1]byte
	if _, err := uc.Read(ok[:]); err != nil {
		return closePipes(fmt.Errorf("not accepted: %w", err))
	}
	// The listener holds its ends now.
	aR.Close()
	bW.Close()
	msgs, err := attachMessages(seg, offCtl+256, true)
	if err != nil {
		bR.Close()
		aW.Close()
		return closeEnds(err)
	}
	c := newConn(seg, prod, cons, waitB, waitA, bR, aW, Addr{Node: a.Node, Service: a.Service + "-peer"}, a)
	c.msgs, c.dialed = msgs, true
	return c, nil
}
