package tcpprov

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// hangGuard bounds every wait of these tests; none of them should come near it.
const hangGuard = 10 * time.Second

// TestIDsAreUnpredictable: the wire ids of segments and jetties are random,
// distinct within a context (segments and jetties together) and not zero,
// and descriptor names carry them; sequential ids made every object of a
// context known to anyone who saw one.
func TestIDsAreUnpredictable(t *testing.T) {
	sets := make([]map[uint32]bool, 2)
	for k := range sets {
		c := openContext(t)
		cq, err := c.NewCQ(ub.CQConfig{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint32]bool{}
		var segIDs []uint32
		add := func(id uint32, name, kind string) {
			t.Helper()
			if _, got, err := parseName(name, kind); err != nil || got != id {
				t.Fatalf("descriptor name %q does not carry id %d: %d %v", name, id, got, err)
			}
			if id == 0 || seen[id] {
				t.Fatalf("context %d: id %d is zero or given twice", k, id)
			}
			seen[id] = true
		}
		for range 100 {
			s, err := c.AllocSegment(64, ub.SegmentConfig{Access: ub.AccessRead, Token: 1})
			if err != nil {
				t.Fatal(err)
			}
			seg := s.(*segment)
			add(seg.id, s.Desc().Name, "s")
			segIDs = append(segIDs, seg.id)
		}
		for range 20 {
			j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, Token: 1})
			if err != nil {
				t.Fatal(err)
			}
			add(j.(*jetty).id, j.Desc().Name, "j")
		}
		step, progression := segIDs[1]-segIDs[0], true
		for i := 2; i < len(segIDs); i++ {
			progression = progression && segIDs[i]-segIDs[i-1] == step
		}
		if progression {
			t.Fatalf("context %d: segment ids %d, %d, ... step by %d", k, segIDs[0], segIDs[1], step)
		}
		sets[k] = seen
	}
	same := 0
	for id := range sets[0] {
		if sets[1][id] {
			same++
		}
	}
	if same == len(sets[0]) {
		t.Fatal("two contexts gave their objects the same ids")
	}
}

// guessTarget is a server context with a segment and a jetty, and a hook
// that reports each wait of a connection after a failure.
type guessTarget struct {
	c     *Context
	seg   *segment
	jid   uint32
	waits chan time.Duration // each wait's length as it starts, while there is room
}

const guessToken = ub.Token(0x5eed)

func newGuessTarget(t *testing.T) *guessTarget {
	t.Helper()
	g := &guessTarget{waits: make(chan time.Duration, 1024)}
	g.c = openWith(t, options{connsPerSource: maxConnsPerSource, conns: maxConns, tarpitted: func(d time.Duration) {
		select {
		case g.waits <- d:
		default:
		}
	}})
	s, err := g.c.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessAtomic, Token: guessToken})
	if err != nil {
		t.Fatal(err)
	}
	g.seg = s.(*segment)
	cq, err := g.c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := g.c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, Token: guessToken})
	if err != nil {
		t.Fatal(err)
	}
	g.jid = j.(*jetty).id
	return g
}

// guess is the i-th of a guesser's requests, each failing authorization
// another way (id 0 is never given out), and the status it must get.
func (g *guessTarget) guess(i int) (request, ub.Status) {
	bad := uint32(guessToken) + 1 + uint32(i)
	switch i % 5 {
	case 0:
		return request{op: opRead, token: bad, object: g.seg.id, n: 8}, ub.StatusBadToken
	case 1:
		return request{op: opRead, token: uint32(guessToken), object: 0, n: 8}, ub.StatusNoPermission
	case 2:
		return request{op: opSend, token: uint32(guessToken), object: 0}, ub.StatusFlushed
	case 3:
		return request{op: opSend, token: bad, object: g.jid}, ub.StatusBadToken
	}
	// A WriteImm with the segment's token and a wrong one for its jetty.
	return request{op: opWriteImm, token: uint32(guessToken), object: g.seg.id, a: uint64(g.jid), n: bad}, ub.StatusBadToken
}

// rawConn is a peer that speaks the wire format itself.
type rawConn struct {
	nc net.Conn
	w  *bufio.Writer
	r  *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(hangGuard))
	return &rawConn{nc: nc, w: bufio.NewWriter(nc), r: bufio.NewReader(nc)}
}

