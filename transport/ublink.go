package transport

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport/internal/deadline"
	"github.com/ubkit-io/ubkit/ub"
)

// The ub path's geometry: each side posts ubDepth receive buffers of
// ubSize bytes in its segment, and sends from as many staging buffers.
const (
	ubDepth = 16
	ubSize  = 64 << 10
	ubHead  = 64 // the credit words, alone on their cache line
)

// Offsets of the credit words in a side's segment, which its peer adds
// to: receives reposted (the link's credit), then the connection's stream
// and message credit (see pktConn).
const (
	ubLinkCredit    = 0
	ubStreamCredit  = 8
	ubMessageCredit = 16
)

// Completion tags.
const (
	tagSend = iota + 1
	tagCredit
)

// ubLink carries packets over ub verbs, receive-side buffered as URMA
// wants it: each side posts receives into its own segment and the peer's
// sends land there; the receiver then returns credits by a one-sided
// fetch-and-add on a word in the sender's segment, which the sender reads
// locally. A packet is a SendImm whose immediate is its kind.
//
// The connection's rendezvous socket stays open beside it: the peer's
// process ending closes it, which is how a dead peer is noticed.
type ubLink struct {
	seg     ub.Segment
	credit  *atomic.Uint64    // receives the peer has reposted for us
	granted [2]*atomic.Uint64 // stream and message credit the peer gave us
	sq, rq  ub.CQ
	j       ub.Jetty // RC, bound to the peer: packets
	cq      ub.CQ
	cj      ub.Jetty // RM: credit returns, reaped by the receiving side
	peer    ub.Target
	peerSeg ub.RemoteSegment
	ctl     net.Conn

	intr     chan struct{}
	intrOnce sync.Once

	smu     sync.Mutex
	sent    uint64 // packets posted
	reaped  uint64 // their completions taken
	sendErr error
	wdl     *deadline.Deadline
	// Scratch for the calls into the provider, which take slices (an
	// array on the stack would escape through the interface): the
	// sender's (smu), and the receiving goroutine's.
	swr  [1]ub.WR
	sout [ubDepth]ub.Completion
	rwr  [1]ub.RecvWR
	// The credit returns' (cmu): the receiving goroutine returns the
	// link's, the connection's credit loop its own.
	cmu  sync.Mutex
	crwr [1]ub.WR
	cout [ubDepth]ub.Completion

	// Polling before a receive sleeps (see poller): bytes sent since the
	// receiving goroutine last waited (any goroutine adds), and received
	// (that goroutine's own).
	wroteSince atomic.Int64
	sendSeq    atomic.Uint64 // sends so far (a poll restarts its clock at one)
	readSince  int
	poll       poller
	// rparked says the receiving goroutine sleeps in the queue's wait
	// without polling: a send interrupts it (through rkick, the receive
	// queue if it is a ub.Interrupter), so that it polls for the answer.
	rparked atomic.Bool
	rkick   ub.Interrupter

	cur       int // the buffer recv returned last, or -1
	reposted  uint64
	received  uint64 // packets taken
	creditErr error  // credit returns failed: the peer released its side (cmu)
	credits   int    // credit returns not yet completed (cmu)
	comp      [1]ub.Completion
	rctx      context.Context
	rcancel   context.CancelFunc
	peerGone  atomic.Bool
	byeSeen   atomic.Bool   // the peer said goodbye on the socket...
	byeAfter  atomic.Uint64 // ...after this many packets
	shut      chan struct{}
	once      sync.Once
	linkErr   atomic.Pointer[brokenErr] // set when a fault of the path broke the link
}

