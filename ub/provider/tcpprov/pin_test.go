package tcpprov

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// openPinWatched opens a context whose pins are announced on the channel
// it returns.
func openPinWatched(t *testing.T) (*Context, chan struct{}) {
	pins := make(chan struct{}, 1)
	c := openWith(t, options{connsPerSource: maxConnsPerSource, conns: maxConns, pinned: func() { signal(pins) }})
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
	within(t, done, "Close of a segment (a stalled peer holds it?)")
}

// within waits for what's result, failing the test if it is an error or
// has not come within hangGuard.
func within(t *testing.T, result <-chan error, what string) {
	t.Helper()
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(hangGuard):
		t.Fatalf("%s did not return", what)
	}
}

// signal sends on ch unless a signal is already waiting there.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// filledSegment registers size bytes of 0xAA for reading with token 7.
func filledSegment(t *testing.T, c *Context, size int) ([]byte, *segment) {
	t.Helper()
	mem := bytes.Repeat([]byte{0xAA}, size)
	seg, err := c.RegisterSegment(mem, ub.SegmentConfig{Access: ub.AccessRead, Token: 7})
	if err != nil {
		t.Fatal(err)
	}
	return mem, seg.(*segment)
}

// askRead is a raw peer that asked for a Read of seg's first n bytes.
func askRead(t *testing.T, c *Context, seg *segment, n int) *rawConn {
	t.Helper()
	rc := dialRaw(t, c.Addr())
	if err := rc.write(request{op: opRead, token: 7, object: seg.id, n: uint32(n)}); err != nil {
		t.Fatal(err)
	}
	if err := rc.w.Flush(); err != nil {
		t.Fatal(err)
	}
	return rc
}

