package mq

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"

	"github.com/ubkit-io/ubkit/ub/provider/simprov" // the ub path's provider in tests
)

// remotePath is a way from a reader to a server: a listener for the
// server and a Dialer for the reader, and the transport path the
// connection must take (empty for plain TCP).
type remotePath struct {
	name   string
	listen func(t testing.TB) (net.Listener, string)
	dialer func(t testing.TB, got *transport.Path) *Dialer
}

var tcpPath = remotePath{
	name: "tcp",
	listen: func(t testing.TB) (net.Listener, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln, ln.Addr().String()
	},
	dialer: func(t testing.TB, _ *transport.Path) *Dialer {
		return &Dialer{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}}
	},
}

// ubPath: the server plays node n0 and the reader n1 of the simulated
// dev4 super node (the sim provider), so the connection takes
// transport's ub path.
func ubPath() remotePath {
	var eps map[string]*transport.Endpoint
	var once sync.Once
	setup := func(t testing.TB) map[string]*transport.Endpoint {
		once.Do(func() {
			topo, err := topology.Example("dev4")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			fabric := privateFabric(t, topo)
			eps = map[string]*transport.Endpoint{}
			for _, n := range []string{"n0", "n1"} {
				ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir,
					ProviderOptions: map[string]string{simprov.OptFabric: fabric}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ep.Close() })
				eps[n] = ep
			}
		})
		return eps
	}
	return remotePath{
		name: "ub",
		listen: func(t testing.TB) (net.Listener, string) {
			addr := fmt.Sprintf("ub://n0/mq-%d-%d", os.Getpid(), logSeq.Add(1))
			ln, err := setup(t)["n0"].Listen(context.Background(), addr)
			if err != nil {
				t.Fatal(err)
			}
			return ln, addr
		},
		dialer: func(t testing.TB, got *transport.Path) *Dialer {
			ep := setup(t)["n1"]
			return &Dialer{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
				c, err := ep.Dial(ctx, addr)
				if err == nil {
					*got = c.Path()
				}
				return c, err
			}}
		},
	}
}

// privateFabric names a simulation of topo of the test's own (link
// state and faults that no other test on the host shares) and removes
// it when the test ends.
func privateFabric(t testing.TB, topo *topology.Topology) string {
	t.Helper()
	name := fmt.Sprintf("mqremote-%d-%d", os.Getpid(), logSeq.Add(1))
	f, err := simprov.OpenFabricNamed(topo, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Remove()
		f.Close()
	})
	return name
}

// serve serves l on a listener of path and returns the server and the
// address.
func serve(t testing.TB, l *Log, path remotePath, cfg ServeConfig) (*Server, string) {
	t.Helper()
	ln, addr := path.listen(t)
	s := NewServer(l, cfg)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		// ErrClosed: the server closed before Serve began.
		if err := <-done; err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, addr
}

