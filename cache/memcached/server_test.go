package memcached

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

var seq atomic.Int64

// serve starts a server on a fresh pool and returns its address.
func serve(t testing.TB) (string, *cache.Pool) {
	t.Helper()
	name := fmt.Sprintf("mc-test-%d-%d", os.Getpid(), seq.Add(1))
	p, err := cache.Open(name, cache.Options{MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(p)
	go s.Serve(l)
	t.Cleanup(func() {
		s.Close()
		p.Close()
		cache.Remove(name)
	})
	return l.Addr().String(), p
}

// TestGomemcache drives the server with an unchanged memcached client.
func TestGomemcache(t *testing.T) {
	addr, _ := serve(t)
	mc := memcache.New(addr)
	if err := mc.Ping(); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Get("missing"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("get of a missing key: %v", err)
	}
	if err := mc.Set(&memcache.Item{Key: "k", Value: []byte("v1"), Flags: 42}); err != nil {
		t.Fatal(err)
	}
	it, err := mc.Get("k")
	if err != nil || string(it.Value) != "v1" || it.Flags != 42 {
		t.Fatalf("get: %+v %v", it, err)
	}
	if err := mc.Add(&memcache.Item{Key: "k", Value: []byte("x")}); !errors.Is(err, memcache.ErrNotStored) {
		t.Fatalf("add over an entry: %v", err)
	}
	if err := mc.Replace(&memcache.Item{Key: "nope", Value: []byte("x")}); !errors.Is(err, memcache.ErrNotStored) {
		t.Fatalf("replace of a missing key: %v", err)
	}
	it.Value = []byte("v2")
	if err := mc.CompareAndSwap(it); err != nil {
		t.Fatalf("cas: %v", err)
	}
	it.Value = []byte("v3")
	if err := mc.CompareAndSwap(it); !errors.Is(err, memcache.ErrCASConflict) {
		t.Fatalf("cas with a stale token: %v", err)
	}
	if err := mc.Append(&memcache.Item{Key: "k", Value: []byte("+a")}); err != nil {
		t.Fatal(err)
	}
	if err := mc.Prepend(&memcache.Item{Key: "k", Value: []byte("p+")}); err != nil {
		t.Fatal(err)
	}
	if it, _ := mc.Get("k"); it == nil || string(it.Value) != "p+v2+a" {
		t.Fatalf("after append and prepend: %+v", it)
	}
	mc.Set(&memcache.Item{Key: "n", Value: []byte("10")})
	if v, err := mc.Increment("n", 5); err != nil || v != 15 {
		t.Fatalf("incr: %d %v", v, err)
	}
	if v, err := mc.Decrement("n", 100); err != nil || v != 0 {
		t.Fatalf("decr below zero: %d %v", v, err)
	}
	if _, err := mc.Increment("k", 1); err == nil {
		t.Fatal("incremented a non-number")
	}
	m, err := mc.GetMulti([]string{"k", "n", "missing"})
	if err != nil || len(m) != 2 {
		t.Fatalf("get multi: %v %v", m, err)
	}
	if err := mc.Touch("k", 1); err != nil {
		t.Fatal(err)
	}
	if err := mc.Delete("n"); err != nil {
		t.Fatal(err)
	}
	if err := mc.Delete("n"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("second delete: %v", err)
	}
	if err := mc.Set(&memcache.Item{Key: "big", Value: make([]byte, 2<<20)}); err == nil {
		t.Fatal("stored 2 MiB")
	}
	if err := mc.Set(&memcache.Item{Key: "after", Value: []byte("ok")}); err != nil {
		t.Fatalf("the connection broke after a too-large value: %v", err)
	}
	if err := mc.FlushAll(); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Get("after"); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("get after flush_all: %v", err)
	}
}

// session sends raw commands on one connection, each followed by mn,
// and collects each one's answer: what came before the MN. A command
// after which the server closes the connection answers what came before
// the close and "<closed>"; the next command gets a new connection.
func session(t *testing.T, addr string, cmds []string) []string {
	t.Helper()
	var c net.Conn
	var r *bufio.Reader
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	var out []string
	for _, cmd := range cmds {
		if c == nil {
			var err error
			if c, err = net.Dial("tcp", addr); err != nil {
				t.Fatal(err)
			}
			r = bufio.NewReader(c)
		}
		// Write while reading: a long command's answers may fill the
		// socket before the command is all sent.
		wrote := make(chan struct{})
		go func(c net.Conn) {
			defer close(wrote)
			c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			io.WriteString(c, cmd+"mn\r\n")
		}(c)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		// The command's own mn lines answer MN too.
		var got string
		var err error
		for range strings.Count("\n"+cmd, "\nmn\r\n") {
			var part string
			part, err = readUntilMN(r)
			got += part
			if err != nil {
				break
			}
			got += "MN\r\n"
		}
		if err == nil {
			var part string
			part, err = readUntilMN(r)
			got += part
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("%q: no answer within 20 s (got %q)", trunc(cmd), trunc(got))
				got += "<timeout>"
			} else {
				got += "<closed>"
			}
			c.Close()
			c = nil
		}
		<-wrote
		out = append(out, got)
	}
	return out
}

// readUntilMN reads an answer up to the MN that ends it (not
// included).
func readUntilMN(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		s := b.String()
		if s == "MN\r\n" || strings.HasSuffix(s, "\nMN\r\n") {
			return s[:len(s)-4], nil
		}
	}
}

var (
	casRe     = regexp.MustCompile(`(VALUE \S+ \d+ \d+) \d+|( c)\d+`)
	versionRe = regexp.MustCompile(`VERSION 1\.6\.\S+`)
)

