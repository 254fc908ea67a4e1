package mux

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// pair returns two sessions joined by an in-memory pipe.
func pair(t testing.TB, cfg *Config) (*Session, *Session) {
	t.Helper()
	a, b := net.Pipe()
	c, s := Client(a, cfg), Server(b, cfg)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func TestStreamsAreConns(t *testing.T) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c, s := pair(t, nil)
		st1, err := c.Open()
		if err != nil {
			return nil, nil, nil, err
		}
		st2, err := s.Accept(context.Background())
		if err != nil {
			return nil, nil, nil, err
		}
		return st1, st2, func() { c.Close(); s.Close() }, nil
	})
}

// TestSlowReaderHoldsOnlyItsStream: a stream whose reader does not read
// stops its writer at the window, while another stream keeps flowing.
func TestSlowReaderHoldsOnlyItsStream(t *testing.T) {
	c, s := pair(t, nil)
	slow, _ := c.Open()
	fast, _ := c.Open()
	sSlow, _ := s.Accept(context.Background())
	sFast, _ := s.Accept(context.Background())
	_ = sSlow
	wrote := make(chan int, 1)
	go func() {
		slow.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, _ := slow.Write(make([]byte, 4*initialWindow))
		wrote <- n
	}()
	msg := bytes.Repeat([]byte("x"), 1<<20)
	go fast.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(sFast, got); err != nil {
		t.Fatalf("the fast stream stalled behind the slow one: %v", err)
	}
	if n := <-wrote; n != initialWindow {
		t.Errorf("slow stream wrote %d bytes with nobody reading, want the window %d", n, initialWindow)
	}
}

func TestManyStreams(t *testing.T) {
	c, s := pair(t, &Config{AcceptBacklog: 10000, MaxStreams: 10000})
	const n = 10000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range n {
			st, err := s.Accept(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			go func() {
				io.Copy(st, st)
				st.Close()
			}()
		}
	}()
	streams := make([]*Stream, n)
	for i := range streams {
		st, err := c.Open()
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	for i, st := range streams {
		msg := []byte{byte(i), byte(i >> 8)}
		if _, err := st.Write(msg); err != nil {
			t.Fatal(err)
		}
		st.CloseWrite()
	}
	for i, st := range streams {
		got, err := io.ReadAll(st)
		if err != nil || len(got) != 2 || got[0] != byte(i) || got[1] != byte(i>>8) {
			t.Fatalf("stream %d: %v %v", i, got, err)
		}
		st.Close()
	}
	wg.Wait()
}

// TestDeadPeer: a peer that stops answering is noticed by keepalives and
// every stream fails.
func TestDeadPeer(t *testing.T) {
	a, b := net.Pipe()
	c := Client(a, &Config{KeepaliveInterval: 20 * time.Millisecond, KeepaliveTimeout: 50 * time.Millisecond})
	defer c.Close()
	// The other end reads but never answers.
	go io.Copy(io.Discard, b)
	defer b.Close()
	st, err := c.Open()
	if err != nil {
		t.Fatal(err)
	}
	st.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	_, err = st.Read(make([]byte, 1))
	if !errors.Is(err, ErrKeepalive) {
		t.Fatalf("read on a session whose peer went quiet: %v", err)
	}
}

// FuzzFrames feeds arbitrary bytes to a session as if from its peer: it
// must end the session with an error or carry on, never panic or hang.
func FuzzFrames(f *testing.F) {
	var h [headerSize]byte
	header{typ: typeData, flags: flagSYN, stream: 2, length: 3}.encode(h[:])
	f.Add(append(h[:], 'a', 'b', 'c'))
	header{typ: typePing, flags: flagSYN, length: 7}.encode(h[:])
	f.Add(h[:])
	f.Add([]byte{9, 9, 9})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		s := Server(a, &Config{KeepaliveInterval: -1})
		go func() {
			b.Write(data)
			b.Close()
		}()
		go io.Copy(io.Discard, b)
		select {
		case <-s.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("session did not end after its peer closed")
		}
		s.Close()
	})
}

// TestCreditViolation: a peer that sends more than the window it was given
// ends the session with a protocol error, before the bytes are buffered.
func TestCreditViolation(t *testing.T) {
	a, b := net.Pipe()
	s := Server(a, &Config{KeepaliveInterval: -1})
	defer s.Close()
	go io.Copy(io.Discard, b)
	var h [headerSize]byte
	header{typ: typeWindow, flags: flagSYN, stream: 1}.encode(h[:])
	b.Write(h[:])
	header{typ: typeData, stream: 1, length: initialWindow + 1}.encode(h[:])
	b.Write(h[:])
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the session took more than its window")
	}
	if !errors.Is(s.Err(), ErrProtocol) {
		t.Fatalf("session ended with %v, want a protocol error", s.Err())
	}
	b.Close()
}