// ubHello is what each side tells the other on the rendezvous socket.
type ubHello struct {
	Provider   string         `json:"provider"`
	Node       string         `json:"node"`
	Service    string         `json:"service,omitempty"`
	Jetty      ub.JettyDesc   `json:"jetty"`
	JettyToken ub.Token       `json:"jettyToken"`
	Seg        ub.SegmentDesc `json:"seg"`
	SegToken   ub.Token       `json:"segToken"`
	Depth      int            `json:"depth"`
	Size       int            `json:"size"`
	Err        string         `json:"err,omitempty"`
	// Errno is a refusal's cause when the dialer can act on it: EMFILE or
	// ENFILE, the listener out of file descriptors.
	Errno int `json:"errno,omitempty"`
}

// refusalHello is the hello that refuses the ub path for err.
func refusalHello(err error) ubHello {
	h := ubHello{Err: err.Error()}
	if errno, ok := fdlimit.Errno(err); ok {
		h.Errno = int(errno)
	}
	return h
}

// maxRefusal bounds the listener's words a dialer's error repeats.
const maxRefusal = 512

// refusedError is a listener's refusal of the ub path, as the dialer
// sees it: what the listener said (printable, and bounded: it comes from
// the peer) and, when the listener ran out of file descriptors, that
// cause (errors.Is matches its errno).
type refusedError struct {
	node, msg string
	cause     error
}

func (h ubHello) refused(node string) error {
	msg := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, h.Err)
	if len(msg) > maxRefusal {
		msg = strings.ToValidUTF8(msg[:maxRefusal], "") + "..."
	}
	return &refusedError{node: node, msg: msg, cause: fdlimit.Peer(h.Errno)}
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("transport: ub path: node %s refused it: %s", e.node, e.msg)
}

func (e *refusedError) Unwrap() error { return e.cause }

func randomToken() ub.Token {
	var b [4]byte
	rand.Read(b[:])
	return ub.Token(binary.LittleEndian.Uint32(b[:]) | 1)
}

// newUBLink makes this side's half: its segment, queues and jetties, and
// the hello that describes them.
func newUBLink(ctx ub.Context, ctl net.Conn) (*ubLink, ubHello, error) {
	l := &ubLink{ctl: ctl, cur: -1, wdl: deadline.New(), shut: make(chan struct{}), intr: make(chan struct{}),
		poll: poller{pays: readSpinMax}}
	fail := func(err error) (*ubLink, ubHello, error) {
		l.ctl = nil // the caller still answers on it
		l.release()
		return nil, ubHello{}, fmt.Errorf("transport: ub path: %w", err)
	}
	segToken, jToken := randomToken(), randomToken()
	var err error
	if l.seg, err = ctx.AllocSegment(ubHead+2*ubDepth*ubSize, ub.SegmentConfig{Access: ub.AccessAtomic, Token: segToken}); err != nil {
		return fail(err)
	}
	if l.credit, err = shm.WordIn(l.seg.Bytes(), ubLinkCredit); err != nil {
		return fail(err)
	}
	for k, off := range []int{ubStreamCredit, ubMessageCredit} {
		if l.granted[k], err = shm.WordIn(l.seg.Bytes(), off); err != nil {
			return fail(err)
		}
	}
	if l.sq, err = ctx.NewCQ(ub.CQConfig{}); err != nil {
		return fail(err)
	}
	if l.rq, err = ctx.NewCQ(ub.CQConfig{}); err != nil {
		return fail(err)
	}
	l.rkick, _ = l.rq.(ub.Interrupter)
	if l.cq, err = ctx.NewCQ(ub.CQConfig{}); err != nil {
		return fail(err)
	}
	if l.j, err = ctx.NewJetty(ub.JettyConfig{Mode: ub.ReliableConnection, SendCQ: l.sq, RecvCQ: l.rq,
		RecvDepth: ubDepth, MaxMessage: ubSize, Token: jToken}); err != nil {
		return fail(err)
	}
	if l.cj, err = ctx.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: l.cq, RecvCQ: l.cq, Token: randomToken()}); err != nil {
		return fail(err)
	}
	l.rctx, l.rcancel = context.WithCancel(context.Background())
	return l, ubHello{Provider: ctx.Provider(), Jetty: l.j.Desc(), JettyToken: jToken, Seg: l.seg.Desc(), SegToken: segToken,
		Depth: ubDepth, Size: ubSize}, nil
}

