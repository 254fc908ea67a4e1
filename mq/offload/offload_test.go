package offload

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/transport"
)

func TestMain(m *testing.M) {
	testenv.RegisterChild("producer", producerChild)
	testenv.Main(m)
}

var seq atomic.Int64

func storeName() string { return fmt.Sprintf("offtest-%d-%d", os.Getpid(), seq.Add(1)) }

func timeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// payload i of n bytes, self-checking with bench.Fill.
func payload(i, n int) []byte {
	b := make([]byte, n)
	bench.Fill(b, uint64(i))
	return b
}

func checkPayload(t *testing.T, i int, b []byte, n int) {
	t.Helper()
	if len(b) != n || bench.Sum(b) != bench.FillSum(n, uint64(i)) {
		t.Fatalf("payload %d: %d bytes, not the ones put (want %d)", i, len(b), n)
	}
}

// tcpEndpoint is an endpoint for fetch servers and resolvers. The
// resolvers' fetches take the tcp path (ResolverConfig.Path's default):
// on one host its packets go over the listener's rendezvous socket (a
// listener on loopback TCP would want a super node identity for mutual
// TLS).
func tcpEndpoint(t testing.TB) *transport.Endpoint {
	t.Helper()
	e, err := transport.NewEndpoint(transport.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// serve starts a fetch server of s's log on a transport listener and
// returns it and its address.
func serve(t testing.TB, e *transport.Endpoint, cfg ServerConfig, s *Store) *Server {
	t.Helper()
	l, err := e.Listen(context.Background(), fmt.Sprintf("ub:///offtest-%d-%d", os.Getpid(), seq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(l, cfg, s.Log())
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv
}

func openStore(t testing.TB, c StoreConfig) *Store {
	t.Helper()
	name := storeName()
	s, err := OpenStore(name, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := Remove(name); err != nil {
			t.Errorf("remove: %v", err)
		}
	})
	return s
}

func newResolver(t testing.TB, c ResolverConfig) *Resolver {
	t.Helper()
	r, err := NewResolver(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// producerChild puts OFF_N payloads of OFF_SIZE bytes into store OFF_LOG,
// serves it, prints each reference (hex) and "ready", and serves until
// its standard input ends.
func producerChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	n, _ := strconv.Atoi(os.Getenv("OFF_N"))
	size, _ := strconv.Atoi(os.Getenv("OFF_SIZE"))
	e, err := transport.NewEndpoint(transport.Config{})
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	l, err := e.Listen(context.Background(), fmt.Sprintf("ub:///offchild-%d", os.Getpid()))
	if err != nil {
		return fail(err)
	}
	s, err := OpenStore(os.Getenv("OFF_LOG"), StoreConfig{SegmentSize: 1 << 20, Fetch: l.Addr().String()})
	if err != nil {
		return fail(err)
	}
	defer s.Close()
	srv := NewServer(l, ServerConfig{}, s.Log())
	go srv.Serve()
	defer srv.Close()
	for i := range n {
		ref, err := s.Put(context.Background(), payload(i, size))
		if err != nil {
			return fail(err)
		}
		b, _ := ref.MarshalBinary()
		fmt.Println(hex.EncodeToString(b))
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// TestProcesses: a producer process puts payloads and serves them; this
// process resolves each in place from the shared log and over the tcp
// path from the producer's fetch server. Once the producer is killed the
// fetches fail (with an error, at once) and the local reads still work:
// the payloads live in shared memory, not in the producer.
func TestProcesses(t *testing.T) {
	const n, size = 40, 60 << 10
	name := storeName()
	t.Cleanup(func() { Remove(name) })
	cmd := testenv.Child(t, "producer", "OFF_LOG="+name, "OFF_N="+strconv.Itoa(n), "OFF_SIZE="+strconv.Itoa(size))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var refs []Ref
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
		b, err := hex.DecodeString(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		ref, err := ParseRef(b)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	if len(refs) != n {
		t.Fatalf("the producer gave %d references: %v", len(refs), sc.Err())
	}
	ctx := timeout(t, time.Minute)
	local := newResolver(t, ResolverConfig{})
	remote := newResolver(t, ResolverConfig{Endpoint: tcpEndpoint(t), Remote: true, Timeout: 5 * time.Second})
	for i, ref := range refs {
		b, release, err := local.View(ctx, ref)
		if err != nil {
			t.Fatalf("local %d: %v", i, err)
		}
		checkPayload(t, i, b, size)
		release()
		b, err = remote.Get(ctx, ref)
		if err != nil {
			t.Fatalf("remote %d: %v", i, err)
		}
		checkPayload(t, i, b, size)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := remote.Get(ctx, refs[0]); err == nil {
		t.Fatal("a fetch from a killed producer's server succeeded")
	} else {
		t.Logf("fetch after the kill: %v", err)
	}
	b, err := local.Get(ctx, refs[n-1])
	if err != nil {
		t.Fatalf("local after the kill: %v", err)
	}
	checkPayload(t, n-1, b, size)
}

// TestGone: payloads retention dropped are ErrPayloadGone, locally and
// from the server, never empty; a checksum or length that does not match
// is ErrChecksum; a log the server does not serve, or that does not exist
// here, is ErrPayloadGone.
func TestGone(t *testing.T) {
	s := openStore(t, StoreConfig{SegmentSize: 8192, Segments: 2})
	e := tcpEndpoint(t)
	srv := serve(t, e, ServerConfig{}, s)
	s.fetch = srv.Addr().String()
	ctx := timeout(t, time.Minute)
	var refs []Ref
	for i := range 10 {
		ref, err := s.Put(ctx, payload(i, 3000))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	local := newResolver(t, ResolverConfig{})
	remote := newResolver(t, ResolverConfig{Endpoint: e, Remote: true})
	for _, r := range []*Resolver{local, remote} {
		if b, err := r.Get(ctx, refs[0]); !errors.Is(err, ErrPayloadGone) || b != nil {
			t.Errorf("a dropped payload (remote %v): %d bytes, %v; want ErrPayloadGone", r.cfg.Remote, len(b), err)
		}
		b, err := r.Get(ctx, refs[9])
		if err != nil {
			t.Fatal(err)
		}
		checkPayload(t, 9, b, 3000)
		bad := refs[9]
		bad.CRC ^= 1
		if _, err := r.Get(ctx, bad); !errors.Is(err, ErrChecksum) {
			t.Errorf("a wrong checksum (remote %v): %v, want ErrChecksum", r.cfg.Remote, err)
		}
		for _, d := range []int{-1, 1} {
			bad = refs[9]
			bad.Length = uint32(int(bad.Length) + d)
			if _, err := r.Get(ctx, bad); !errors.Is(err, ErrChecksum) {
				t.Errorf("a length %+d off (remote %v): %v, want ErrChecksum", d, r.cfg.Remote, err)
			}
		}
		bad = refs[9]
		bad.Offset += 8
		if _, err := r.Get(ctx, bad); err == nil {
			t.Errorf("an offset inside a payload (remote %v) resolved", r.cfg.Remote)
		}
		bad = refs[9]
		bad.Log = "offtest-nosuchlog"
		if _, err := r.Get(ctx, bad); !errors.Is(err, ErrPayloadGone) {
			t.Errorf("a log nobody serves (remote %v): %v, want ErrPayloadGone", r.cfg.Remote, err)
		}
	}
	noFetch := refs[9]
	noFetch.Fetch = ""
	noFetch.Log = "offtest-nosuchlog"
	if _, err := local.Get(ctx, noFetch); !errors.Is(err, ErrPayloadGone) {
		t.Errorf("a log not on this host and no fetch server: %v, want ErrPayloadGone", err)
	}
	only := newResolver(t, ResolverConfig{Logs: []string{"offtest-other"}})
	if _, err := only.Get(ctx, refs[9]); !errors.Is(err, ErrBadRef) {
		t.Errorf("a log the resolver does not take: %v, want ErrBadRef", err)
	}
	big := refs[9]
	big.Length = 1 << 30
	if _, err := remote.Get(ctx, big); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a reference over MaxPayload: %v, want ErrTooLarge", err)
	}
}

// TestStoreLoan fills a payload in place.
func TestStoreLoan(t *testing.T) {
	s := openStore(t, StoreConfig{SegmentSize: 1 << 16, Partitions: 2})
	ctx := timeout(t, 10*time.Second)
	l, err := s.Loan(ctx, 5000)
	if err != nil {
		t.Fatal(err)
	}
	bench.Fill(l.Bytes(), 7)
	ref, err := l.Commit()
	if err != nil {
		t.Fatal(err)
	}
	b, err := newResolver(t, ResolverConfig{}).Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	checkPayload(t, 7, b, 5000)
	for _, n := range []int{0, -1, s.MaxPayload() + 1} {
		if _, err := s.Loan(ctx, n); !errors.Is(err, ErrTooLarge) {
			t.Errorf("a loan of %d: %v", n, err)
		}
	}
	again, err := OpenStore(s.Log().Name(), StoreConfig{})
	if err != nil {
		t.Fatalf("opening an existing store: %v", err)
	}
	again.Close()
}

// hostileServer answers every request with reply (then stalls until the
// client hangs up) on a loopback TCP socket, and returns a Resolver
// pointed at it through a fake dial.
func hostile(t *testing.T, reply []byte) (Ref, error) {
	t.Helper()
	c1, c2 := net.Pipe()
	t.Cleanup(func() { c1.Close(); c2.Close() })
	go func() {
		br := bufio.NewReader(c2)
		if _, err := readRequest(br, make([]byte, MaxRefSize)); err != nil {
			return
		}
		c2.Write(reply)
		io.Copy(io.Discard, c2)
	}()
	r := newResolver(t, ResolverConfig{Endpoint: tcpEndpoint(t), MaxPayload: 1 << 20, Timeout: 300 * time.Millisecond})
	ref := sampleRef()
	ref.Length = 16
	_, _, err := r.exchange(c1, ref)
	return ref, err
}

// TestHostileServer: a fetch server that lies or stalls gives an error,
// at once or within the timeout, and nothing is allocated beyond the
// bounds.
func TestHostileServer(t *testing.T) {
	for name, c := range map[string]struct {
		reply []byte
		want  error
	}{
		"huge":      {responseHeader(statusOK, 1<<31), ErrTooLarge},
		"length":    {append(responseHeader(statusOK, 8), make([]byte, 8)...), ErrChecksum},
		"checksum":  {append(responseHeader(statusOK, 16), make([]byte, 16)...), ErrChecksum},
		"status":    {append([]byte{9}, 0, 0, 0, 0), nil},
		"long text": {responseHeader(statusGone, 1<<20), nil},
		"stall":     {responseHeader(statusOK, 16)[:3], os.ErrDeadlineExceeded},
		"gone":      {append(responseHeader(statusGone, 2), "no"...), ErrPayloadGone},
	} {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			_, err := hostile(t, c.reply)
			if err == nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("%v, want %v", err, c.want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
		})
	}
}

// TestHostileClient: a client that sends garbage loses its connection and
// the server goes on serving; connections beyond MaxConns are closed.
func TestHostileClient(t *testing.T) {
	s := openStore(t, StoreConfig{SegmentSize: 8192})
	ctx := timeout(t, 30*time.Second)
	ref, err := s.Put(ctx, payload(1, 100))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(l, ServerConfig{MaxConns: 2, Timeout: time.Second}, s.Log())
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	defer func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.0\r\n\r\n"), appendRequest(nil, make([]byte, 10)), append([]byte(reqMagic), 0xff, 0xff)} {
		c := dial()
		c.Write(junk)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil || len(b) > 0 && b[0] != statusBad {
			t.Errorf("junk %q: answered %q, %v; want a bad-request answer or none, and the connection closed", junk, b, err)
		}
		c.Close()
	}
	good := func(c net.Conn) error {
		enc, _ := ref.MarshalBinary()
		c.Write(appendRequest(nil, enc))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		st, n, err := readResponseHeader(c, 1<<20)
		if err != nil || st != statusOK || n != 100 {
			return fmt.Errorf("status %d, %d bytes, %v", st, n, err)
		}
		_, err = io.ReadFull(c, make([]byte, n))
		return err
	}
	a, b := dial(), dial()
	if err := good(a); err != nil {
		t.Fatal(err)
	}
	if err := good(b); err != nil {
		t.Fatal(err)
	}
	extra := dial()
	extra.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a third connection with MaxConns 2: %v, want it closed", err)
	}
	// The server gives a slot up before it closes the connection.
	a.Write([]byte("junk!!"))
	io.ReadAll(a)
	if err := good(dial()); err != nil {
		t.Fatalf("no connection served after one was dropped: %v", err)
	}
}

// FuzzResponse: whatever a fetch server sends, an error or the payload
// the reference names, never a panic or a hang.
func FuzzResponse(f *testing.F) {
	want := payload(3, 16)
	f.Add(append(responseHeader(statusOK, 16), want...))
	f.Add(responseHeader(statusOK, 1<<31))
	f.Add(append(responseHeader(statusGone, 4), "gone"...))
	f.Add([]byte{})
	r, err := NewResolver(ResolverConfig{Endpoint: tcpEndpoint(f), MaxPayload: 1 << 16, Timeout: 200 * time.Millisecond})
	if err != nil {
		f.Fatal(err)
	}
	ref := sampleRef()
	ref.Length = 16
	ref.CRC = crcOf(want)
	f.Fuzz(func(t *testing.T, reply []byte) {
		c1, c2 := net.Pipe()
		defer c1.Close()
		go func() {
			defer c2.Close()
			if _, err := readRequest(bufio.NewReader(c2), make([]byte, MaxRefSize)); err != nil {
				return
			}
			c2.Write(reply)
		}()
		b, _, err := r.exchange(c1, ref)
		if err == nil && string(b) != string(want) {
			t.Fatalf("resolved to %x", b)
		}
		if err != nil && b != nil {
			t.Fatal("a payload with an error")
		}
	})
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
