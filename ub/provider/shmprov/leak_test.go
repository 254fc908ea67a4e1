package shmprov

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/procstat"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/leaktest"
)

// TestCloseReturnsEverything: connections made and closed between two
// long-lived contexts leave neither descriptors nor mappings behind (the
// peer's segments a sender mapped to deliver into go with its target),
// and the contexts hold nothing of them.
func TestCloseReturnsEverything(t *testing.T) {
	a, b := openForTest(t), openForTest(t)
	leaktest.Cycle(t, a, b, 200)
	for _, c := range []*Context{a, b} {
		c.mu.Lock()
		n := c.objects.Len()
		c.mu.Unlock()
		if n != 0 {
			t.Errorf("the context still holds %d closed objects", n)
		}
	}
}

func openForTest(t *testing.T) *Context {
	t.Helper()
	c, err := provider{}.Open(context.Background(), ub.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*Context)
}

// TestMappedBuffersBounded: a receiver whose posted receives name many
// segments (a hostile one could name as many as it likes) gets every
// message, while the sender keeps at most maxMappedBufs of them mapped;
// a segment deregistered after its receive was posted is refused and
// unmapped.
func TestMappedBuffersBounded(t *testing.T) {
	a, b := openForTest(t), openForTest(t)
	newJetty := func(c *Context) (ub.Jetty, ub.CQ) {
		q, err := c.NewCQ(ub.CQConfig{})
		if err != nil {
			t.Fatal(err)
		}
		j, err := c.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: q, RecvCQ: q, RecvDepth: 64, Token: 7})
		if err != nil {
			t.Fatal(err)
		}
		return j, q
	}
	sj, sq := newJetty(a)
	rj, rq := newJetty(b)
	tg, err := a.ImportJetty(rj.Desc(), 7)
	if err != nil {
		t.Fatal(err)
	}
	src, err := a.AllocSegment(64, ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]ub.Completion, 1)
	send := func(i int, want ub.Status, into ub.Segment) {
		t.Helper()
		src.Bytes()[0] = byte(i)
		if _, err := sj.PostSend([]ub.WR{{Op: ub.OpSend, UserCtx: uint64(i), Local: ub.Local{Seg: src, Len: 1}, Target: tg}}); err != nil {
			t.Fatal(err)
		}
		if k, _ := sq.Poll(out); k != 1 || out[0].Status != want {
			t.Fatalf("send %d: %d completions %v, want %v", i, k, out[0], want)
		}
		if want == ub.StatusSuccess && into.Bytes()[0] != byte(i) {
			t.Fatalf("send %d landed elsewhere", i)
		}
		if k, _ := rq.Poll(out); k != 1 || out[0].UserCtx != uint64(i) {
			t.Fatalf("receive %d: %d completions, %v", i, k, out[0])
		}
	}
	mapped := func() int {
		tt := tg.(*target)
		tt.mu.Lock()
		defer tt.mu.Unlock()
		return len(tt.bufs)
	}
	post := func(seg ub.Segment, ctx int) {
		t.Helper()
		if _, err := rj.PostRecv([]ub.RecvWR{{UserCtx: uint64(ctx), Buf: ub.Local{Seg: seg, Len: 64}}}); err != nil {
			t.Fatal(err)
		}
	}
	const n = 3 * maxMappedBufs
	segs := make([]ub.Segment, n)
	for i := range segs {
		if segs[i], err = b.AllocSegment(64, ub.SegmentConfig{}); err != nil {
			t.Fatal(err)
		}
		post(segs[i], i)
	}
	for i := range n {
		send(i, ub.StatusSuccess, segs[i])
		if m := mapped(); m > maxMappedBufs {
			t.Fatalf("after %d sends the sender maps %d of the receiver's segments", i+1, m)
		}
	}
	// A segment deregistered while the sender has it mapped.
	late, err := b.AllocSegment(64, ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	post(late, n)
	post(late, n+1)
	send(n, ub.StatusSuccess, late)
	before := mapped()
	late.Close()
	send(n+1, ub.StatusRemoteLength, nil)
	if m := mapped(); m != before-1 {
		t.Fatalf("the deregistered segment stayed mapped (%d mapped, %d before)", m, before)
	}
}