// homer is a ub context whose descriptors name the host that holds the
// object: the tcp provider's name the address of the context that made
// them.
type homer interface {
	Home(name string) (host string, err error)
}

// checkHome refuses a peer across hosts (ctl is a TLS connection) whose
// hello names objects on a host other than the one it speaks from: a node
// must not have this side write, on its behalf, into another's memory.
// On this host the unix socket's user check stands instead.
func checkHome(ctx context.Context, uctx ub.Context, ctl net.Conn, peer ubHello) error {
	h, ok := uctx.(homer)
	tc, remote := ctl.(*tls.Conn)
	if !ok || !remote {
		return nil
	}
	from, err := netip.ParseAddrPort(tc.NetConn().RemoteAddr().String())
	if err != nil {
		return fmt.Errorf("transport: ub path: the peer's address: %w", err)
	}
	for _, name := range []string{peer.Jetty.Name, peer.Seg.Name} {
		host, err := h.Home(name)
		if err != nil {
			return fmt.Errorf("transport: ub path: the peer's hello: %w", err)
		}
		ips := []netip.Addr{}
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = append(ips, ip)
		} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return fmt.Errorf("transport: ub path: the peer's objects are on %s: %w", host, err)
		}
		if !slices.ContainsFunc(ips, func(ip netip.Addr) bool { return ip.Unmap() == from.Addr().Unmap() }) {
			return fmt.Errorf("transport: ub path: the peer speaks from %s but names objects on %s (%s)", from.Addr(), host, name)
		}
	}
	return nil
}

// importPeer imports the peer's half and posts the receives. The
// listener does it before it answers the dialer's hello, so a failure
// here (out of descriptors, say) reaches the dialer as the listener's
// refusal, not as a vanished jetty.
func (l *ubLink) importPeer(ctx ub.Context, peer ubHello) error {
	if peer.Depth != ubDepth || peer.Size != ubSize {
		return fmt.Errorf("transport: ub path: peer uses %d buffers of %d bytes, this side %d of %d", peer.Depth, peer.Size, ubDepth, ubSize)
	}
	var err error
	if l.peer, err = ctx.ImportJetty(peer.Jetty, peer.JettyToken); err != nil {
		return fmt.Errorf("transport: ub path: import the peer's jetty: %w", err)
	}
	if err := l.j.Bind(l.peer); err != nil {
		return fmt.Errorf("transport: ub path: %w", err)
	}
	if l.peerSeg, err = ctx.ImportSegment(peer.Seg, peer.SegToken); err != nil {
		return fmt.Errorf("transport: ub path: import the peer's segment: %w", err)
	}
	wrs := make([]ub.RecvWR, ubDepth)
	for i := range wrs {
		wrs[i] = ub.RecvWR{UserCtx: uint64(i), Buf: ub.Local{Seg: l.seg, Offset: ubHead + i*ubSize, Len: ubSize}}
	}
	if _, err := l.j.PostRecv(wrs); err != nil {
		return fmt.Errorf("transport: ub path: post receives: %w", err)
	}
	return nil
}

// ready waits until the peer has imported this side and posted its
// receives too, so no send finds the peer unready.
func (l *ubLink) ready() error {
	if _, err := l.ctl.Write([]byte{'R'}); err != nil {
		return err
	}
	var b [1]byte
	if _, err := io.ReadFull(l.ctl, b[:]); err != nil || b[0] != 'R' {
		if err == nil {
			err = fmt.Errorf("it answered %q", b[0])
		}
		return fmt.Errorf("transport: ub path: the peer did not get ready: %w", err)
	}
	// From now on the socket only tells of the peer's end.
	l.ctl.SetDeadline(time.Time{})
	go l.watch()
	return nil
}