func (rc *rawConn) write(req request) error {
	rc.w.Write(req.appendHeader(nil))
	_, err := rc.w.Write(req.payload)
	return err
}

func (rc *rawConn) read() (response, error) {
	b, err := readFrame(rc.r, nil, respHeader)
	if err != nil {
		return response{}, err
	}
	return decodeResponse(b)
}

// TestGuessingIsRateLimited: a peer that sends wrong tokens and unknown ids
// as fast as it can gets each answer with its proper status; its first
// failBurst failures are not held back, and beyond them each answer waits
// for a unit of the source's budget (a wait of at most one unit, since it
// has one connection); a well-behaved context on the same host meanwhile
// writes and reads the segment on its own connection. (TestFailLimiter
// checks the budget's arithmetic.)
func TestGuessingIsRateLimited(t *testing.T) {
	g := newGuessTarget(t)
	const extra = 200
	n := failBurst + extra
	rc := dialRaw(t, g.c.Addr())
	statuses := make([]ub.Status, n)
	for i := range n {
		var req request
		req, statuses[i] = g.guess(i)
		if err := rc.write(req); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.w.Flush(); err != nil {
		t.Fatal(err)
	}
	guessing := make(chan error, 1)
	go func() {
		defer close(guessing)
		for i := range n {
			resp, err := rc.read()
			if err != nil {
				guessing <- err
				return
			}
			if ub.Status(resp.status) != statuses[i] {
				guessing <- fmt.Errorf("guess %d: status %v, want %v", i, ub.Status(resp.status), statuses[i])
				return
			}
		}
	}()

	// While the guesser waits, another context's requests pass.
	var waits []time.Duration
	select {
	case d := <-g.waits:
		waits = append(waits, d)
	case <-time.After(hangGuard):
		t.Fatal("the guesser never waited")
	}
	writeRead(t, openContext(t), g.seg.Desc())
	select {
	case err := <-guessing:
		t.Fatalf("the guesser was done before the good peer's write and read: %v", err)
	default:
	}
	if err := <-guessing; err != nil {
		t.Fatal(err)
	}
	// Every wait began before its answer went out: all are in.
	for len(g.waits) > 0 {
		waits = append(waits, <-g.waits)
	}
	t.Logf("%d failures, %d of them waited for the budget", n, len(waits))
	if len(waits) > extra {
		t.Errorf("%d of %d failures waited, want none of the first %d", len(waits), n, failBurst)
	}
	unit := time.Second / failRate
	for _, d := range waits {
		if d <= 0 || d > unit+time.Microsecond {
			t.Errorf("a failure of the guesser's one connection waited %v, want up to one unit of the budget (%v)", d, unit)
		}
	}
}

// writeRead writes a segment through c and reads it back, with a token that
// passes.
func writeRead(t *testing.T, c *Context, desc ub.SegmentDesc) {
	t.Helper()
	local, err := c.AllocSegment(64, ub.SegmentConfig{Access: ub.AccessWrite, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := c.ImportSegment(desc, guessToken)
	if err != nil {
		t.Fatal(err)
	}
	copy(local.Bytes(), "well-behaved")
	if _, err := j.PostSend([]ub.WR{
		{Op: ub.OpWrite, Local: ub.Local{Seg: local, Len: 12}, Remote: ub.Remote{Seg: remote, Offset: 100}},
		{Op: ub.OpRead, Local: ub.Local{Seg: local, Offset: 32, Len: 12}, Remote: ub.Remote{Seg: remote, Offset: 100}},
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	out := make([]ub.Completion, 2)
	for got := 0; got < 2; {
		if err := cq.Wait(ctx); err != nil {
			t.Fatalf("waiting for the good peer's completions: %v", err)
		}
		k, err := cq.Poll(out[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
	for _, comp := range out {
		if comp.Status != ub.StatusSuccess {
			t.Fatalf("the good peer's %v: %v", comp.Op, comp.Status)
		}
	}
	if got := string(local.Bytes()[32:44]); got != "well-behaved" {
		t.Fatalf("the good peer read back %q", got)
	}
}

// TestCloseEndsTarpits: closing a context whose connections wait out
// failures ends the waits, hanging up on those connections without their
// answers, instead of waiting them out, and leaves no goroutine of it
// behind.
func TestCloseEndsTarpits(t *testing.T) {
	g := newGuessTarget(t)
	rc := dialRaw(t, g.c.Addr())
	for i := range failBurst {
		req, _ := g.guess(i)
		rc.write(req)
	}
	rc.w.Flush()
	for range failBurst {
		if _, err := rc.read(); err != nil {
			t.Fatal(err)
		}
	}
	// The bucket is empty: each of these connections' failures waits for
	// its own unit, the last about conns*each/failRate (10 s). Several
	// guesses per connection keep the waits long even when dialing is
	// slower than the bucket refills (a loaded machine: one guess each
	// made the longest wait 0.7 s).
	const conns, each = 250, 4
	guessers := []*rawConn{rc}
	for i := range conns {
		gc := dialRaw(t, g.c.Addr())
		for j := range each {
			req, _ := g.guess(i*each + j)
			gc.write(req)
		}
		gc.w.Flush()
		guessers = append(guessers, gc)
	}
	var longest time.Duration
	for longest < time.Second {
		select {
		case longest = <-g.waits:
		case <-time.After(hangGuard):
			t.Fatalf("no connection waits a second (the longest wait: %v)", longest)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- g.c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Close hangs while connections wait out failures")
	}
	// The guessers are hung up on, and those still waiting (for up to
	// 2.5 s, the last of them) without their answer; nothing of the
	// context runs.
	unanswered := 0
	for _, gc := range guessers[1:] {
		answers, err := hungUp(gc)
		if err != nil {
			t.Fatalf("a guesser's connection after Close: %v", err)
		}
		if answers == 0 {
			unanswered++
		}
	}
	t.Logf("Close with a connection waiting %v: %d of %d guessers hung up on before their answer", longest, unanswered, conns)
	if unanswered == 0 {
		t.Error("every guesser got its answer before Close hung up on it: Close waited for the waits to end")
	}
	waitNoGoroutines(t)
}

// hungUp reads rc's answers until the connection ends, and returns how
// many came; its error says what is wrong unless the server hung up.
func hungUp(rc *rawConn) (answers int, err error) {
	for {
		_, err := rc.read()
		var ne net.Error
		switch {
		case err == nil:
			answers++
			continue
		case errors.Is(err, errFrame), errors.As(err, &ne) && ne.Timeout():
			return answers, fmt.Errorf("%w, want EOF or a reset", err)
		}
		return answers, nil
	}
}

// waitNoGoroutines waits until no goroutine runs a Context's or a conn's
// code: after Close they are on their way out.
func waitNoGoroutines(t *testing.T) {
	t.Helper()
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(hangGuard)
	for {
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "tcpprov.(*Context).") && !strings.Contains(stacks, "tcpprov.(*conn).") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines of a closed context remain:\n%s", stacks)
		}
		runtime.Gosched()
	}
}

// TestConnectionCaps: connections beyond the cap of one source, or of the
// context, are closed at once; those before them keep working, and once
// closed leave nothing in the context.
func TestConnectionCaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		opt  options
		cap  int
	}{
		{"PerSource", options{connsPerSource: maxConnsPerSource, conns: maxConns}, maxConnsPerSource},
		{"Total", options{connsPerSource: 64, conns: 8}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed := make(chan struct{}, 1)
			tc.opt.servedChanged = func() {
				select {
				case changed <- struct{}{}:
				default:
				}
			}
			c := openWith(t, tc.opt)
			s, err := c.AllocSegment(64, ub.SegmentConfig{Access: ub.AccessRead, Token: guessToken})
			if err != nil {
				t.Fatal(err)
			}
			copy(s.Bytes(), "served")
			good := request{op: opRead, token: uint32(guessToken), object: s.(*segment).id, n: 6}
			waitServed := func(want int) {
				t.Helper()
				for {
					c.mu.Lock()
					n, sources := len(c.served), len(c.sources)
					c.mu.Unlock()
					if n == want && (want > 0 || sources == 0) {
						return
					}
					select {
					case <-changed:
					case <-time.After(hangGuard):
						t.Fatalf("the context serves %d connections from %d sources, want %d", n, sources, want)
					}
				}
			}
			var held []*rawConn
			for range tc.cap {
				held = append(held, dialRaw(t, c.Addr()))
			}
			waitServed(tc.cap)
			for range 2 {
				if _, err := hungUp(dialRaw(t, c.Addr())); err != nil {
					t.Fatalf("a connection beyond the cap of %d: %v", tc.cap, err)
				}
			}
			for i, rc := range held {
				rc.write(good)
				rc.w.Flush()
				if resp, err := rc.read(); err != nil || string(resp.payload) != "served" {
					t.Fatalf("connection %d under the cap: %q %v", i, resp.payload, err)
				}
			}
			for _, rc := range held {
				rc.nc.Close()
			}
			waitServed(0)
		})
	}
}

// TestFailLimiterArithmetic runs the failure buckets on a made-up clock with
// the real constants: failBurst failures pass at once, the k-th beyond waits
// k/failRate, a bucket refills at failRate, sources do not share buckets,
// and at maxSources a new source shares one until buckets fill up again.
func TestFailLimiterArithmetic(t *testing.T) {
	var l failLimiter
	t0 := time.Now()
	a, b := netip.MustParsePrefix("10.0.0.1/32"), netip.MustParsePrefix("10.0.0.2/32")
	unit := time.Second / failRate
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if d := got - want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("%s: wait %v, want %v", what, got, want)
		}
	}
	for range failBurst {
		near("failure in the burst", l.fail(a, t0), 0)
	}
	for k := 1; k <= 3; k++ {
		near("failure beyond the burst", l.fail(a, t0), time.Duration(k)*unit)
	}
	near("another source's first failure", l.fail(b, t0), 0)
	// Three units are owed; after 10 units' time, 7 are there.
	t1 := t0.Add(10 * unit)
	for range 7 {
		near("failure after a refill", l.fail(a, t1), 0)
	}
	near("failure once the refill is used", l.fail(a, t1), unit)
	// A full bucket is as good as none: it is dropped.
	t2 := t1.Add(time.Duration(failBurst+1) * unit)
	for i := range maxSources {
		l.fail(netip.PrefixFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), 32), t2)
	}
	if len(l.buckets) != maxSources {
		t.Fatalf("%d buckets, want %d (a and b refilled and were dropped)", len(l.buckets), maxSources)
	}
	// At the cap, new sources share the overflow bucket.
	for i := range failBurst {
		near("new source at the cap", l.fail(netip.PrefixFrom(netip.AddrFrom4([4]byte{12, 0, 0, byte(i)}), 32), t2), 0)
	}
	near("new source at the cap, beyond the shared burst", l.fail(a, t2), unit)
	if len(l.buckets) != maxSources {
		t.Fatalf("%d buckets, want the cap %d", len(l.buckets), maxSources)
	}
	// Once the buckets refilled, they give way to new sources.
	near("new source once buckets refilled", l.fail(b, t2.Add(unit)), 0)
	if len(l.buckets) != 1 {
		t.Fatalf("%d buckets after they refilled, want 1", len(l.buckets))
	}
}