func dialReader(t testing.TB, d *Dialer, addr, name string, p int, from uint64) *RemoteReader {
	t.Helper()
	r, err := d.DialReader(timeout(t, 10*time.Second), addr, name, p, from)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// sizeOf is the payload size of record i in the remote tests: mostly
// small, some above a records frame's 64 KiB (sent alone), some zero.
func sizeOf(i int) int {
	switch {
	case i%97 == 50:
		return 100<<10 + i
	case i%31 == 0:
		return 0
	}
	return 16 + (i*37)%3000
}

func TestRemoteReader(t *testing.T) {
	for _, path := range []remotePath{tcpPath, ubPath()} {
		t.Run(path.name, func(t *testing.T) {
			ctx := timeout(t, 60*time.Second)
			l := newLog(t, Config{Partitions: 2, SegmentSize: 256 << 10, Segments: 64})
			_, addr := serve(t, l, path, ServeConfig{})
			const n = 2000
			var offsets []uint64
			// Half the records before the reader dials, half while it reads.
			send := func(from, to int) {
				for i := from; i < to; i++ {
					b := make([]byte, sizeOf(i))
					if len(b) >= 16 {
						message(b, 1, uint64(i))
					}
					off, err := l.Send(ctx, 1, b)
					if err != nil {
						t.Error(err)
						return
					}
					offsets = append(offsets, off)
				}
			}
			send(0, n/2)
			var got transport.Path
			r := dialReader(t, path.dialer(t, &got), addr, l.Name(), 1, 0)
			if path.name == "ub" && got != transport.PathUB {
				t.Fatalf("the reader on n1 took the %q path to n0, want ub", got)
			}
			done := make(chan struct{})
			go func() { defer close(done); send(n/2, n) }()
			var read []uint64
			for i := range n {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if len(rec.Payload) != sizeOf(i) {
					t.Fatalf("record %d: %d bytes, want %d", i, len(rec.Payload), sizeOf(i))
				}
				if len(rec.Payload) >= 16 {
					if _, seq := parse(t, rec.Payload); seq != uint64(i) {
						t.Fatalf("record %d: seq %d", i, seq)
					}
				}
				read = append(read, rec.Offset)
			}
			<-done
			for i := range n {
				if read[i] != offsets[i] {
					t.Fatalf("record %d at %d, the log put it at %d", i, read[i], offsets[i])
				}
			}
			// A second reader from the middle gets the same records.
			mid := offsets[n/2]
			r2 := dialReader(t, path.dialer(t, &got), addr, l.Name(), 1, mid)
			rec, err := r2.Next(ctx)
			if err != nil || rec.Offset != mid || len(rec.Payload) != sizeOf(n/2) {
				t.Fatalf("from %d: %d (%d bytes), %v", mid, rec.Offset, len(rec.Payload), err)
			}
			// And partition 0 is empty: a read waits until its context ends.
			r0 := dialReader(t, path.dialer(t, &got), addr, l.Name(), 0, Oldest)
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			if _, err := r0.Next(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("an empty partition: %v", err)
			}
		})
	}
}

// TestRemoteReaderRefusals: what the server refuses, the reader is told,
// with the sentinel to match.
func TestRemoteReaderRefusals(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullOverwrite})
	s, addr := serve(t, l, tcpPath, ServeConfig{})
	d := tcpPath.dialer(t, nil)
	ctx := timeout(t, 10*time.Second)
	for _, c := range []struct {
		name string
		log  string
		p    int
		from uint64
		want error
	}{
		{"another log", "nope", 0, 0, os.ErrNotExist},
		{"no such partition", l.Name(), 3, 0, errNoPartition},
		{"an offset not a record's", l.Name(), 0, 12, ErrProtocol},
	} {
		if _, err := d.DialReader(ctx, addr, c.log, c.p, c.from); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	// Retention drops the first segment: offset 0 is gone.
	for range 40 {
		if _, err := l.Send(ctx, 0, make([]byte, 500)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.DialReader(ctx, addr, l.Name(), 0, 0); !errors.Is(err, ErrOffsetGone) {
		t.Errorf("a dropped offset: %v", err)
	}
	if st := s.Stats(); st.Refused != 4 || st.Served != 0 {
		t.Errorf("stats %+v, want 4 refused and none served", st)
	}
	// One connection at most: the second is told the server is busy.
	one, oneAddr := serve(t, l, tcpPath, ServeConfig{MaxConns: 1})
	r := dialReader(t, d, oneAddr, l.Name(), 0, Newest)
	if _, err := d.DialReader(ctx, oneAddr, l.Name(), 0, Newest); !errors.Is(err, ErrBusy) {
		t.Errorf("over MaxConns: %v", err)
	}
	r.Close()
	if st := one.Stats(); st.Refused != 1 || st.Served != 1 {
		t.Errorf("stats %+v, want 1 refused and 1 served", st)
	}
}

// TestRemoteReaderOverwritten: under FullOverwrite, retention drops the
// segments a slow remote reader has not reached; it gets the records the
// server had sent and then ErrOffsetGone, as a local reader would.
func TestRemoteReaderOverwritten(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullOverwrite})
	_, addr := serve(t, l, tcpPath, ServeConfig{})
	ctx := timeout(t, 20*time.Second)
	d := tcpPath.dialer(t, nil)
	d.Window = MinWindow
	r := dialReader(t, d, addr, l.Name(), 0, 0)
	payload := make([]byte, 3000) // one record a segment
	send := func(from, to int) {
		for i := from; i < to; i++ {
			message(payload, 6, uint64(i))
			if _, err := l.Send(ctx, 0, payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(0, 2)
	for i := range 2 {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if _, seq := parse(t, rec.Payload); seq != uint64(i) {
			t.Fatalf("record %d: seq %d", i, seq)
		}
	}
	// 60 more while the reader does not read: its 64 KiB window holds
	// about 21 of them, so the server stops in a segment retention drops
	// long before the reader returns credit.
	send(2, 62)
	var err error
	n := 2
	for ; err == nil; n++ {
		_, err = r.Next(ctx)
	}
	if !errors.Is(err, ErrOffsetGone) {
		t.Fatalf("a reader overtaken by retention: %v after %d records, want ErrOffsetGone", err, n)
	}
	t.Logf("ErrOffsetGone after %d records: %v", n-1, err)
}

// TestRemoteReaderTooLarge: a record larger than the reader's window is
// an error naming ErrTooLarge, not a stall.
func TestRemoteReaderTooLarge(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 256 << 10})
	_, addr := serve(t, l, tcpPath, ServeConfig{})
	ctx := timeout(t, 10*time.Second)
	if _, err := l.Send(ctx, 0, make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	d := tcpPath.dialer(t, nil)
	d.Window = MinWindow
	r := dialReader(t, d, addr, l.Name(), 0, 0)
	if _, err := r.Next(ctx); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a 100 KiB record in a 64 KiB window: %v", err)
	}
}

// TestRemoteReaderStopsReading: a reader that stops reading holds the
// server to its window: the server sends no more than that, whatever the
// log holds, and goes on once the reader reads again.
func TestRemoteReaderStopsReading(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 1 << 20, Segments: 16})
	s, addr := serve(t, l, tcpPath, ServeConfig{})
	ctx := timeout(t, 30*time.Second)
	const n, size = 8000, 1000 // 8 MB, 128 windows
	for i := range n {
		b := make([]byte, size)
		message(b, 2, uint64(i))
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	d := tcpPath.dialer(t, nil)
	d.Window = MinWindow
	r := dialReader(t, d, addr, l.Name(), 0, 0)
	// Wait until the window is full (the server can send no more)...
	var bo shm.Backoff
	for r.outstanding() < int64(r.Window())/2 {
		if ctx.Err() != nil {
			t.Fatalf("the window never filled: %d bytes in flight", r.outstanding())
		}
		if !bo.Pause() {
			time.Sleep(time.Millisecond) // polling a condition, not a synchronisation
		}
	}
	// ...and the server has sent no more than the window.
	if st := s.Stats(); st.Bytes > uint64(r.Window()) {
		t.Fatalf("the server sent %d bytes to a reader with a %d-byte window", st.Bytes, r.Window())
	}
	if r.outstanding() > int64(r.Window()) {
		t.Fatalf("%d bytes in flight in a %d-byte window", r.outstanding(), r.Window())
	}
	for i := range n {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if _, seq := parse(t, rec.Payload); seq != uint64(i) {
			t.Fatalf("record %d: seq %d", i, seq)
		}
	}
}

