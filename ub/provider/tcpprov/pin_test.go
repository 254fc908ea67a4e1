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
	pins := make(chan struct{}, 16)
	c := openWith(t, options{connsPerSource: maxConnsPerSource, conns: maxConns, pinned: func() { pins <- struct{}{} }})
	return c, pins
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

// TestStalledReaderDoesNotHoldClose: a peer asks for a 32 MiB read of a
// registered segment and stops reading the answer a few bytes in, so the
// server is blocked writing it straight from the memory. Close of the
// registration still returns (breaking that connection after
// drainGrace), the peer's stream ends short, and the memory is the
// caller's again.
func TestStalledReaderDoesNotHoldClose(t *testing.T) {
	c, pins := openPinWatched(t)
	const size = 32 << 20
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
// data goes into still returns (breaking the connection after
// drainGrace), and the Read completes as failed.
func TestStalledAnswerDoesNotHoldClose(t *testing.T) {
	const size = 1 << 20
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if _, err := readFrame(nc, nil, reqHeader); err != nil {
			return
		}
		nc.Write(appendResponseHeader(nil, uint8(ub.StatusSuccess), 0, size))
		nc.Write(make([]byte, 100))
		io.Copy(io.Discard, nc) // stalls: reads until the client hangs up
	}()
	c, pins := openPinWatched(t)
	mem := make([]byte, size)
	seg, err := c.RegisterSegment(mem, ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.ImportSegment(ub.SegmentDesc{Provider: Name, Name: l.Addr().String() + "/s1", Size: size}, 1)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.PostSend([]ub.WR{{Op: ub.OpRead, Local: ub.Local{Seg: seg, Len: size}, Remote: ub.Remote{Seg: r}}}); err != nil {
		t.Fatal(err)
	}
	<-pins // the client is reading the data into mem
	closeWithin(t, seg)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if err := cq.Wait(ctx); err != nil {
		t.Fatalf("the stalled Read did not complete: %v", err)
	}
	comp := make([]ub.Completion, 1)
	if n, _ := cq.Poll(comp); n != 1 || comp[0].Status == ub.StatusSuccess {
		t.Fatalf("the stalled Read completed %d times, status %v; want a failure", n, comp[0].Status)
	}
}
