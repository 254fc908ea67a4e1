package ubtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// local is this process's side of a test: a context, a segment, a CQ and an
// RM jetty.
type local struct {
	c   ub.Context
	seg ub.Segment
	cq  ub.CQ
	j   ub.Jetty
}

func newLocal(t *testing.T, open Open, mode ub.Mode) *local {
	t.Helper()
	c, err := open()
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	seg, err := c.AllocSegment(PeerSegmentSize, ub.SegmentConfig{Access: ub.AccessAtomic, Token: peerToken})
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.NewJetty(ub.JettyConfig{Mode: mode, SendCQ: cq, RecvCQ: cq, Token: peerToken})
	if err != nil {
		t.Fatal(err)
	}
	return &local{c: c, seg: seg, cq: cq, j: j}
}

// importSegment imports a peer's segment or fails the test.
func (l *local) importSegment(t *testing.T, desc ub.SegmentDesc, token ub.Token) ub.RemoteSegment {
	t.Helper()
	r, err := l.c.ImportSegment(desc, token)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// importJetty imports a peer's jetty or fails the test.
func (l *local) importJetty(t *testing.T, desc ub.JettyDesc, token ub.Token) ub.Target {
	t.Helper()
	tg, err := l.c.ImportJetty(desc, token)
	if err != nil {
		t.Fatal(err)
	}
	return tg
}

// post posts one work request and returns its completion.
func (l *local) post(t *testing.T, wr ub.WR) ub.Completion {
	t.Helper()
	if _, err := l.j.PostSend([]ub.WR{wr}); err != nil {
		t.Fatalf("post %v: %v", wr.Op, err)
	}
	return l.next(t)
}

func (l *local) next(t *testing.T) ub.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.cq.Wait(ctx); err != nil {
		t.Fatalf("wait for a completion: %v", err)
	}
	out := make([]ub.Completion, 1)
	if n, err := l.cq.Poll(out); n != 1 || err != nil {
		t.Fatalf("poll: %d %v", n, err)
	}
	return out[0]
}

func (l *local) put(off int, data string) ub.Local {
	copy(l.seg.Bytes()[off:], data)
	return ub.Local{Seg: l.seg, Offset: off, Len: len(data)}
}

func wantStatus(t *testing.T, what string, c ub.Completion, want ub.Status) {
	t.Helper()
	if c.Status != want {
		t.Errorf("%s: status %v, want %v", what, c.Status, want)
	}
}

// Run runs the conformance suite against the provider open opens. The test
// binary must call RunPeerIfChild(open) in TestMain. It is RunWith with
// no Options: the RegisterSegment checks register Go slices.
func Run(t *testing.T, open Open) { RunWith(t, open, Options{}) }

// RunWith runs the conformance suite with opts (a provider that registers
// only some memory says where to get it).
func RunWith(t *testing.T, open Open, opts Options) {
	t.Run("UnknownProvider", func(t *testing.T) {
		_, err := ub.Open(context.Background(), "no-such-provider", ub.Config{})
		if err == nil {
			t.Fatal("opened an unknown provider")
		}
		c, _ := open()
		if c != nil {
			defer c.Close()
			if !bytes.Contains([]byte(err.Error()), []byte(c.Provider())) {
				t.Errorf("error %q does not list the registered provider %q", err, c.Provider())
			}
		}
	})
	t.Run("WriteRead", func(t *testing.T) { testWriteRead(t, open) })
	t.Run("AccessChecks", func(t *testing.T) { testAccess(t, open) })
	t.Run("SendRecvOrdered", func(t *testing.T) { testSendRecv(t, open) })
	t.Run("ReceiverNotReady", func(t *testing.T) { testOverrun(t, open) })
	t.Run("Atomics", func(t *testing.T) { testAtomics(t, open) })
	t.Run("Unreliable", func(t *testing.T) { testUnreliable(t, open) })
	t.Run("ReliableConnection", func(t *testing.T) { testConnection(t, open) })
	t.Run("CompletionOrder", func(t *testing.T) { testCompletionOrder(t, open) })
	t.Run("FlushOnClose", func(t *testing.T) { testFlush(t, open) })
	t.Run("PeerDeath", func(t *testing.T) { testPeerDeath(t, open) })
	t.Run("CloseUnderLoad", func(t *testing.T) { testCloseUnderLoad(t, open) })
	t.Run("RegisterSegment", func(t *testing.T) { testRegister(t, open, opts) })
	t.Run("RegisterSegmentAtomics", func(t *testing.T) { testRegisterAtomics(t, open, opts) })
	t.Run("RegisterSegmentCloseUnderWrites", func(t *testing.T) { testRegisterCloseUnderWrites(t, open, opts) })
	t.Run("RegisterSegmentCloseUnderPeerReads", func(t *testing.T) { testRegisterCloseUnderPeerReads(t, open, opts) })
	t.Run("RegisterSegmentCloseUnderReads", func(t *testing.T) { testRegisterCloseUnderReads(t, open, opts) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, open, opts) })
	t.Run("Interrupt", func(t *testing.T) { testInterrupt(t, open) })
}

