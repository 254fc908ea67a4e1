// Package leaktest checks that a ub provider gives back what a connection
// took: it makes and closes, over and over, the objects one connection
// of the transport's ub path uses between two long-lived contexts, and
// compares the process's descriptors, shared-memory mappings and
// goroutines with what it held before. Providers' tests use it.
package leaktest

import (
	"context"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/procstat"
	"github.com/ubkit-io/ubkit/ub"
)

// side is one end of a connection: a segment with a credit word and
// receive buffers, three queues, an RC jetty for packets and an RM jetty
// for credit returns, and the peer's jetty and segment imported.
type side struct {
	seg        ub.Segment
	sq, rq, cq ub.CQ
	j, cj      ub.Jetty
	peer       ub.Target
	peerSeg    ub.RemoteSegment
}

const (
	bufs    = 4
	bufSize = 4 << 10
	token   = 0x5eed
)

func newSide(t testing.TB, c ub.Context) *side {
	t.Helper()
	s := &side{}
	var err error
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	s.seg, err = c.AllocSegment(64+2*bufs*bufSize, ub.SegmentConfig{Access: ub.AccessAtomic, Token: token})
	must(err)
	for _, q := range []*ub.CQ{&s.sq, &s.rq, &s.cq} {
		*q, err = c.NewCQ(ub.CQConfig{})
		must(err)
	}
	s.j, err = c.NewJetty(ub.JettyConfig{Mode: ub.ReliableConnection, SendCQ: s.sq, RecvCQ: s.rq, RecvDepth: bufs, MaxMessage: bufSize, Token: token})
	must(err)
	s.cj, err = c.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: s.cq, RecvCQ: s.cq, Token: token})
	must(err)
	return s
}

func (s *side) connect(t testing.TB, c ub.Context, peer *side) {
	t.Helper()
	var err error
	if s.peer, err = c.ImportJetty(peer.j.Desc(), token); err != nil {
		t.Fatal(err)
	}
	if err := s.j.Bind(s.peer); err != nil {
		t.Fatal(err)
	}
	if s.peerSeg, err = c.ImportSegment(peer.seg.Desc(), token); err != nil {
		t.Fatal(err)
	}
	wrs := make([]ub.RecvWR, bufs)
	for i := range wrs {
		wrs[i] = ub.RecvWR{UserCtx: uint64(i), Buf: ub.Local{Seg: s.seg, Offset: 64 + i*bufSize, Len: bufSize}}
	}
	if _, err := s.j.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
}

// post sends a packet to the peer and returns a credit to it.
func (s *side) post(t testing.TB) {
	t.Helper()
	if _, err := s.j.PostSend([]ub.WR{{Op: ub.OpSendImm, Local: ub.Local{Seg: s.seg, Offset: 64 + bufs*bufSize, Len: 100}, Imm: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.cj.PostSend([]ub.WR{{Op: ub.OpFetchAdd, Remote: ub.Remote{Seg: s.peerSeg}, Add: 1}}); err != nil {
		t.Fatal(err)
	}
}

// reap waits for what post sent to complete, and for the peer's packet.
func (s *side) reap(t testing.TB) {
	t.Helper()
	for _, q := range []ub.CQ{s.sq, s.cq, s.rq} {
		if c := waitOne(t, q); c.Status != ub.StatusSuccess {
			t.Fatalf("%v: %v", c.Op, c.Status)
		}
	}
}

func waitOne(t testing.TB, q ub.CQ) ub.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]ub.Completion, 1)
	for {
		if n, err := q.Poll(out); err != nil || n == 1 {
			if err != nil {
				t.Fatal(err)
			}
			return out[0]
		}
		if err := q.Wait(ctx); err != nil {
			t.Fatalf("waiting for a completion: %v", err)
		}
	}
}

func (s *side) close(t testing.TB) {
	t.Helper()
	for _, o := range []interface{ Close() error }{s.peer, s.peerSeg, s.j, s.cj, s.sq, s.rq, s.cq, s.seg} {
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Cycle makes and closes a connection's objects between a and b (which
// may be the same context) n times, a packet and a credit going each way
// every time, and fails the test unless the process's descriptors,
// shared-memory mappings and goroutines come back to what they were
// after the first connection (no more than a couple beyond, for the
// runtime), and logs both.
func Cycle(t testing.TB, a, b ub.Context, n int) {
	t.Helper()
	once := func() {
		x, y := newSide(t, a), newSide(t, b)
		x.connect(t, a, y)
		y.connect(t, b, x)
		x.post(t)
		y.post(t)
		x.reap(t)
		y.reap(t)
		x.close(t)
		y.close(t)
	}
	once() // what a first connection sets up for good is not a leak
	before, err := procstat.Read()
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		once()
	}
	after, err := procstat.Returned(before, procstat.Usage{FDs: 2, Shared: 2, Goroutines: 2}, 5*time.Second)
	if err != nil {
		t.Fatalf("%d connections made and closed: %v", n, err)
	}
	t.Logf("after the first connection: %v; after %d more: %v", before, n, after)
}
