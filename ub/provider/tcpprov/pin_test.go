package tcpprov

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// openPinWatched opens a context whose pins are announced on the channel
// it returns.
func openPinWatched(t *testing.T) (*Context, chan struct{}) {
	pins := make(chan struct{}, 1)
	c := openWith(t, options{connsPerSource: maxConnsPerSource, conns: maxConns, pinned: func() {
		select {
		case pins <- struct{}{}:
		default:
		}
	}})
	return c, pins
}

// stalling is a context with a jetty and a segment of a peer that the
// test plays with serve, on the one connection the context makes to it.
type stalling struct {
	c    *Context
	pins chan struct{} // a pin was taken
	r    ub.RemoteSegment
	cq   ub.CQ
	j    ub.Jetty
}

func newStalling(t *testing.T, size int, serve func(nc net.Conn)) *stalling {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		serve(nc)
	}()
	st := &stalling{}
	st.c, st.pins = openPinWatched(t)
	if st.r, err = st.c.ImportSegment(ub.SegmentDesc{Provider: Name, Name: l.Addr().String() + "/s1", Size: size}, 1); err != nil {
		t.Fatal(err)
	}
	if st.cq, err = st.c.NewCQ(ub.CQConfig{}); err != nil {
		t.Fatal(err)
	}
	if st.j, err = st.c.NewJetty(ub.JettyConfig{SendCQ: st.cq, RecvCQ: st.cq}); err != nil {
		t.Fatal(err)
	}
	return st
}

// failed waits for the one completion, failing the test unless it failed
// with status want (any status but success for want StatusSuccess).
func (st *stalling) failed(t *testing.T, what string, want ub.Status) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := st.cq.Wait(ctx); err != nil {
		t.Fatalf("the stalled %s did not complete: %v", what, err)
	}
	comp := make([]ub.Completion, 1)
	n, _ := st.cq.Poll(comp)
	got := comp[0].Status
	if n != 1 || got == ub.StatusSuccess || (want != ub.StatusSuccess && got != want) {
		t.Fatalf("the stalled %s completed %d times, status %v; want a failure (%v)", what, n, comp[0].Status, want)
	}
}

// closeWithin closes seg, failing the test if Close has not returned
// within hangGuard.
func closeWithin(t *testing.T, seg ub.Segment) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- seg.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("Close of a segment did not return: a stalled peer holds it")
	}
}

// TestStalledReaderDoesNotHoldClose: a peer asks for a 64 MiB read of a
// registered segment (more than any socket buffers hold) and does not
// read the answer, so the server is blocked writing it straight from the
// memory. Close of the registration still returns (breaking that
// connection once it moved nothing for drainGrace), and the peer's
// stream ends short.
func TestStalledReaderDoesNotHoldClose(t *testing.T) {
	c, pins := openPinWatched(t)
	const size = maxFrame - respHeader
	mem := make([]byte, size)
	seg, err := c.RegisterSegment(mem, ub.SegmentConfig{Access: ub.AccessRead, Token: 7})
	if err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, c.Addr())
	if err := rc.write(request{op: opRead, token: 7, object: seg.(*segment).id, n: size}); err != nil {
		t.Fatal(err)
	}
	if err := rc.w.Flush(); err != nil {
		t.Fatal(err)
	}
	<-pins // the server is writing the answer from mem
	closeWithin(t, seg)
	clear(mem)
	n, err := io.Copy(io.Discard, rc.r)
	if n >= size {
		t.Fatalf("the stalled peer got its whole answer (%d bytes) after Close", n)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the stalled peer's connection stayed open after Close (%d bytes read): %v", n, err)
	}
}

// TestStalledAnswerDoesNotHoldClose: a peer answers a 1 MiB Read with
// its header and 100 bytes, then stalls. Close of the registration the
// data goes into still returns (breaking the connection once nothing
// moved for drainGrace), and the Read completes with StatusLocalLength,
// as every request whose local buffer was closed under it.
func TestStalledAnswerDoesNotHoldClose(t *testing.T) {
	const size = 1 << 20
	st := newStalling(t, size, func(nc net.Conn) {
		if _, err := readFrame(nc, nil, reqHeader); err != nil {
			return
		}
		nc.Write(appendResponseHeader(nil, uint8(ub.StatusSuccess), 0, size))
		nc.Write(make([]byte, 100))
		io.Copy(io.Discard, nc) // stalls: reads until the client hangs up
	})
	seg, err := st.c.RegisterSegment(make([]byte, size), ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.j.PostSend([]ub.WR{{Op: ub.OpRead, Local: ub.Local{Seg: seg, Len: size}, Remote: ub.Remote{Seg: st.r}}}); err != nil {
		t.Fatal(err)
	}
	<-st.pins // the client is reading the data into place
	closeWithin(t, seg)
	st.failed(t, "Read", ub.StatusLocalLength)
}

// TestStalledWriteDoesNotWedgeContext: a Write of 64 MiB to a peer that
// never reads blocks its PostSend in the socket write, with its source
// segment pinned. Meanwhile the context serves others (a segment of its
// own is read and closed at once), and Close of the source returns,
// breaking that connection once nothing moved for drainGrace, which ends
// the PostSend; the Write completes as failed.
func TestStalledWriteDoesNotWedgeContext(t *testing.T) {
	const size = maxFrame - reqHeader
	held := make(chan struct{})
	defer close(held)
	st := newStalling(t, size, func(net.Conn) { <-held }) // never reads
	src, err := st.c.RegisterSegment(make([]byte, size), ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	posted := make(chan error, 1)
	go func() {
		_, err := st.j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: src, Len: size}, Remote: ub.Remote{Seg: st.r}}})
		posted <- err
	}()
	<-st.pins // the payload is being written from src

	// Others are served meanwhile, and an unrelated Close is not held.
	other, err := st.c.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessRead, Token: 9})
	if err != nil {
		t.Fatal(err)
	}
	rc := dialRaw(t, st.c.Addr())
	if err := rc.write(request{op: opRead, token: 9, object: other.(*segment).id, n: 8}); err != nil {
		t.Fatal(err)
	}
	if err := rc.w.Flush(); err != nil {
		t.Fatal(err)
	}
	if resp, err := rc.read(); err != nil || ub.Status(resp.status) != ub.StatusSuccess {
		t.Fatalf("a read from another peer during the stalled Write: %v, %v", ub.Status(resp.status), err)
	}
	closeWithin(t, other)

	closeWithin(t, src)
	select {
	case err := <-posted:
		if err != nil {
			t.Fatalf("PostSend: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("PostSend of the stalled Write did not return after its source closed")
	}
	st.failed(t, "Write", ub.StatusSuccess)
}