func testWriteRead(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableMessage)
	r := l.importSegment(t, p.hello.Seg, peerToken)
	c := l.post(t, ub.WR{Op: ub.OpWrite, UserCtx: 7, Local: l.put(0, "hello, bus"), Remote: ub.Remote{Seg: r, Offset: 100}})
	wantStatus(t, "write", c, ub.StatusSuccess)
	if c.UserCtx != 7 || c.Op != ub.OpWrite || c.Len != 10 {
		t.Errorf("write completion %+v", c)
	}
	var got string
	p.do(&got, "read", 100, 10)
	if got != "hello, bus" {
		t.Errorf("peer sees %q after the write completed", got)
	}
	c = l.post(t, ub.WR{Op: ub.OpRead, Local: ub.Local{Seg: l.seg, Offset: 200, Len: 10}, Remote: ub.Remote{Seg: r, Offset: 100}})
	wantStatus(t, "read", c, ub.StatusSuccess)
	if c.Len != 10 {
		t.Errorf("a read of 10 bytes completed with Len %d", c.Len)
	}
	if string(l.seg.Bytes()[200:210]) != "hello, bus" {
		t.Errorf("read back %q", l.seg.Bytes()[200:210])
	}
	// Ordering per jetty: writes issued before a send are visible to the
	// receiver when the send arrives.
	var posted map[string]any
	p.do(&posted, "recv", 1)
	for i := range 50 {
		l.post(t, ub.WR{Op: ub.OpWrite, Local: l.put(300+8*i, fmt.Sprintf("w%07d", i)), Remote: ub.Remote{Seg: r, Offset: 1000 + 8*i}})
	}
	tgt := l.importJetty(t, p.hello.Jetty, peerToken)
	wantStatus(t, "send after writes", l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(800, "done"), Target: tgt}), ub.StatusSuccess)
	var comps []map[string]any
	p.do(&comps, "poll", 1)
	p.do(&got, "read", 1000, 400)
	for i := range 50 {
		if want := fmt.Sprintf("w%07d", i); got[8*i:8*i+8] != want {
			t.Fatalf("write %d not visible when the later send arrived: %q", i, got[8*i:8*i+8])
		}
	}
}

func testAccess(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableMessage)
	bad := l.importSegment(t, p.hello.Seg, peerToken+1)
	ro := l.importSegment(t, p.hello.ReadOnly, peerToken)
	good := l.importSegment(t, p.hello.Seg, peerToken)
	data := l.put(0, "xxxxxxxx")
	cases := []struct {
		name string
		wr   ub.WR
		want ub.Status
	}{
		{"write with a wrong token", ub.WR{Op: ub.OpWrite, Local: data, Remote: ub.Remote{Seg: bad}}, ub.StatusBadToken},
		{"read with a wrong token", ub.WR{Op: ub.OpRead, Local: data, Remote: ub.Remote{Seg: bad}}, ub.StatusBadToken},
		{"write to a read-only segment", ub.WR{Op: ub.OpWrite, Local: data, Remote: ub.Remote{Seg: ro}}, ub.StatusNoPermission},
		{"atomic on a read-only segment", ub.WR{Op: ub.OpFetchAdd, Remote: ub.Remote{Seg: ro}, Add: 1}, ub.StatusNoPermission},
		{"read of a read-only segment", ub.WR{Op: ub.OpRead, Local: ub.Local{Seg: l.seg, Offset: 0, Len: 9}, Remote: ub.Remote{Seg: ro}}, ub.StatusSuccess},
		{"write past the end", ub.WR{Op: ub.OpWrite, Local: data, Remote: ub.Remote{Seg: good, Offset: PeerSegmentSize - 4}}, ub.StatusOutOfBounds},
		{"write at a negative offset", ub.WR{Op: ub.OpWrite, Local: data, Remote: ub.Remote{Seg: good, Offset: -8}}, ub.StatusOutOfBounds},
		{"read past the end", ub.WR{Op: ub.OpRead, Local: data, Remote: ub.Remote{Seg: good, Offset: PeerSegmentSize}}, ub.StatusOutOfBounds},
		{"atomic past the end", ub.WR{Op: ub.OpFetchAdd, Remote: ub.Remote{Seg: good, Offset: PeerSegmentSize}, Add: 1}, ub.StatusOutOfBounds},
		{"misaligned atomic", ub.WR{Op: ub.OpCAS, Remote: ub.Remote{Seg: good, Offset: 4}}, ub.StatusMisaligned},
		{"local buffer out of range", ub.WR{Op: ub.OpWrite, Local: ub.Local{Seg: l.seg, Offset: PeerSegmentSize, Len: 8}, Remote: ub.Remote{Seg: good}}, ub.StatusLocalLength},
	}
	for _, tc := range cases {
		wantStatus(t, tc.name, l.post(t, tc.wr), tc.want)
	}
	if string(l.seg.Bytes()[:9]) != "read only" {
		t.Errorf("read of the read-only segment got %q", l.seg.Bytes()[:9])
	}
	var got string
	p.do(&got, "read", 0, 8)
	if got == "xxxxxxxx" {
		t.Error("a refused write reached the peer's memory")
	}
}

