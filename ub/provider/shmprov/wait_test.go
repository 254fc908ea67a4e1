package shmprov_test

import (
	"context"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/ub"
)

// ringSleep is where a CQ's wait sleeps on its one ring, as goroutine
// dumps name it.
const ringSleep = "shmprov.(*cq).waitRing("

// openContext opens a shm context that the test closes at its end.
func openContext(t *testing.T) ub.Context {
	t.Helper()
	c, err := open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A wait asleep on a CQ's ring holds the context's read lock; closing
// objects of the context (which takes it for writing) must end that sleep
// rather than hang behind it, and the wait then carries on.
func TestCloseDuringWait(t *testing.T) {
	c := openContext(t)
	q, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.AllocSegment(4096, ub.SegmentConfig{Token: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- q.Wait(ctx) }()
	testenv.WaitParked(t, 1, "IO wait", ringSleep)
	closed := make(chan error, 1)
	go func() { closed <- other.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // a hang guard
		t.Fatal("closing a segment hung behind a sleeping wait")
	}
	// The wait sleeps on the ring again.
	testenv.WaitParked(t, 1, "IO wait", ringSleep)
	select {
	case err := <-waited:
		t.Fatalf("the wait returned (%v) with nothing to poll", err)
	default:
	}
	// Closing the jetty flushes its receives (none) and detaches the ring;
	// cancelling ends the wait.
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-waited; err != context.Canceled {
		t.Fatalf("the cancelled wait returned %v", err)
	}
}

// A wait asleep on a CQ's one ring must also see completions of a jetty
// attached to the CQ afterwards.
func TestWaitSeesRingAttachedLater(t *testing.T) {
	c := openContext(t)
	p := openContext(t)
	q, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q, Token: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- q.Wait(ctx) }()
	testenv.WaitParked(t, 1, "IO wait", ringSleep) // on the first jetty's ring

	j2, err := c.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q, Token: 2})
	if err != nil {
		t.Fatal(err)
	}
	seg, err := c.AllocSegment(4096, ub.SegmentConfig{Token: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j2.PostRecv([]ub.RecvWR{{UserCtx: 7, Buf: ub.Local{Seg: seg, Len: 64}}}); err != nil {
		t.Fatal(err)
	}
	pq, err := p.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pj, err := p.NewJetty(ub.JettyConfig{SendCQ: pq, RecvCQ: pq, Token: 4})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := p.ImportJetty(j2.Desc(), 2)
	if err != nil {
		t.Fatal(err)
	}
	pseg, err := p.AllocSegment(4096, ub.SegmentConfig{Token: 5})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pj.PostSend([]ub.WR{{Op: ub.OpSend, Target: tg, Local: ub.Local{Seg: pseg, Len: 64}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the wait missed the second jetty's receive: %v", err)
	}
	out := make([]ub.Completion, 4)
	n, err := q.Poll(out)
	if err != nil || n != 1 || out[0].UserCtx != 7 || out[0].Status != ub.StatusSuccess {
		t.Fatalf("Poll: %d %v %v, want the receive", n, out[:n], err)
	}
}

// A jetty may not use another context's CQ: that CQ's waits hold their
// own context's lock, which this context's Closes do not take.
func TestJettyRefusesForeignCQ(t *testing.T) {
	a := openContext(t)
	b := openContext(t)
	qa, err := a.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if j, err := b.NewJetty(ub.JettyConfig{SendCQ: qa, RecvCQ: qa, Token: 1}); err == nil {
		j.Close()
		t.Fatal("a jetty took another context's CQ")
	}
}