// TestSourceOf: every loopback address is one source, an IPv6 host counts by
// its /64 (a link-local one whole), an IPv4-mapped address as IPv4.
func TestSourceOf(t *testing.T) {
	src := func(s string) netip.Prefix { return sourceOf(net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s))) }
	for _, same := range [][2]string{
		{"127.0.0.1:1", "127.5.6.7:2"},
		{"127.0.0.1:1", "[::1]:2"},
		{"[2001:db8::1]:1", "[2001:db8::2:3]:2"},
		{"[::ffff:10.0.0.1]:1", "10.0.0.1:2"},
	} {
		if src(same[0]) != src(same[1]) {
			t.Errorf("%s and %s are different sources", same[0], same[1])
		}
	}
	for _, other := range [][2]string{
		{"10.0.0.1:1", "10.0.0.2:1"},
		{"[2001:db8::1]:1", "[2001:db8:0:1::1]:1"},
		{"[fe80::1%eth0]:1", "[fe80::2%eth0]:1"},
	} {
		if src(other[0]) == src(other[1]) {
			t.Errorf("%s and %s are one source", other[0], other[1])
		}
	}
}

// openWith opens a context with opt, which the test closes at its end.
func openWith(t *testing.T, opt options) *Context {
	t.Helper()
	c, err := open(ub.Config{}, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
