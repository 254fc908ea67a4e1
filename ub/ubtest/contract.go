package ubtest

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// The contract's checks that need no peer: the sentinel errors of calls
// that cannot be queued, and the optional ub.Interrupter.

// wantErr fails the test unless err matches want.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: error %v, want one matching %q", what, err, want)
	}
}

// waitCtx bounds a wait that must end by an event: reaching its end is a
// failure, so it is long.
func waitCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// Objects of no provider, to hand to a provider's calls.
type (
	foreignCQ      struct{}
	foreignSegment struct{ b []byte }
	foreignRemote  struct{}
	foreignTarget  struct{}
)

func (foreignCQ) Poll([]ub.Completion) (int, error) { return 0, nil }
func (foreignCQ) Wait(context.Context) error        { return nil }
func (foreignCQ) Close() error                      { return nil }
func (s foreignSegment) Bytes() []byte              { return s.b }
func (foreignSegment) Desc() ub.SegmentDesc         { return ub.SegmentDesc{Provider: "ubtest-foreign"} }
func (foreignSegment) Close() error                 { return nil }
func (foreignRemote) Desc() ub.SegmentDesc          { return ub.SegmentDesc{Provider: "ubtest-foreign"} }
func (foreignRemote) Close() error                  { return nil }
func (foreignTarget) Desc() ub.JettyDesc            { return ub.JettyDesc{Provider: "ubtest-foreign"} }
func (foreignTarget) Close() error                  { return nil }

func testErrors(t *testing.T, open Open, opts Options) {
	t.Run("ClosedContext", func(t *testing.T) { testClosedContext(t, open, opts) })
	t.Run("ClosedObjects", func(t *testing.T) { testClosedObjects(t, open) })
	t.Run("CQFull", func(t *testing.T) { testCQFull(t, open) })
	t.Run("RecvQueueFull", func(t *testing.T) { testRecvQueueFull(t, open) })
	t.Run("BadDescriptors", func(t *testing.T) { testBadDescriptors(t, open) })
	t.Run("ForeignObjects", func(t *testing.T) { testForeign(t, open) })
	t.Run("InvalidArguments", func(t *testing.T) { testInvalid(t, open, opts) })
}

// testClosedContext: once a context is closed, its constructors, imports
// and the objects it made fail with ub.ErrClosed, and every Close after
// the first returns nil.
func testClosedContext(t *testing.T, open Open, opts Options) {
	l := newLocal(t, open, ub.ReliableMessage)
	other := newLocal(t, open, ub.ReliableMessage)
	r := l.importSegment(t, l.seg.Desc(), peerToken)
	tgt := l.importJetty(t, l.j.Desc(), peerToken)
	if err := l.c.Close(); err != nil {
		t.Fatalf("close the context: %v", err)
	}
	_, err := l.c.AllocSegment(4096, ub.SegmentConfig{})
	wantErr(t, "AllocSegment on a closed context", err, ub.ErrClosed)
	_, err = l.c.RegisterSegment(opts.memory(t, 4096), ub.SegmentConfig{})
	wantErr(t, "RegisterSegment on a closed context", err, ub.ErrClosed)
	_, err = l.c.NewCQ(ub.CQConfig{})
	wantErr(t, "NewCQ on a closed context", err, ub.ErrClosed)
	_, err = l.c.NewJetty(ub.JettyConfig{SendCQ: l.cq, RecvCQ: l.cq})
	wantErr(t, "NewJetty on a closed context", err, ub.ErrClosed)
	_, err = l.c.ImportSegment(other.seg.Desc(), peerToken)
	wantErr(t, "ImportSegment on a closed context", err, ub.ErrClosed)
	_, err = l.c.ImportJetty(other.j.Desc(), peerToken)
	wantErr(t, "ImportJetty on a closed context", err, ub.ErrClosed)
	_, err = l.cq.Poll(make([]ub.Completion, 1))
	wantErr(t, "Poll on a closed context's CQ", err, ub.ErrClosed)
	ctx, cancel := waitCtx()
	defer cancel()
	wantErr(t, "Wait on a closed context's CQ", l.cq.Wait(ctx), ub.ErrClosed)
	_, err = l.j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: l.seg, Len: 8}, Remote: ub.Remote{Seg: r}}})
	wantErr(t, "PostSend on a closed context's jetty", err, ub.ErrClosed)
	_, err = l.j.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: l.seg, Len: 8}}})
	wantErr(t, "PostRecv on a closed context's jetty", err, ub.ErrClosed)
	for _, o := range []interface{ Close() error }{l.c, l.j, l.cq, l.seg, r, tgt} {
		if err := o.Close(); err != nil {
			t.Errorf("a second Close of %T: %v", o, err)
		}
	}
}