// TestWriterNotStuckWhenPeerCloses: a writer waiting for credit is not left
// waiting when the reader closes its stream: the data is dropped and the
// credit returned.
func TestWriterNotStuckWhenPeerCloses(t *testing.T) {
	c, s := pair(t, nil)
	w, _ := c.Open()
	r, _ := s.Accept(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := w.Write(make([]byte, 4*initialWindow))
		done <- err
	}()
	testenv.WaitParked(t, 1, "", "mux.(*Stream).Write(") // waiting for credit
	r.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("write: %v", err)
		}
	case <-time.After(5 * time.Second): // a hang guard
		t.Fatal("the writer is stuck after the reader closed its stream")
	}
	w.Close()
}

// TestUnopenedStreams: frames for streams never opened, and a SYN reusing
// an id, end the session, as PROTOCOL.md says.
func TestUnopenedStreams(t *testing.T) {
	frames := map[string][]header{
		"data for a stream never opened": {{typ: typeData, stream: 7}},
		"a stream opened twice":          {{typ: typeWindow, flags: flagSYN, stream: 1}, {typ: typeWindow, flags: flagSYN, stream: 1}},
		"an id below the last one":       {{typ: typeWindow, flags: flagSYN, stream: 5}, {typ: typeWindow, flags: flagSYN, stream: 3}},
		"our parity":                     {{typ: typeWindow, flags: flagSYN, stream: 2}},
	}
	for name, hs := range frames {
		t.Run(name, func(t *testing.T) {
			a, b := net.Pipe()
			s := Server(a, &Config{KeepaliveInterval: -1})
			defer s.Close()
			go io.Copy(io.Discard, b)
			go func() {
				for _, h := range hs {
					var buf [headerSize]byte
					h.encode(buf[:])
					if _, err := b.Write(buf[:]); err != nil {
						return
					}
				}
			}()
			select {
			case <-s.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("session went on")
			}
			if !errors.Is(s.Err(), ErrProtocol) {
				t.Fatalf("ended with %v", s.Err())
			}
			b.Close()
		})
	}
}

// TestSessionWindowBoundsUnreadStreams: sixteen streams whose reader reads
// nothing hold at most the session's window together (1 MiB here), not
// sixteen stream windows; once read, every byte written arrives.
func TestSessionWindowBoundsUnreadStreams(t *testing.T) {
	const window = 1 << 20
	c, s := pair(t, &Config{SessionWindow: window})
	type stream struct {
		w, r  *Stream
		wrote int
	}
	streams := make([]*stream, 16)
	for i := range streams {
		w, err := c.Open()
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.Accept(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = &stream{w: w, r: r}
	}
	var wg sync.WaitGroup
	for i, st := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.w.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
			st.wrote, _ = st.w.Write(bytes.Repeat([]byte{byte(i)}, initialWindow))
		}()
	}
	wg.Wait()
	var wrote, held int
	for _, st := range streams {
		wrote += st.wrote
		st.r.mu.Lock()
		held += st.r.buf.Len()
		st.r.mu.Unlock()
	}
	if wrote > window || held > window {
		t.Errorf("16 unread streams took %d KiB (%d KiB held), want at most the session's window, %d KiB", wrote>>10, held>>10, window>>10)
	}
	for i, st := range streams {
		st.w.CloseWrite()
		got, err := io.ReadAll(st.r)
		if err != nil || len(got) != st.wrote || (len(got) > 0 && got[len(got)-1] != byte(i)) {
			t.Fatalf("stream %d: read %d of the %d bytes written: %v", i, len(got), st.wrote, err)
		}
	}
	t.Logf("16 unread streams took %d KiB", wrote>>10)
}

// rawPeer is the other end of a session, written by hand.
func rawPeer(t *testing.T, cfg *Config) (*Session, net.Conn) {
	t.Helper()
	a, b := net.Pipe()
	s := Server(a, cfg)
	t.Cleanup(func() { s.Close(); b.Close() })
	return s, b
}

func writeFrame(w io.Writer, h header, body []byte) error {
	var b [headerSize]byte
	h.encode(b[:])
	_, err := w.Write(append(b[:], body...))
	return err
}