// TestRemoteServerDies: the server's process is killed mid-stream, over
// TCP and over the ub path (the server plays n0, this process n1); the
// reader gets the records that arrived and then ErrPeerClosed, well
// before its context ends.
func TestRemoteServerDies(t *testing.T) {
	for _, path := range []string{"tcp", "ub"} {
		t.Run(path, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 64 << 10})
			ctx := timeout(t, 60*time.Second)
			const n = 100
			for i := range n {
				b := make([]byte, 200)
				message(b, 3, uint64(i))
				if _, err := l.Send(ctx, 0, b); err != nil {
					t.Fatal(err)
				}
			}
			dir := t.TempDir()
			topo, err := topology.Example("dev4")
			if err != nil {
				t.Fatal(err)
			}
			fabric := privateFabric(t, topo)
			child := testenv.Child(t, "mq-server", "MQ_LOG="+l.Name(), "MQ_PATH="+path, "MQ_RUNDIR="+dir, "MQ_FABRIC="+fabric,
				fmt.Sprintf("MQ_SVC=mq-%d-%d", os.Getpid(), logSeq.Add(1)))
			out, err := child.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			child.Stderr = os.Stderr
			if err := child.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(out).ReadString('\n')
			if err != nil {
				t.Fatalf("the server child said nothing: %v", err)
			}
			addr := strings.TrimSpace(line)
			d := tcpPath.dialer(t, nil)
			if path == "ub" {
				ep, err := transport.NewEndpoint(transport.Config{Node: "n1", Topology: topo, Provider: "sim", RuntimeDir: dir,
					ProviderOptions: map[string]string{simprov.OptFabric: fabric}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ep.Close() })
				d = &Dialer{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
					c, err := ep.Dial(ctx, addr)
					if err == nil && c.Path() != transport.PathUB {
						c.Close()
						return nil, fmt.Errorf("took the %s path", c.Path())
					}
					return c, err
				}}
			}
			r := dialReader(t, d, addr, l.Name(), 0, 0)
			for i := range n {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if _, seq := parse(t, rec.Payload); seq != uint64(i) {
					t.Fatalf("record %d: seq %d", i, seq)
				}
			}
			child.Process.Kill()
			child.Wait()
			killed := time.Now()
			_, err = r.Next(ctx)
			if !errors.Is(err, ErrPeerClosed) {
				t.Fatalf("after the server died: %v, want ErrPeerClosed", err)
			}
			t.Logf("the reader knew after %v: %v", time.Since(killed), err)
		})
	}
}