// watch reads the socket: the peer's goodbye (how many packets it sent),
// then its end. The socket carries no data, so its goodbye never waits for
// credit.
func (l *ubLink) watch() {
	var b [9]byte
	for {
		if _, err := io.ReadFull(l.ctl, b[:]); err != nil {
			l.peerGone.Store(true)
			l.rcancel()
			return
		}
		if b[0] == 'C' {
			l.byeAfter.Store(binary.LittleEndian.Uint64(b[1:]))
			l.byeSeen.Store(true)
			l.rcancel()
		}
	}
}

func (l *ubLink) interrupt() { l.intrOnce.Do(func() { close(l.intr) }) }

// goodbye waits (at most timeout) for the packets posted to complete, then
// tells the peer on the socket how many there were. Packets still in
// flight when the wait ends are lost when the link is released: it says
// so. A peer that went, or a goodbye the socket does not take, is no loss
// to report: the peer closed its end and reads no more.
func (l *ubLink) goodbye(timeout time.Duration) error {
	l.smu.Lock()
	end := time.Now().Add(timeout)
	werr := l.waitFor(waitShutdown, func() (bool, error) {
		err := l.reap()
		return l.reaped == l.sent || time.Now().After(end), err
	})
	sent := l.sent
	var lost error
	if werr == nil && l.reaped < l.sent {
		lost = fmt.Errorf("transport: ub path: %d packets not delivered within %v: %w", l.sent-l.reaped, timeout, os.ErrDeadlineExceeded)
	}
	l.smu.Unlock()
	var b [9]byte
	b[0] = 'C'
	binary.LittleEndian.PutUint64(b[1:], sent)
	l.ctl.SetWriteDeadline(time.Now().Add(timeout))
	l.ctl.Write(b[:])
	return lost
}

func (l *ubLink) mtu() int { return ubSize }

func (l *ubLink) setWriteDeadline(t time.Time) { l.wdl.Set(t) }

// Which calls end a waitFor besides the link's shutdown.
const (
	waitShutdown  = iota // only the shutdown (goodbye)
	waitInterrupt        // and interrupt (flow-control packets)
	waitDeadline         // and the write deadline (packets of send)
)

// waitFor polls cond, climbing shm's Backoff ladder, then sleeping up to
// a millisecond between looks, until it holds or the link shuts down, is
// interrupted or its write deadline passes, as until says. What it waits
// for, a send completion or the peer's credit, is written into this side's
// memory by the provider or one-sided by the peer, with no event to park
// on; the sleeps, doubling from 20 µs, bound the cost of a long wait (a
// peer that reads nothing) to a look every millisecond.
func (l *ubLink) waitFor(until int, cond func() (bool, error)) error {
	sleep := time.Duration(0)
	// Other goroutines run between looks from readSpinBusy on: what this
	// waits for may need one of them (the reader whose credit it is).
	ladder := shm.Backoff{Gosched: readSpinBusy}
	var intr <-chan struct{}
	var wdl chan struct{}
	if until >= waitInterrupt {
		intr = l.intr
	}
	if until >= waitDeadline {
		wdl = l.wdl.Wait()
	}
	for i := 0; ; i++ {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-l.shut:
			return l.endErr()
		case <-intr:
			return l.endErr()
		case <-wdl:
			return os.ErrDeadlineExceeded
		default:
		}
		if until >= waitDeadline && i%64 == 63 {
			wdl = l.wdl.Wait() // the deadline may have moved
		}
		if l.peerGone.Load() {
			return errPeerGone
		}
		if !ladder.Pause() {
			sleep = min(max(2*sleep, 20*time.Microsecond), time.Millisecond)
			time.Sleep(sleep)
		}
	}
}

var errPeerGone = fmt.Errorf("transport: the peer's process ended: %w", shm.ErrConnReset)