// testClosedObjects: a queue, a jetty or a segment closed on its own.
func testClosedObjects(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	self := l.importSegment(t, l.seg.Desc(), peerToken)

	// A Wait on a queue that closes ends with ErrClosed, whether it began
	// before the Close or after.
	q, err := l.c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := waitCtx()
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- q.Wait(ctx) }()
	if err := q.Close(); err != nil {
		t.Fatalf("close a CQ: %v", err)
	}
	wantErr(t, "a Wait when its CQ closed", <-done, ub.ErrClosed)
	_, err = q.Poll(make([]ub.Completion, 1))
	wantErr(t, "Poll on a closed CQ", err, ub.ErrClosed)
	wantErr(t, "Wait on a closed CQ", q.Wait(ctx), ub.ErrClosed)
	if err := q.Close(); err != nil {
		t.Errorf("a second Close of a CQ: %v", err)
	}

	// A Wait whose ctx has ended returns ctx's error.
	ended, stop := context.WithCancel(context.Background())
	stop()
	wantErr(t, "Wait with an ended ctx", l.cq.Wait(ended), context.Canceled)

	j, err := l.c.NewJetty(ub.JettyConfig{SendCQ: l.cq, RecvCQ: l.cq, Token: peerToken})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatalf("close a jetty: %v", err)
	}
	_, err = j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: l.seg, Len: 8}, Remote: ub.Remote{Seg: self}}})
	wantErr(t, "PostSend on a closed jetty", err, ub.ErrClosed)
	_, err = j.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: l.seg, Len: 8}}})
	wantErr(t, "PostRecv on a closed jetty", err, ub.ErrClosed)
	if err := j.Close(); err != nil {
		t.Errorf("a second Close of a jetty: %v", err)
	}

	// A closed segment is no local buffer any more, and peers (here: an
	// import of this context's own) find it deregistered.
	s, err := l.c.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessWrite, Token: peerToken})
	if err != nil {
		t.Fatal(err)
	}
	r := l.importSegment(t, s.Desc(), peerToken)
	if err := s.Close(); err != nil {
		t.Fatalf("close a segment: %v", err)
	}
	wantStatus(t, "write from a closed segment", l.post(t, ub.WR{Op: ub.OpWrite, Local: ub.Local{Seg: s, Len: 8}, Remote: ub.Remote{Seg: self}}), ub.StatusLocalLength)
	wantStatus(t, "write into a closed segment", l.post(t, ub.WR{Op: ub.OpWrite, Local: l.put(0, "deadbeef"), Remote: ub.Remote{Seg: r}}), ub.StatusNoPermission)
	for _, o := range []interface{ Close() error }{s, r, r} {
		if err := o.Close(); err != nil {
			t.Errorf("Close of a closed segment or of its import (%T): %v", o, err)
		}
	}
}

// testCQFull: a post whose completions do not fit fails with ErrCQFull
// and queues nothing from the failed request on; a provider that accepts
// more than the depth must still complete every request it accepted.
func testCQFull(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	self := l.importSegment(t, l.seg.Desc(), peerToken)
	small, err := l.c.NewCQ(ub.CQConfig{Depth: 2})
	if err != nil {
		t.Fatal(err)
	}
	j, err := l.c.NewJetty(ub.JettyConfig{SendCQ: small, RecvCQ: small})
	if err != nil {
		t.Fatal(err)
	}
	wrs := make([]ub.WR, 3)
	for i := range wrs {
		wrs[i] = ub.WR{Op: ub.OpWrite, UserCtx: uint64(i), Local: l.put(0, "12345678"), Remote: ub.Remote{Seg: self, Offset: 8 * (i + 1)}}
	}
	n, err := j.PostSend(wrs)
	switch {
	case err != nil:
		wantErr(t, "3 writes on a CQ of depth 2", err, ub.ErrCQFull)
		if n >= len(wrs) {
			t.Fatalf("PostSend failed but says it queued all %d requests", n)
		}
	case n != len(wrs):
		t.Fatalf("PostSend queued %d of %d requests without an error", n, len(wrs))
	}
	// Each accepted request completes once. (Their order is
	// CompletionOrder's subject: sim over tcp lets the completion it makes
	// for a request the queue underneath refused overtake earlier requests
	// still in flight there.)
	ctx, cancel := waitCtx()
	defer cancel()
	out := make([]ub.Completion, 1)
	seen := make([]bool, n)
	for i := range n {
		if err := small.Wait(ctx); err != nil {
			t.Fatalf("wait for completion %d of %d accepted requests: %v", i, n, err)
		}
		if k, err := small.Poll(out); k != 1 || err != nil {
			t.Fatalf("poll completion %d: %d %v", i, k, err)
		}
		if c := out[0].UserCtx; c >= uint64(n) || seen[c] {
			t.Fatalf("completion %d is of request %d: not one of the %d accepted, or its second", i, c, n)
		}
		seen[out[0].UserCtx] = true
	}
	// Polled, the queue has room again.
	if k, err := j.PostSend(wrs[:1]); k != 1 || err != nil {
		t.Fatalf("post after the queue was polled: %d %v", k, err)
	}
}