// serverChild serves log MQ_LOG until it is killed: on a loopback TCP
// port (MQ_PATH=tcp) or as service MQ_SVC of node n0 of the simulated
// dev4 (MQ_PATH=ub, registry in MQ_RUNDIR), and prints the address.
func serverChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "server:", err); return 1 }
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		return fail(err)
	}
	var ln net.Listener
	var addr string
	switch os.Getenv("MQ_PATH") {
	case "ub":
		topo, err := topology.Example("dev4")
		if err != nil {
			return fail(err)
		}
		ep, err := transport.NewEndpoint(transport.Config{Node: "n0", Topology: topo, Provider: "sim", RuntimeDir: os.Getenv("MQ_RUNDIR"),
			ProviderOptions: map[string]string{simprov.OptFabric: os.Getenv("MQ_FABRIC")}})
		if err != nil {
			return fail(err)
		}
		addr = "ub://n0/" + os.Getenv("MQ_SVC")
		ln, err = ep.Listen(context.Background(), addr)
		if err != nil {
			return fail(err)
		}
	default:
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		addr = ln.Addr().String()
	}
	fmt.Println(addr)
	if err := Serve(l, ln, ServeConfig{}); err != nil {
		return fail(err)
	}
	return 0
}

// TestRemoteHostileReader: a dialer that breaks the protocol gets an
// error frame or the connection closed; the server goes on serving.
func TestRemoteHostileReader(t *testing.T) {
	l := newLog(t, Config{})
	s, addr := serve(t, l, tcpPath, ServeConfig{HandshakeTimeout: 200 * time.Millisecond})
	ctx := timeout(t, 20*time.Second)
	raw := func(t *testing.T, send []byte) []byte {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(send)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("the server did not close the connection: %v", err)
		}
		return got
	}
	huge := binary.LittleEndian.AppendUint32(nil, 1<<31)
	for _, c := range []struct {
		name string
		send []byte
	}{
		{"silent", nil},
		{"a huge frame", huge},
		{"garbage", []byte("GET / HTTP/1.1\r\n\r\n")},
		{"credit first", appendCredit(nil, 100)},
		{"a bad version", func() []byte {
			b := appendHello(nil, hello{name: l.Name(), window: MinWindow})
			b[9] = 9
			return b
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := raw(t, c.send)
			if len(got) > 0 {
				typ, body, err := readFrame(bufio.NewReader(bytes.NewReader(got)), maxControl, nil)
				if err != nil || typ != frameError || !errors.Is(decodeError(body), ErrProtocol) {
					t.Fatalf("answer %q: %v", got, err)
				}
			}
		})
	}
	// Credit beyond the window: the server hangs up.
	t.Run("too much credit", func(t *testing.T) {
		b := appendHello(nil, hello{name: l.Name(), window: MinWindow, from: Newest})
		b = appendCredit(b, MinWindow)
		got := raw(t, b)
		br := bufio.NewReader(bytes.NewReader(got))
		if typ, _, err := readFrame(br, maxControl, nil); err != nil || typ != frameWelcome {
			t.Fatalf("no welcome: %v", err)
		}
		if _, _, err := readFrame(br, maxControl, nil); !errors.Is(err, io.EOF) {
			t.Fatalf("after the welcome: %v, want the end", err)
		}
	})
	// The server still serves.
	r := dialReader(t, tcpPath.dialer(t, nil), addr, l.Name(), 0, Newest)
	if _, err := l.Send(ctx, 0, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	if rec, err := r.Next(ctx); err != nil || string(rec.Payload) != "still here" {
		t.Fatalf("%q, %v", rec.Payload, err)
	}
	if st := s.Stats(); st.Active != 1 {
		t.Fatalf("%d connections active, want 1", st.Active)
	}
}