func testSendRecv(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableMessage)
	tgt := l.importJetty(t, p.hello.Jetty, peerToken)
	var posted map[string]any
	p.do(&posted, "recv", 100)
	wrs := make([]ub.WR, 100)
	for i := range wrs {
		op := ub.OpSend
		if i%3 == 0 {
			op = ub.OpSendImm
		}
		wrs[i] = ub.WR{Op: op, UserCtx: uint64(i), Local: l.put(i*16, fmt.Sprintf("message %3d", i)), Target: tgt, Imm: uint64(i * 7)}
	}
	if n, err := l.j.PostSend(wrs); n != 100 || err != nil {
		t.Fatalf("posted %d: %v", n, err)
	}
	for i := range 100 {
		c := l.next(t)
		if c.Status != ub.StatusSuccess || c.UserCtx != uint64(i) {
			t.Fatalf("send completion %d: %+v", i, c)
		}
	}
	var comps []struct {
		Status string `json:"status"`
		Op     string `json:"op"`
		Ctx    uint64 `json:"ctx"`
		Len    int    `json:"len"`
		Imm    uint64 `json:"imm"`
		HasImm bool   `json:"hasImm"`
		Data   string `json:"data"`
	}
	p.do(&comps, "poll", 100)
	if len(comps) != 100 {
		t.Fatalf("peer got %d receive completions, want 100", len(comps))
	}
	for i, c := range comps {
		if c.Status != "success" || c.Op != "recv" || c.Ctx != uint64(1000+i) || c.Data != fmt.Sprintf("message %3d", i) {
			t.Fatalf("receive %d out of order or wrong: %+v", i, c)
		}
		if hasImm := i%3 == 0; c.HasImm != hasImm || (hasImm && c.Imm != uint64(i*7)) {
			t.Fatalf("receive %d immediate: %+v", i, c)
		}
	}
	// WriteImm writes, then notifies through a posted receive.
	r := l.importSegment(t, p.hello.Seg, peerToken)
	p.do(&posted, "recv", 1)
	wantStatus(t, "write-imm", l.post(t, ub.WR{Op: ub.OpWriteImm, Local: l.put(0, "imm!"), Remote: ub.Remote{Seg: r, Offset: 64}, Target: tgt, Imm: 99}), ub.StatusSuccess)
	p.do(&comps, "poll", 1)
	if len(comps) != 1 || comps[0].Op != "write-imm" || !comps[0].HasImm || comps[0].Imm != 99 {
		t.Fatalf("write-imm notification: %+v", comps)
	}
	// A message larger than the posted buffer fails on both sides.
	p.do(&posted, "recv", 1)
	big := make([]byte, msgSize+1)
	copy(l.seg.Bytes()[4096:], big)
	wantStatus(t, "send larger than the receive buffer", l.post(t, ub.WR{Op: ub.OpSend, Local: ub.Local{Seg: l.seg, Offset: 4096, Len: len(big)}, Target: tgt}), ub.StatusRemoteLength)
	p.do(&comps, "poll", 1)
	if len(comps) != 1 || comps[0].Status != ub.StatusRemoteLength.String() {
		t.Fatalf("receiver of the oversized message: %+v", comps)
	}
	// A wrong jetty token is refused.
	badTgt := l.importJetty(t, p.hello.Jetty, peerToken+1)
	wantStatus(t, "send with a wrong token", l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "x"), Target: badTgt}), ub.StatusBadToken)
}