// TestDeliveryUsesImportedSegment: a send into a receive posted in a
// segment the sender imported maps nothing more (the transport's ub path
// imports the segment its peer receives in, so a connection takes all its
// descriptors when it is set up); once the import is closed, the target
// maps the segment itself.
func TestDeliveryUsesImportedSegment(t *testing.T) {
	a, b := openForTest(t), openForTest(t)
	aq, _ := a.NewCQ(ub.CQConfig{})
	bq, _ := b.NewCQ(ub.CQConfig{})
	sj, err := a.NewJetty(ub.JettyConfig{SendCQ: aq, RecvCQ: aq, Token: 7})
	if err != nil {
		t.Fatal(err)
	}
	rj, err := b.NewJetty(ub.JettyConfig{SendCQ: bq, RecvCQ: bq, Token: 7})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := a.ImportJetty(rj.Desc(), 7)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := a.AllocSegment(64, ub.SegmentConfig{})
	dst, _ := b.AllocSegment(64, ub.SegmentConfig{Access: ub.AccessRead, Token: 9})
	imp, err := a.ImportSegment(dst.Desc(), 9)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]ub.Completion, 1)
	sendOne := func() int {
		t.Helper()
		if _, err := rj.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: dst, Len: 64}}}); err != nil {
			t.Fatal(err)
		}
		before, _ := procstat.Read()
		if _, err := sj.PostSend([]ub.WR{{Op: ub.OpSend, Local: ub.Local{Seg: src, Len: 8}, Target: tg}}); err != nil {
			t.Fatal(err)
		}
		if k, _ := aq.Poll(out); k != 1 || out[0].Status != ub.StatusSuccess {
			t.Fatalf("send: %d completions, %v", k, out[0])
		}
		if k, _ := bq.Poll(out); k != 1 || out[0].Status != ub.StatusSuccess {
			t.Fatalf("receive: %d completions, %v", k, out[0])
		}
		after, _ := procstat.Read()
		return after.Sub(before).FDs
	}
	if fds := sendOne(); fds != 0 {
		t.Errorf("a send into an imported segment opened %d descriptors", fds)
	}
	imp.Close()
	if fds := sendOne(); fds != 1 {
		t.Errorf("a send into a segment no longer imported opened %d descriptors, want 1 (its own mapping)", fds)
	}
}

// TestRegistrationReturnsEverything: registering memory, importing the
// registration (its segment and the memory's), writing and closing, over
// and over, leaves neither descriptors nor mappings behind, and the
// contexts hold nothing of it: a registration costs what an allocated
// segment costs, and gives it back.
func TestRegistrationReturnsEverything(t *testing.T) {
	owner, peer := openForTest(t), openForTest(t)
	mem, err := shm.CreateSegment(fmt.Sprintf("regleak-%d-%d", os.Getpid(), time.Now().UnixNano()), 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	q, err := peer.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := peer.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	if err != nil {
		t.Fatal(err)
	}
	src, err := peer.AllocSegment(64, ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]ub.Completion, 1)
	once := func(i int) {
		reg, err := owner.RegisterSegment(mem.Data()[i%64*64:][:64], ub.SegmentConfig{Access: ub.AccessWrite, Token: 3})
		if err != nil {
			t.Fatal(err)
		}
		r, err := peer.ImportSegment(reg.Desc(), 3)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: src, Len: 8}, Remote: ub.Remote{Seg: r}}}); err != nil {
			t.Fatal(err)
		}
		if n, _ := q.Poll(out); n != 1 || out[0].Status != ub.StatusSuccess {
			t.Fatalf("write %d: %+v", i, out[:n])
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if err := reg.Close(); err != nil {
			t.Fatal(err)
		}
	}
	once(0)
	before, err := procstat.Read()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		once(i)
	}
	after, err := procstat.Returned(before, procstat.Usage{FDs: 2, Shared: 2, Goroutines: 2}, 5*time.Second)
	if err != nil {
		t.Fatalf("200 registrations made, imported and closed: %v", err)
	}
	t.Logf("after the first registration: %v; after 200 more: %v", before, after)
	// The peer keeps its queue, jetty and scratch segment; nothing else.
	for c, want := range map[*Context]int{owner: 0, peer: 3} {
		c.mu.Lock()
		n := c.objects.Len()
		c.mu.Unlock()
		if n != want {
			t.Errorf("a context holds %d objects, want %d", n, want)
		}
	}
}