// reap takes send completions (smu held).
func (l *ubLink) reap() error {
	out := &l.sout
	for l.reaped < l.sent {
		n, err := l.sq.Poll(out[:])
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		for _, c := range out[:n] {
			if c.Status != ub.StatusSuccess && l.sendErr == nil {
				l.sendErr = fmt.Errorf("transport: ub path: send: %v: %w", c.Status, shm.ErrConnReset)
				l.broken(c.Status)
			}
		}
		l.reaped += uint64(n)
	}
	return l.sendErr
}

func (l *ubLink) send(kind byte, p []byte) error { return l.post(kind, p, false) }

// sendControl is send without the write deadline.
func (l *ubLink) sendControl(kind byte, p []byte) error { return l.post(kind, p, true) }

// post sends one packet once a staging buffer and a receive of the peer's
// are free, waiting until the link ends or is interrupted or, unless the
// packet is flow control, the write deadline passes.
func (l *ubLink) post(kind byte, p []byte, control bool) error {
	l.smu.Lock()
	defer l.smu.Unlock()
	if l.sendErr != nil {
		return l.sendErr
	}
	until := waitDeadline
	if control {
		until = waitInterrupt
	}
	// A staging buffer is free once its previous send completed; the peer
	// has a receive posted once it returned the credit.
	err := l.waitFor(until, func() (bool, error) {
		if err := l.reap(); err != nil {
			return false, err
		}
		return l.sent-l.reaped < ubDepth && l.sent-l.credit.Load() < ubDepth, nil
	})
	if err != nil {
		return err
	}
	slot := int(l.sent % ubDepth)
	off := ubHead + (ubDepth+slot)*ubSize
	copy(l.seg.Bytes()[off:off+ubSize], p)
	l.swr[0] = ub.WR{Op: ub.OpSendImm, UserCtx: tagSend, Local: ub.Local{Seg: l.seg, Offset: off, Len: len(p)}, Imm: uint64(kind)}
	_, err = l.j.PostSend(l.swr[:])
	if err != nil {
		l.sendErr = fmt.Errorf("transport: ub path: post: %w", err)
		return l.sendErr
	}
	l.sent++
	if control {
		// Flow control asks for no answer: the receiver need not poll.
		return nil
	}
	l.wroteSince.Add(int64(len(p)) + 1) // an empty packet (EOF) counts too
	l.sendSeq.Add(1)
	if l.rparked.CompareAndSwap(true, false) {
		// The receiver went to sleep before this send: an answer to it is
		// now due, and is caught sooner by a poll than by a wake-up.
		l.rkick.Interrupt()
	}
	return nil
}