// testRecvQueueFull: a jetty takes at least RecvDepth receives, and more
// than it holds fail with ErrRecvQueueFull.
func testRecvQueueFull(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	const depth, tries = 4, 1024
	j, err := l.c.NewJetty(ub.JettyConfig{SendCQ: l.cq, RecvCQ: l.cq, RecvDepth: depth})
	if err != nil {
		t.Fatal(err)
	}
	wrs := make([]ub.RecvWR, tries)
	for i := range wrs {
		wrs[i] = ub.RecvWR{UserCtx: uint64(i), Buf: ub.Local{Seg: l.seg, Offset: 16 * i, Len: 16}}
	}
	n, err := j.PostRecv(wrs)
	wantErr(t, "more receives than the receive depth", err, ub.ErrRecvQueueFull)
	if n < depth || n >= tries {
		t.Errorf("a jetty of receive depth %d took %d of %d receives", depth, n, tries)
	}
}

// testBadDescriptors: a descriptor of another provider, or with an empty
// name, cannot be imported.
func testBadDescriptors(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	seg, jet := l.seg.Desc(), l.j.Desc()
	seg.Provider, jet.Provider = "no-such-provider", "no-such-provider"
	_, err := l.c.ImportSegment(seg, peerToken)
	wantErr(t, "import a segment of another provider", err, ub.ErrBadDescriptor)
	_, err = l.c.ImportJetty(jet, peerToken)
	wantErr(t, "import a jetty of another provider", err, ub.ErrBadDescriptor)
	seg, jet = l.seg.Desc(), l.j.Desc()
	seg.Name, jet.Name = "", ""
	_, err = l.c.ImportSegment(seg, peerToken)
	wantErr(t, "import a segment descriptor without a name", err, ub.ErrBadDescriptor)
	_, err = l.c.ImportJetty(jet, peerToken)
	wantErr(t, "import a jetty descriptor without a name", err, ub.ErrBadDescriptor)
}

// testForeign: objects of another provider, or of another context where
// the provider needs its own, are refused with ErrForeignObject by calls
// and with a status by work requests.
func testForeign(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	other := newLocal(t, open, ub.ReliableMessage)
	self := l.importSegment(t, l.seg.Desc(), peerToken)
	_, err := l.c.NewJetty(ub.JettyConfig{SendCQ: foreignCQ{}, RecvCQ: l.cq})
	wantErr(t, "a jetty whose SendCQ is of another provider", err, ub.ErrForeignObject)
	_, err = l.c.NewJetty(ub.JettyConfig{SendCQ: l.cq, RecvCQ: foreignCQ{}})
	wantErr(t, "a jetty whose RecvCQ is of another provider", err, ub.ErrForeignObject)
	n, err := l.j.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: foreignSegment{make([]byte, 64)}, Len: 64}}})
	wantErr(t, "a receive into a segment of another provider", err, ub.ErrForeignObject)
	if n != 0 {
		t.Errorf("PostRecv refused a receive but says it queued %d", n)
	}
	_, err = l.j.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: other.seg, Len: 64}}})
	wantErr(t, "a receive into a segment of another context", err, ub.ErrForeignObject)
	rc := newLocal(t, open, ub.ReliableConnection)
	wantErr(t, "Bind to a target of another provider", rc.j.Bind(foreignTarget{}), ub.ErrForeignObject)
	wantStatus(t, "write into a segment of another provider", l.post(t, ub.WR{Op: ub.OpWrite, Local: l.put(0, "x"), Remote: ub.Remote{Seg: foreignRemote{}}}), ub.StatusUnsupported)
	wantStatus(t, "write from a segment of another provider", l.post(t, ub.WR{Op: ub.OpWrite, Local: ub.Local{Seg: foreignSegment{make([]byte, 8)}, Len: 8}, Remote: ub.Remote{Seg: self}}), ub.StatusLocalLength)
}