// TestRemoteHostileServer: a server that breaks the protocol (too much
// data for the window, records out of order, garbage) gives the reader
// ErrProtocol, never a panic or a hang.
func TestRemoteHostileServer(t *testing.T) {
	welcomeFrame := appendWelcome(nil, welcome{partitions: 1, window: MinWindow})
	records := func(count uint32, recs ...[]byte) []byte {
		b := frameStart(nil, frameRecords)
		b = binary.LittleEndian.AppendUint32(b, count)
		for _, r := range recs {
			b = append(b, r...)
		}
		return frameEnd(b, 0)
	}
	rec := func(off uint64, n int) []byte {
		b := binary.LittleEndian.AppendUint64(nil, off)
		b = binary.LittleEndian.AppendUint32(b, uint32(n))
		return append(b, make([]byte, n)...)
	}
	third := func(i uint64) []byte { return records(1, rec(i*(32<<10), 30<<10)) }
	for _, c := range []struct {
		name  string
		send  []byte
		wantN int // records read before the error
	}{
		{"beyond the window", append(append(append(append([]byte{}, welcomeFrame...), third(0)...), third(1)...), third(2)...), 2},
		{"a frame longer than the window", append(append([]byte{}, welcomeFrame...), append(binary.LittleEndian.AppendUint32(nil, 1<<30), frameRecords)...), 0},
		{"offsets going back", append(append([]byte{}, welcomeFrame...), records(2, rec(64, 8), rec(8, 8))...), 0},
		{"a length past the frame", append(append([]byte{}, welcomeFrame...), records(1, rec(0, 8)[:14])...), 0},
		{"an unknown frame", append(append([]byte{}, welcomeFrame...), frameEnd(frameStart(nil, 99), 0)...), 0},
		{"a window bigger than asked", appendWelcome(nil, welcome{partitions: 1, window: MaxWindow}), -1},
		{"no welcome", appendCredit(nil, 5), -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				br := bufio.NewReader(conn)
				if _, _, err := readFrame(br, maxControl, nil); err != nil {
					return
				}
				conn.Write(c.send)
				io.Copy(io.Discard, conn) // until the reader hangs up
			}()
			d := tcpPath.dialer(t, nil)
			d.Window = MinWindow
			ctx := timeout(t, 10*time.Second)
			r, err := d.DialReader(ctx, ln.Addr().String(), "x", 0, 0)
			if c.wantN < 0 {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("dial: %v, want ErrProtocol", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			// The reader has returned no credit: the receiver sees the
			// whole stream, or the error, before the first Next.
			select {
			case <-r.done:
			case <-ctx.Done():
				t.Fatal("the reader still waits for the server")
			}
			for i := range c.wantN {
				if _, err := r.Next(ctx); err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
			}
			if _, err := r.Next(ctx); !errors.Is(err, ErrProtocol) {
				t.Fatalf("%v, want ErrProtocol", err)
			}
		})
	}
}