func (l *ubLink) recv() (byte, []byte, error) {
	if l.cur >= 0 {
		i := l.cur
		l.cur = -1
		l.rwr[0] = ub.RecvWR{UserCtx: uint64(i), Buf: ub.Local{Seg: l.seg, Offset: ubHead + i*ubSize, Len: ubSize}}
		if _, err := l.j.PostRecv(l.rwr[:]); err != nil {
			return 0, nil, fmt.Errorf("transport: ub path: repost: %w", err)
		}
		l.reposted++
	}
	var goneAt, waitStart, pollBegan time.Time
	var ladder shm.Backoff
	polling := false
	kickable := true // at most one send wakes this call's wait to poll
	readBefore := -1 // bytes read before this call's first decision
	var seenSeq uint64
	for {
		if l.reposted >= ubDepth/4 {
			l.returnCredits()
		}
		n, err := l.rq.Poll(l.comp[:])
		if err != nil {
			return 0, nil, err
		}
		if n == 1 {
			c := l.comp[0]
			if c.Status != ub.StatusSuccess {
				return 0, nil, fmt.Errorf("transport: ub path: receive: %v: %w", c.Status, shm.ErrConnReset)
			}
			if c.UserCtx >= ubDepth || c.Len > ubSize || !c.HasImm || c.Imm > 255 {
				return 0, nil, errors.New("transport: malformed packets: a receive completion that no buffer accounts for")
			}
			l.cur = int(c.UserCtx)
			l.received++
			switch {
			case polling && isFlowControl(byte(c.Imm)):
				// The poll waits for an answer; credit is none (a stream's
				// writer gets it every megabyte, and catching it would
				// keep its reader polling, and off other goroutines' CPU).
				l.poll.missed()
			case polling:
				l.poll.ended(time.Since(pollBegan), false)
			}
			l.readSince += c.Len
			off := ubHead + l.cur*ubSize
			return byte(c.Imm), l.seg.Bytes()[off : off+c.Len], nil
		}
		// Idle. Credits go back in batches of ubDepth/4 (above), not
		// here: returning each packet's credit as the queue empties cost
		// a one-sided operation per packet of a request/response
		// exchange, and the sender never needs them (it has ubDepth, and
		// at most ubDepth/4 are held back, plus the buffer being read).
		// Everything the peer sent before its goodbye was read: the end,
		// whatever happened to the link since.
		if l.byeSeen.Load() && l.received >= l.byeAfter.Load() {
			return 0, nil, errPeerClosed
		}
		select {
		case <-l.shut:
			return 0, nil, l.endErr()
		default:
		}
		if l.peerGone.Load() || l.byeSeen.Load() {
			// Packets the peer sent before it went may still be on
			// their way over the simulated or remote path.
			if goneAt.IsZero() {
				goneAt = time.Now()
			}
			if time.Since(goneAt) > 50*time.Millisecond {
				if l.byeSeen.Load() {
					return 0, nil, fmt.Errorf("transport: ub path: the peer closed with %d packets still undelivered: %w", l.byeAfter.Load()-l.received, shm.ErrConnReset)
				}
				return 0, nil, errPeerGone
			}
			time.Sleep(time.Millisecond)
			continue
		}
		// An answer to what this side sent is often on its way: look
		// again for a while before sleeping (see poller).
		now := time.Now()
		if waitStart.IsZero() {
			waitStart = now
			if readBefore < 0 {
				readBefore, l.readSince = l.readSince, 0
			}
			var share bool
			polling, share = l.poll.decide(readBefore, l.wroteSince.Swap(0))
			ladder = pollLadder(share)
			if polling && pollBegan.IsZero() {
				pollBegan, seenSeq = now, l.sendSeq.Load()
			}
		}
		if polling {
			// What is due is the answer to this side's latest send (a
			// proxy forwards a request after the frames that closed the
			// last exchange): a send during the poll restarts its clock,
			// up to readSpinExtend after it began.
			if seq := l.sendSeq.Load(); seq != seenSeq {
				seenSeq = seq
				if now.Sub(pollBegan) < readSpinExtend {
					waitStart = now
					ladder.Reset()
				}
			}
			if ladder.Pause() {
				continue
			}
		}
		// Asleep without polling, a send of this side interrupts the wait
		// so that it polls for the answer (the readers of a proxy wait on
		// the link before the request they forward is sent). The
		// interrupt count is read before the flag is set, so an interrupt
		// between the two is not lost.
		parked := !polling && kickable && l.rkick != nil
		var since uint64
		if parked {
			since = l.rkick.Interrupts()
		}
		l.rparked.Store(parked)
		if parked && l.wroteSince.Load() > 0 {
			// A send slipped in before the flag: decide again now.
			l.rparked.Store(false)
			waitStart, kickable = time.Time{}, false
			continue
		}
		if parked {
			err = l.rkick.WaitInterrupt(l.rctx, since)
		} else {
			err = l.rq.Wait(l.rctx)
		}
		if parked {
			// Woken by a send of this side (or by a packet): decide afresh
			// whether to poll, once.
			l.rparked.Store(false)
			waitStart, kickable = time.Time{}, false
		}
		if err != nil && l.rctx.Err() == nil {
			return 0, nil, err
		}
	}
}

// returnCredits adds the reposted receives to the peer's credit word. Once
// that fails (the peer released its side after its goodbye), credits are
// no longer returned, and the packets already here are still read.
func (l *ubLink) returnCredits() {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	if l.addCreditLocked(ubLinkCredit, l.reposted) {
		l.reposted = 0
	}
}