// testInvalid: sizes, modes and ranges out of range, and Binds that are
// not allowed, fail with ErrInvalidArgument.
func testInvalid(t *testing.T, open Open, opts Options) {
	l := newLocal(t, open, ub.ReliableMessage)
	for _, size := range []int{0, -1} {
		_, err := l.c.AllocSegment(size, ub.SegmentConfig{})
		wantErr(t, "a segment of size "+strconv.Itoa(size), err, ub.ErrInvalidArgument)
	}
	mem := opts.memory(t, 4096)
	for what, b := range map[string][]byte{"nil": nil, "empty": mem[:0], "empty at the end": mem[len(mem):]} {
		s, err := l.c.RegisterSegment(b, ub.SegmentConfig{Access: ub.AccessWrite})
		wantErr(t, "RegisterSegment of "+what+" memory", err, ub.ErrInvalidArgument)
		if s != nil {
			s.Close()
		}
	}
	_, err := l.c.NewJetty(ub.JettyConfig{Mode: 99, SendCQ: l.cq, RecvCQ: l.cq})
	wantErr(t, "a jetty of mode 99", err, ub.ErrInvalidArgument)
	for _, buf := range []ub.Local{{Seg: l.seg, Offset: PeerSegmentSize - 4, Len: 8}, {Seg: l.seg, Offset: -8, Len: 8}, {Seg: l.seg, Len: -1}} {
		_, err := l.j.PostRecv([]ub.RecvWR{{Buf: buf}})
		wantErr(t, "a receive buffer outside its segment", err, ub.ErrInvalidArgument)
	}
	tgt := l.importJetty(t, l.j.Desc(), peerToken)
	wantErr(t, "Bind of a reliable-message jetty", l.j.Bind(tgt), ub.ErrInvalidArgument)
	rc := newLocal(t, open, ub.ReliableConnection)
	if err := rc.j.Bind(tgt); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	wantErr(t, "a second Bind", rc.j.Bind(tgt), ub.ErrInvalidArgument)
}

// testInterrupt checks ub.Interrupter on a provider whose CQs implement
// it. Every check waits for an event, never for a time: a wait that is not
// ended by what the check does runs into a minute's deadline, and fails.
func testInterrupt(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	q, ok := l.cq.(ub.Interrupter)
	if !ok {
		t.Skipf("the %s provider's CQs do not implement ub.Interrupter: their Waits end only at a completion, ctx's end or Close", l.c.Provider())
	}
	ctx, cancel := waitCtx()
	defer cancel()
	empty := func(what string) {
		t.Helper()
		if n, err := l.cq.Poll(make([]ub.Completion, 1)); n != 0 || err != nil {
			t.Errorf("%s: Poll found %d completions (%v), want none", what, n, err)
		}
	}

	since := q.Interrupts()
	q.Interrupt()
	if q.Interrupts() == since {
		t.Fatal("Interrupts did not change at an Interrupt")
	}
	// An interrupt made before the wait, after its count was read, is not
	// lost.
	if err := q.WaitInterrupt(ctx, since); err != nil {
		t.Fatalf("WaitInterrupt after an Interrupt since its count: %v", err)
	}
	empty("after an interrupted wait")

	// An interrupt ends a wait asleep on an empty queue. The waiter reads
	// the count before it says it is ready; whenever the Interrupt comes
	// after that, the wait must end.
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		since := q.Interrupts()
		close(ready)
		done <- q.WaitInterrupt(ctx, since)
	}()
	<-ready
	q.Interrupt()
	if err := <-done; err != nil {
		t.Fatalf("a WaitInterrupt ended by Interrupt: %v", err)
	}
	empty("after an interrupted wait")

	// A plain Wait ends at an Interrupt made after it began. When it
	// begins is unknown here, so interrupt until it returns.
	go func() { done <- l.cq.Wait(ctx) }()
	for waiting := true; waiting; {
		q.Interrupt()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a Wait ended by Interrupt: %v", err)
			}
			waiting = false
		default:
			runtime.Gosched()
		}
	}
	empty("after an interrupted Wait")

	// A completion still ends a WaitInterrupt, with something to Poll.
	self := l.importSegment(t, l.seg.Desc(), peerToken)
	if _, err := l.j.PostSend([]ub.WR{{Op: ub.OpWrite, UserCtx: 5, Local: l.put(0, "x"), Remote: ub.Remote{Seg: self, Offset: 64}}}); err != nil {
		t.Fatal(err)
	}
	out := make([]ub.Completion, 1)
	for {
		if err := q.WaitInterrupt(ctx, q.Interrupts()); err != nil {
			t.Fatalf("WaitInterrupt for a completion: %v", err)
		}
		if n, err := l.cq.Poll(out); err != nil || n == 1 {
			if err != nil || out[0].UserCtx != 5 {
				t.Fatalf("the completion: %+v %v", out[0], err)
			}
			break
		}
	}

	// A closed queue's WaitInterrupt fails.
	if err := l.cq.Close(); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "WaitInterrupt on a closed CQ", q.WaitInterrupt(ctx, q.Interrupts()), ub.ErrClosed)
}