func testOverrun(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableMessage)
	tgt := l.importJetty(t, p.hello.Jetty, peerToken)
	var posted map[string]any
	p.do(&posted, "recv", 2)
	for i, want := range []ub.Status{ub.StatusSuccess, ub.StatusSuccess, ub.StatusReceiverNotReady} {
		wantStatus(t, fmt.Sprintf("send %d with 2 receives posted", i), l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "m"), Target: tgt}), want)
	}
}

func testAtomics(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	// Our own word, hammered by two peer processes and by us.
	self := l.importSegment(t, l.seg.Desc(), peerToken)
	const off, n = 512, 400
	c := l.post(t, ub.WR{Op: ub.OpCAS, Remote: ub.Remote{Seg: self, Offset: off}, Compare: 0, Swap: 0})
	wantStatus(t, "cas", c, ub.StatusSuccess)
	desc, _ := json.Marshal(l.seg.Desc())
	peers := []*peer{startPeer(t), startPeer(t)}
	done := make(chan string, len(peers))
	for _, p := range peers {
		go func() {
			fmt.Fprintln(p.in, "add", off, n, string(desc))
			p.in.Flush()
			var r string
			if err := p.out.Decode(&r); err != nil {
				r = err.Error()
			}
			done <- r
		}()
	}
	for i := range n {
		c := l.post(t, ub.WR{Op: ub.OpFetchAdd, Remote: ub.Remote{Seg: self, Offset: off}, Add: 1, Local: ub.Local{Seg: l.seg, Offset: 8}})
		if c.Status != ub.StatusSuccess || binary.LittleEndian.Uint64(l.seg.Bytes()[8:]) != c.Value {
			t.Fatalf("fetch-add %d: %+v", i, c)
		}
	}
	for range peers {
		if r := <-done; r != "ok" {
			t.Fatalf("peer: %s", r)
		}
	}
	if got := binary.LittleEndian.Uint64(l.seg.Bytes()[off:]); got != 3*n {
		t.Fatalf("word is %d after %d increments from three processes", got, 3*n)
	}
	c = l.post(t, ub.WR{Op: ub.OpCAS, Remote: ub.Remote{Seg: self, Offset: off}, Compare: 1, Swap: 5})
	if c.Value != 3*n || binary.LittleEndian.Uint64(l.seg.Bytes()[off:]) != 3*n {
		t.Errorf("failed CAS changed the word or misreported it: %+v", c)
	}
}

func testUnreliable(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.Unreliable)
	r := l.importSegment(t, p.hello.Seg, peerToken)
	tgt := l.importJetty(t, p.hello.Jetty, peerToken)
	for _, op := range []ub.Opcode{ub.OpWrite, ub.OpRead, ub.OpCAS, ub.OpFetchAdd} {
		wantStatus(t, op.String()+" in unreliable mode", l.post(t, ub.WR{Op: op, Local: l.put(0, "12345678"), Remote: ub.Remote{Seg: r}}), ub.StatusUnsupported)
	}
	// No receive posted: the message is dropped, not an error.
	wantStatus(t, "unreliable send without a receive", l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "lost"), Target: tgt}), ub.StatusSuccess)
}

func testConnection(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableConnection)
	tgt := l.importJetty(t, p.hello.Jetty, peerToken)
	// Unbound: a send has nowhere to go.
	wantStatus(t, "send on an unbound connection", l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "x")}), ub.StatusUnsupported)
	if err := l.j.Bind(tgt); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "a connection bound twice", l.j.Bind(tgt), ub.ErrInvalidArgument)
	var posted map[string]any
	p.do(&posted, "recv", 2)
	wantStatus(t, "send on the bound connection", l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "bound")}), ub.StatusSuccess)
	other := l.importJetty(t, startPeer(t).hello.Jetty, peerToken)
	wantStatus(t, "send to another peer on a bound connection", l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "x"), Target: other}), ub.StatusUnsupported)
	var comps []map[string]any
	p.do(&comps, "poll", 1)
	if len(comps) != 1 || comps[0]["data"] != "bound" {
		t.Fatalf("peer received %v", comps)
	}
	// A reliable-message jetty cannot be bound.
	rm := newLocal(t, open, ub.ReliableMessage)
	wantErr(t, "Bind of a reliable-message jetty", rm.j.Bind(tgt), ub.ErrInvalidArgument)
}