// readAnswer reads what is left of a Read's answer of n bytes on rc,
// checking every byte is 0xAA; before each read, gate (if not nil) is
// given the payload bytes read so far and returns once the reader may go
// on. It returns the payload bytes read and what ended the reading.
func readAnswer(t *testing.T, rc *rawConn, n int, gate func(got int)) (int, error) {
	t.Helper()
	var hdr [4 + respHeader]byte
	if _, err := io.ReadFull(rc.r, hdr[:]); err != nil {
		return 0, err
	}
	buf := make([]byte, 64<<10)
	got := 0
	for got < n {
		if gate != nil {
			gate(got)
		}
		k, err := rc.r.Read(buf[:min(len(buf), n-got)])
		if bytes.Count(buf[:k], []byte{0xAA}) != k {
			t.Fatalf("the answer holds bytes other than the memory's before Close, at %d: it was read after Close returned", got)
		}
		got += k
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

// TestStalledReaderDoesNotHoldClose: a peer asks for a 64 MiB read of a
// registered segment (0xAA) and does not read the answer, so the server
// is blocked writing it straight from the memory (wherever socket buffers
// hold less). Close of the registration still returns, breaking that
// connection once it moved nothing for drainGrace; then the memory is
// cleared, and whatever the peer got is the memory as it was before.
func TestStalledReaderDoesNotHoldClose(t *testing.T) {
	c, pins := openPinWatched(t)
	const size = maxFrame - respHeader
	mem, seg := filledSegment(t, c, size)
	rc := askRead(t, c, seg, size)
	<-pins // the server is writing the answer from mem
	closeWithin(t, seg)
	clear(mem)
	n, err := readAnswer(t, rc, size, nil)
	var ne net.Error
	if n < size && errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the stalled peer's connection stayed open after Close (%d bytes read): %v", n, err)
	}
}

// TestStalledConnectionCutBesideAMovingOne: two peers ask for 48 MiB of a
// registered segment; one stops reading, the other reads 8 MiB after each
// look the segment's Close takes at them (more than the sockets' buffers
// hold, so its connection moves between any two looks) until the stalled
// one is cut, then the rest. Close cuts the
// stalled connection while the moving one is still being written (each
// connection's own progress is what counts, not the segment's), and
// waits for the moving one, which gets its whole answer, all of it the
// memory before Close.
func TestStalledConnectionCutBesideAMovingOne(t *testing.T) {
	const size, step = 48 << 20, 8 << 20
	var (
		c       *Context
		seg     *segment
		closing atomic.Bool
		once    sync.Once
		pinsCut int // the moving connection's pins as the stalled one went
	)
	pins, looks, cut := make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	c = openWith(t, options{connsPerSource: maxConnsPerSource, conns: maxConns,
		pinned: func() { signal(pins) },
		looked: func() { signal(looks) },
		servedChanged: func() {
			if !closing.Load() {
				return
			}
			c.mu.Lock()
			n := len(c.served)
			c.mu.Unlock()
			if n != 1 {
				return
			}
			once.Do(func() {
				seg.pinMu.Lock()
				pinsCut = len(seg.pinned)
				seg.pinMu.Unlock()
				close(cut)
			})
		}})
	mem, s := filledSegment(t, c, size)
	seg = s
	stalled := askRead(t, c, seg, size)
	<-pins
	moving := askRead(t, c, seg, size)
	<-pins
	closing.Store(true)
	closed := make(chan error, 1)
	go func() { closed <- seg.Close() }()
	allowed := 0
	n, err := readAnswer(t, moving, size, func(got int) {
		for got >= allowed {
			select {
			case <-looks:
				allowed += step
			case <-cut:
				allowed = size
			case <-time.After(hangGuard):
				t.Fatal("the stalled connection was not cut")
			}
		}
	})
	if n != size {
		t.Fatalf("the moving peer got %d bytes of %d: %v", n, size, err)
	}
	within(t, closed, "Close")
	clear(mem)
	<-cut // closed before the moving peer could read on past its steps
	if pinsCut == 0 {
		t.Fatal("the stalled connection was cut only once the moving one was done")
	}
	if n, _ := readAnswer(t, stalled, size, nil); n == size {
		t.Fatalf("the stalled peer got all %d bytes", n)
	}
}

// TestStalledAnswerDoesNotHoldClose: a peer answers the first of two
// 1 MiB Reads into one registration with its header and 100 bytes, then
// stalls. Close of the registration still returns (breaking the
// connection once nothing moved for drainGrace), and both Reads complete
// with StatusLocalLength, as every request whose local buffer was closed
// under it.
func TestStalledAnswerDoesNotHoldClose(t *testing.T) {
	const size = 1 << 20
	st := newStalling(t, size, func(nc net.Conn) {
		for range 2 {
			if _, err := readFrame(nc, nil, reqHeader); err != nil {
				return
			}
		}
		nc.Write(appendResponseHeader(nil, uint8(ub.StatusSuccess), 0, size))
		nc.Write(bytes.Repeat([]byte{0xAA}, 100))
		io.Copy(io.Discard, nc) // stalls: reads until the client hangs up
	})
	seg, err := st.c.RegisterSegment(make([]byte, 2*size), ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := st.j.PostSend([]ub.WR{{Op: ub.OpRead, Local: ub.Local{Seg: seg, Offset: i * size, Len: size}, Remote: ub.Remote{Seg: st.r}}}); err != nil {
			t.Fatal(err)
		}
	}
	<-st.pins // the client is reading the data into place
	closeWithin(t, seg)
	st.failed(t, "Read", ub.StatusLocalLength)
	st.failed(t, "Read queued behind it", ub.StatusLocalLength)
}

// TestWaitingPinDoesNotCutTheConnection: a 24 MiB Write goes to a peer
// that reads nothing until the test lets it, so the Write's payload waits
// in the socket; a 4 KiB Write from another segment and another jetty
// waits for its turn on the connection meanwhile, and that segment is
// closed. The Close neither waits for the big Write (the small one had
// not pinned its source yet) nor cuts the connection: once the peer
// reads, the big Write succeeds and the small one completes with
// StatusLocalLength.
func TestWaitingPinDoesNotCutTheConnection(t *testing.T) {
	const size = 24 << 20
	release := make(chan struct{})
	st := newStalling(t, size, func(nc net.Conn) {
		<-release
		for {
			if _, err := readFrame(nc, nil, reqHeader); err != nil {
				return
			}
			if _, err := nc.Write(appendResponse(nil, uint8(ub.StatusSuccess), 0, nil)); err != nil {
				return
			}
		}
	})
	sending := make(chan struct{}, 4)
	st.c.opt.sending = func() { sending <- struct{}{} }
	big, err := st.c.RegisterSegment(make([]byte, size), ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	small, err := st.c.RegisterSegment(make([]byte, 4096), ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := st.c.NewJetty(ub.JettyConfig{SendCQ: st.cq, RecvCQ: st.cq})
	if err != nil {
		t.Fatal(err)
	}
	post := func(j ub.Jetty, seg ub.Segment, n int) {
		go func() {
			if _, err := j.PostSend([]ub.WR{{Op: ub.OpWrite, UserCtx: uint64(n), Local: ub.Local{Seg: seg, Len: n}, Remote: ub.Remote{Seg: st.r}}}); err != nil {
				t.Errorf("PostSend: %v", err)
			}
		}()
	}
	post(st.j, big, size)
	<-sending
	<-st.pins                // the big Write's payload is going out
	post(other, small, 4096) // a jetty of its own: not behind the big one's PostSend
	<-sending                // the small one waits for its turn
	closeWithin(t, small)
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	comp := make([]ub.Completion, 2)
	for got := 0; got < 2; {
		if err := st.cq.Wait(ctx); err != nil {
			t.Fatalf("the Writes did not complete: %v", err)
		}
		n, _ := st.cq.Poll(comp[got:])
		got += n
	}
	status := map[uint64]ub.Status{comp[0].UserCtx: comp[0].Status, comp[1].UserCtx: comp[1].Status}
	if status[size] != ub.StatusSuccess || status[4096] != ub.StatusLocalLength {
		t.Fatalf("the big Write completed %v, the small one %v; want success and %v", status[size], status[4096], ub.StatusLocalLength)
	}
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
	within(t, posted, "PostSend of the stalled Write, its source closed,")
	st.failed(t, "Write", ub.StatusLocalLength) // its source closed under it
}