// grant adds the connection's credit to the peer's words, one-sided: the
// peer's sender reads them in its own memory, and no packet wakes its
// reader (pktConn's creditLoop calls it).
func (l *ubLink) grant(stream, messages int64) error {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	for _, g := range []struct {
		off int
		n   int64
	}{{ubStreamCredit, stream}, {ubMessageCredit, messages}} {
		if g.n > 0 && !l.addCreditLocked(g.off, uint64(g.n)) {
			return l.creditErr
		}
	}
	return nil
}

// peerGrants returns the stream and message credit the peer gave, in all.
func (l *ubLink) peerGrants() (stream, messages int64) {
	return int64(l.granted[0].Load()), int64(l.granted[1].Load())
}

// addCreditLocked takes the completed credit returns, then adds n to the
// peer's word at off (cmu held); false says credit can no longer be
// returned (creditErr says why).
func (l *ubLink) addCreditLocked(off int, n uint64) bool {
	if l.creditErr != nil {
		return false
	}
	out := &l.cout
	for {
		k, err := l.cq.Poll(out[:])
		if err != nil {
			l.creditErr = err
			return false
		}
		for _, c := range out[:k] {
			if c.Status != ub.StatusSuccess {
				l.creditErr = fmt.Errorf("transport: ub path: credit return: %v", c.Status)
				l.broken(c.Status)
				return false
			}
		}
		l.credits -= k
		if k < len(out) {
			break
		}
	}
	l.crwr[0] = ub.WR{Op: ub.OpFetchAdd, UserCtx: tagCredit, Remote: ub.Remote{Seg: l.peerSeg, Offset: off}, Add: n}
	if _, err := l.cj.PostSend(l.crwr[:]); err != nil {
		l.creditErr = fmt.Errorf("transport: ub path: credit return: %w", err)
		return false
	}
	l.credits++
	return true
}

// broken ends the link when an operation failed because a link of the
// path went down: a packet or a credit is lost, so the link cannot go on,
// and closing the socket tells the peer, whose sends and receives would
// otherwise wait for it forever. Other failures are not a fault of the
// path: after the peer's goodbye its side may be gone (a credit return
// then fails with StatusPeerDead, and the packets already here are still
// read), and a peer that died closes the socket itself.
func (l *ubLink) broken(st ub.Status) {
	if st != ub.StatusLinkDown || l.byeSeen.Load() {
		return
	}
	l.linkErr.CompareAndSwap(nil, &brokenErr{st})
	l.shutdown()
}

// endErr is why calls on a link that was shut down fail: the fault of the
// path that broke it, else net.ErrClosed.
func (l *ubLink) endErr() error {
	if e := l.linkErr.Load(); e != nil {
		return e
	}
	return net.ErrClosed
}

// brokenErr is why a link ended for a fault of its path.
type brokenErr struct{ st ub.Status }

func (e *brokenErr) Error() string {
	return fmt.Sprintf("transport: ub path: %v: connection reset", e.st)
}
func (e *brokenErr) Unwrap() error { return shm.ErrConnReset }

func (l *ubLink) shutdown() {
	l.once.Do(func() {
		l.interrupt()
		close(l.shut)
		if l.rcancel != nil {
			l.rcancel()
		}
		if l.ctl != nil {
			l.ctl.Close()
		}
	})
}

func (l *ubLink) release() {
	l.shutdown()
	// A Read may still be returning credit (grant): it must find the
	// link released, not its jetty closed under it.
	l.cmu.Lock()
	if l.creditErr == nil {
		l.creditErr = net.ErrClosed
	}
	l.cmu.Unlock()
	for _, c := range []interface{ Close() error }{l.peer, l.peerSeg, l.j, l.cj, l.sq, l.rq, l.cq, l.seg} {
		if c != nil {
			c.Close()
		}
	}
}