// TestSessionCreditViolation: a peer that sends more than the session's
// window, over streams each within its own, ends the session with a
// protocol error before the bytes are buffered.
func TestSessionCreditViolation(t *testing.T) {
	s, b := rawPeer(t, &Config{KeepaliveInterval: -1, SessionWindow: initialWindow})
	go io.Copy(io.Discard, b)
	body := make([]byte, initialWindow*3/4)
	go func() {
		for _, id := range []uint32{1, 3} {
			if writeFrame(b, header{typ: typeWindow, flags: flagSYN, stream: id}, nil) != nil ||
				writeFrame(b, header{typ: typeData, stream: id, length: uint32(len(body))}, body) != nil {
				return
			}
		}
	}()
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second): // a hang guard
		t.Fatal("the session took more than its window")
	}
	if !errors.Is(s.Err(), ErrProtocol) {
		t.Fatalf("session ended with %v, want a protocol error", s.Err())
	}
}

// TestClosedStreamDataNeedsNoGoroutines: data a peer keeps sending to a
// stream closed on this side is dropped and its credit returned, without
// a goroutine per frame, even when the peer reads nothing of what this
// side writes (it used to start one each, blocked until the session
// ended).
func TestClosedStreamDataNeedsNoGoroutines(t *testing.T) {
	s, b := rawPeer(t, &Config{KeepaliveInterval: -1})
	if err := writeFrame(b, header{typ: typeWindow, flags: flagSYN, stream: 1}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := s.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Read what the session writes until the stream's FIN, then stop.
	fin := make(chan struct{})
	go func() {
		defer close(fin)
		var hb [headerSize]byte
		for {
			if _, err := io.ReadFull(b, hb[:]); err != nil {
				return
			}
			h, _ := decodeHeader(hb[:])
			if h.typ == typeData && h.flags&flagFIN != 0 {
				return
			}
		}
	}()
	st.Close()
	<-fin
	before := runtime.NumGoroutine()
	for range 2000 {
		if err := writeFrame(b, header{typ: typeData, stream: 1, length: 1}, []byte{7}); err != nil {
			t.Fatal(err)
		}
	}
	if n := runtime.NumGoroutine() - before; n > 5 {
		t.Errorf("2000 frames for a closed stream left %d more goroutines", n)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("the session ended: %v", err)
	}
}

// TestOldVersionRefused: a peer speaking the protocol before the session
// window (version 0) is refused at its first frame with an error that says
// so, not taken for a peer that sent a frame on stream 0.
func TestOldVersionRefused(t *testing.T) {
	var b [headerSize]byte
	header{typ: typeWindow, stream: 1}.encode(b[:])
	if _, err := decodeHeader(b[:]); err != nil {
		t.Fatalf("this version's header: %v", err)
	}
	b[0] = 0
	_, err := decodeHeader(b[:])
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "version 0, this side speaks 1") {
		t.Fatalf("a version 0 header: %v", err)
	}
}

// TestMaxStreamsBoundsPeerStreams: a peer that opens streams and never
// ends them, while this side accepts and closes each, holds at most
// MaxStreams of them in the session; beyond, its streams are reset. Before,
// every such stream stayed in the session until the peer ended it.
func TestMaxStreamsBoundsPeerStreams(t *testing.T) {
	const max = 8
	c, s := pair(t, &Config{MaxStreams: max})
	go func() {
		for {
			st, err := s.Accept(context.Background())
			if err != nil {
				return
			}
			st.Close() // this side is done; the peer never ends its side
		}
	}()
	var last *Stream
	for range 3 * max {
		st, err := c.Open()
		if err != nil {
			t.Fatal(err)
		}
		last = st
	}
	// The last stream, beyond the bound, is reset.
	last.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := last.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a stream beyond MaxStreams: read %v, want a reset", err)
	}
	s.mu.Lock()
	n, open := len(s.streams), s.peerOpen
	s.mu.Unlock()
	if n > max || open > max {
		t.Errorf("the session holds %d streams (%d of the peer's), want at most %d", n, open, max)
	}
}

// TestAcceptHonoursContext: an Accept with no stream coming ends with its
// context, and the session goes on.
func TestAcceptHonoursContext(t *testing.T) {
	a, b := net.Pipe()
	client, server := Client(a, nil), Server(b, nil)
	defer client.Close()
	defer server.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := server.Accept(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Accept with its context cancelled: %v", err)
	}
	st, err := client.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second) // a hang guard
	defer cancel()
	if _, err := server.Accept(ctx); err != nil {
		t.Fatalf("Accept after a cancelled one: %v", err)
	}
	if _, err := client.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}