// FuzzWireDecode feeds the remote reader's decoders arbitrary bytes: they
// return an error or a value that encodes back to the same bytes, and
// never panic.
func FuzzWireDecode(f *testing.F) {
	f.Add(appendHello(nil, hello{name: "results", partition: 3, from: 64, window: MinWindow}))
	f.Add(appendWelcome(nil, welcome{partitions: 4, start: 128, window: MinWindow}))
	f.Add(appendCredit(nil, 4096))
	f.Add(appendError(nil, fmt.Errorf("x: %w", ErrOffsetGone)))
	r := frameStart(nil, frameRecords)
	r = binary.LittleEndian.AppendUint32(r, 2)
	r = binary.LittleEndian.AppendUint64(r, 0)
	r = binary.LittleEndian.AppendUint32(r, 3)
	r = append(r, "abc"...)
	r = binary.LittleEndian.AppendUint64(r, 24)
	r = binary.LittleEndian.AppendUint32(r, 0)
	f.Add(frameEnd(r, 0))
	f.Add([]byte{1, 0, 0, 0, 4})
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, body, err := readFrame(bufio.NewReader(bytes.NewReader(b)), maxControl, nil)
		if err != nil {
			return
		}
		switch typ {
		case frameHello:
			if h, err := decodeHello(body); err == nil && !bytes.Equal(appendHello(nil, h)[frameHeader:], append([]byte{}, body...)) {
				t.Fatalf("hello %+v does not encode back", h)
			}
		case frameWelcome:
			if w, err := decodeWelcome(body); err == nil && !bytes.Equal(appendWelcome(nil, w)[frameHeader:], body) {
				t.Fatalf("welcome %+v does not encode back", w)
			}
		case frameCredit:
			if n, err := decodeCredit(body); err == nil && !bytes.Equal(appendCredit(nil, n)[frameHeader:], body) {
				t.Fatalf("credit %d does not encode back", n)
			}
		case frameError:
			decodeError(body)
		case frameRecords:
			total := 0
			prev := uint64(0)
			end, err := decodeRecords(body, 0, func(rec Record) {
				if rec.Offset < prev || rec.Offset%8 != 0 {
					t.Fatalf("record at %d after %d", rec.Offset, prev)
				}
				prev = rec.Offset + align8(headerSize+uint64(len(rec.Payload)))
				total += recordHeader + len(rec.Payload)
			})
			if err == nil && (total+4 != len(body) || end != prev) {
				t.Fatalf("records of %d bytes in a %d-byte body, end %d", total, len(body), end)
			}
		}
	})
}

// BenchmarkRemoteRead100B: a producer goroutine sends 100-byte records
// and a remote reader in this process reads them, checksumming every
// byte (the work of BenchmarkSendRecv100B), over loopback TCP and over
// transport's ub path between nodes n0 and n1 of the simulated dev4
// super node (links of 20 µs and 5 GB/s).
func BenchmarkRemoteRead100B(b *testing.B) {
	for _, name := range []string{"tcp", "ub"} {
		b.Run(name, func(b *testing.B) {
			path := tcpPath
			if name == "ub" {
				path = ubPath() // endpoints of this run's own
			}
			l := newLog(b, Config{})
			_, addr := serve(b, l, path, ServeConfig{})
			var got transport.Path
			r := dialReader(b, path.dialer(b, &got), addr, l.Name(), 0, Newest)
			ctx := context.Background()
			n := b.N
			errs := make(chan error, 1)
			go func() {
				for i := range n {
					res, err := l.Loan(ctx, 0, 100)
					if err != nil {
						errs <- err
						return
					}
					message(res.Bytes(), 0, uint64(i))
					if err := res.Commit(); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
			b.SetBytes(100)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range n {
				rec, err := r.Next(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if _, seq := parse(b, rec.Payload); seq != uint64(i) {
					b.Fatalf("record %d: seq %d", i, seq)
				}
			}
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		})
	}
}

func init() { testenv.RegisterChild("mq-server", serverChild) }