func testCompletionOrder(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableMessage)
	r := l.importSegment(t, p.hello.Seg, peerToken)
	wrs := make([]ub.WR, 64)
	for i := range wrs {
		wrs[i] = ub.WR{Op: ub.OpWrite, UserCtx: uint64(i), Local: l.put(0, "z"), Remote: ub.Remote{Seg: r, Offset: i}}
		if i%5 == 0 {
			wrs[i].Remote.Offset = -1 // some fail; they still complete, in order
		}
	}
	if n, err := l.j.PostSend(wrs); n != len(wrs) || err != nil {
		t.Fatalf("posted %d: %v", n, err)
	}
	out := make([]ub.Completion, 0, 100)
	for len(out) < len(wrs) {
		out = append(out, l.next(t))
	}
	for i, c := range out {
		want := ub.StatusSuccess
		if i%5 == 0 {
			want = ub.StatusOutOfBounds
		}
		if c.UserCtx != uint64(i) || c.Status != want {
			t.Fatalf("completion %d: %+v", i, c)
		}
	}
	time.Sleep(10 * time.Millisecond)
	if n, _ := l.cq.Poll(make([]ub.Completion, 8)); n != 0 {
		t.Fatalf("%d extra completions", n)
	}
}

func testFlush(t *testing.T, open Open) {
	l := newLocal(t, open, ub.ReliableMessage)
	wrs := []ub.RecvWR{{UserCtx: 1, Buf: ub.Local{Seg: l.seg, Len: 64}}, {UserCtx: 2, Buf: ub.Local{Seg: l.seg, Offset: 64, Len: 64}}}
	if _, err := l.j.PostRecv(wrs); err != nil {
		t.Fatal(err)
	}
	if err := l.j.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c := l.next(t)
		if c.Status != ub.StatusFlushed || c.Op != ub.OpRecv || c.UserCtx != uint64(i+1) {
			t.Fatalf("flushed receive %d: %+v", i, c)
		}
	}
	_, err := l.j.PostSend([]ub.WR{{Op: ub.OpWrite}})
	wantErr(t, "post on a closed jetty", err, ub.ErrClosed)
}

func testPeerDeath(t *testing.T, open Open) {
	p := startPeer(t)
	l := newLocal(t, open, ub.ReliableMessage)
	r := l.importSegment(t, p.hello.Seg, peerToken)
	tgt := l.importJetty(t, p.hello.Jetty, peerToken)
	var posted map[string]any
	p.do(&posted, "recv", 4)
	wantStatus(t, "write before the peer dies", l.post(t, ub.WR{Op: ub.OpWrite, Local: l.put(0, "alive"), Remote: ub.Remote{Seg: r}}), ub.StatusSuccess)
	p.kill()
	// The death must show within a bounded time, as a status.
	deadline := time.Now().Add(5 * time.Second)
	for {
		w := l.post(t, ub.WR{Op: ub.OpWrite, Local: l.put(0, "dead?"), Remote: ub.Remote{Seg: r}})
		s := l.post(t, ub.WR{Op: ub.OpSend, Local: l.put(0, "dead?"), Target: tgt})
		if w.Status == ub.StatusPeerDead && s.Status == ub.StatusPeerDead {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the peer died: write %v, send %v", w.Status, s.Status)
		}
		time.Sleep(time.Millisecond)
	}
}

// testCloseUnderLoad closes objects while other goroutines use them: the
// owner's segment while a peer writes into it, and the sender's context
// while it posts. Operations may fail; nothing may crash or hang.
func testCloseUnderLoad(t *testing.T, open Open) {
	for round := range 20 {
		rx, tx := newLocal(t, open, ub.ReliableMessage), newLocal(t, open, ub.ReliableMessage)
		victim, err := rx.c.AllocSegment(1<<16, ub.SegmentConfig{Access: ub.AccessWrite, Token: peerToken})
		if err != nil {
			t.Fatal(err)
		}
		r, err := tx.c.ImportSegment(victim.Desc(), peerToken)
		if err != nil {
			t.Fatal(err)
		}
		tgt, err := tx.c.ImportJetty(rx.j.Desc(), peerToken)
		if err != nil {
			t.Fatal(err)
		}
		rx.j.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: rx.seg, Len: 64}}})
		done := make(chan struct{})
		go func() {
			defer close(done)
			out := make([]ub.Completion, 16)
			for {
				_, err := tx.j.PostSend([]ub.WR{
					{Op: ub.OpWrite, Local: ub.Local{Seg: tx.seg, Len: 4096}, Remote: ub.Remote{Seg: r}},
					{Op: ub.OpSend, Local: ub.Local{Seg: tx.seg, Len: 64}, Target: tgt},
				})
				if err != nil {
					return
				}
				if _, err := tx.cq.Poll(out); err != nil {
					return
				}
			}
		}()
		time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
		if err := victim.Close(); err != nil {
			t.Errorf("close a segment under remote writes: %v", err)
		}
		time.Sleep(time.Duration(round%3) * 100 * time.Microsecond)
		tx.c.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a post kept going 10 s after its context closed")
		}
	}
}