// TestSameAnswersAsMemcached runs command sequences, good and bad, against
// real memcached and this server, and compares the answers (CAS tokens
// are each server's own, so they are masked).
func TestSameAnswersAsMemcached(t *testing.T) {
	real, err := testenv.StartMemcached()
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	ours, _ := serve(t)
	cmds := []string{
		"set a 5 0 3\r\nabc\r\n",
		"get a\r\n",
		"gets a\r\n",
		"get a b c\r\n",
		"add a 0 0 1\r\nx\r\n",
		"add b 0 0 1\r\nx\r\n",
		"replace zz 0 0 1\r\nx\r\n",
		"append a 0 0 2\r\nde\r\n",
		"prepend a 0 0 2\r\nzz\r\n",
		"get a\r\n",
		"cas a 0 0 1 1\r\nq\r\n",
		"cas missing 0 0 1 1\r\nq\r\n",
		"set n 0 0 2\r\n10\r\n",
		"incr n 5\r\n",
		"decr n 100\r\n",
		"incr a 1\r\n",
		"incr missing 1\r\n",
		"incr n abc\r\n",
		"touch a 100\r\n",
		"touch missing 100\r\n",
		"delete b\r\n",
		"delete b\r\n",
		"delete a noreply\r\nget a\r\n",
		"set q 0 0 1 noreply\r\nz\r\nget q\r\n",
		"bogus\r\n",
		"\r\n",
		"get\r\n",
		"set x 0 0 -1\r\n",
		"set x 0 0 3\r\nabcdef\r\n",
		"set x 0 0 abc\r\n",
		"get " + strings.Repeat("k", 251) + "\r\n",
		"set " + strings.Repeat("k", 251) + " 0 0 1\r\nx\r\n",
		"set big 0 0 2000000\r\n" + strings.Repeat("x", 2000000) + "\r\nget big\r\n",
		"set exp 0 -1 1\r\nx\r\nget exp\r\n",
		"gat 100 n\r\n",
		"mn\r\n",
		"ms m1 2 T0 F7\r\nhi\r\n",
		"mg m1 v f\r\n",
		"mg m1 s v k\r\n",
		"mg m1 Oabc q\r\n",
		"mg nothere v\r\n",
		"mg nothere v q\r\nmn\r\n",
		"ms m1 2 ME\r\nhi\r\n",
		"ms m2 2 MR\r\nhi\r\n",
		"ms m1 1 MA\r\n!\r\n",
		"mg m1 v\r\n",
		"md m1\r\n",
		"md m1\r\n",
		"md m1 q\r\nmn\r\n",
		"ma cnt\r\n",
		"ma cnt N0 J10\r\n",
		"ma cnt v\r\n",
		"ma cnt MD D3 v\r\n",
		"ms b64 1 b\r\nx\r\n",
		"mg YjY0 b v\r\n",
		"flush_all\r\n",
		"get n\r\n",
		"version\r\n",
	}
	want := session(t, real.Addr, cmds)
	got := session(t, ours, cmds)
	for i := range cmds {
		w := casRe.ReplaceAllString(want[i], "$1$2<cas>")
		g := casRe.ReplaceAllString(got[i], "$1$2<cas>")
		if strings.HasPrefix(cmds[i], "version") {
			// Both say VERSION 1.6.x; ours adds -ubkit.
			w, g = versionRe.ReplaceAllString(w, "VERSION <v>"), versionRe.ReplaceAllString(g, "VERSION <v>")
		}
		if w != g {
			t.Errorf("%q:\n memcached: %q\n ours:      %q", trunc(cmds[i]), trunc(w), trunc(g))
		}
	}
}

func trunc(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// FuzzServer feeds the parser garbage: it must answer or close, never
// panic or hang.
func FuzzServer(f *testing.F) {
	for _, s := range []string{
		"get a\r\n", "set a 0 0 1\r\nx\r\n", "set a 0 0 99999999999\r\n", "ms k 3 T-1 MS C1\r\nabc\r\n",
		"mg " + strings.Repeat("a", 300) + " v\r\n", "ma k N0 J1 D2 MD v c t\r\n", "mg a b v\r\n",
		"cas a 0 0 1 x\r\nx\r\n", "gat x\r\n", "flush_all -1\r\n", "\x00\xff\r\n",
	} {
		f.Add([]byte(s))
	}
	name := fmt.Sprintf("mc-fuzz-%d", os.Getpid())
	p, err := cache.Open(name, cache.Options{MaxBytes: 4 << 20})
	if err != nil {
		f.Fatal(err)
	}
	defer cache.Remove(name)
	defer p.Close()
	s := NewServer(p)
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := net.Pipe()
		done := make(chan struct{})
		go func() {
			s.ServeConn(a)
			close(done)
		}()
		go io.Copy(io.Discard, b)
		b.Write(in)
		b.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the server hung on its input")
		}
	})
}

// TestUnixSocket: the server speaks the protocol on a unix socket too.
func TestUnixSocket(t *testing.T) {
	name := fmt.Sprintf("mc-unix-%d", os.Getpid())
	p, err := cache.Open(name, cache.Options{MaxBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Remove(name)
	defer p.Close()
	path := t.TempDir() + "/mc.sock"
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(p)
	go s.Serve(l)
	defer s.Close()
	mc := memcache.New(path)
	if err := mc.Set(&memcache.Item{Key: "k", Value: []byte("over a unix socket")}); err != nil {
		t.Fatal(err)
	}
	if it, err := mc.Get("k"); err != nil || string(it.Value) != "over a unix socket" {
		t.Fatalf("get: %v %v", it, err)
	}
}
