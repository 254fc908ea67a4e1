package memcached

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
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
func serve(t testing.TB) (string, *cache.Store) {
	t.Helper()
	return serveWith(t, 16<<20, nil, nil)
}

// serveWith starts a server on a fresh pool of maxBytes, configured by
// cfg and listening through wrap (either may be nil).
func serveWith(t testing.TB, maxBytes int64, cfg func(*Server), wrap func(net.Listener) net.Listener) (string, *cache.Store) {
	t.Helper()
	name := fmt.Sprintf("mc-test-%d-%d", os.Getpid(), seq.Add(1))
	p, err := cache.Open(name, cache.Config{MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		p.Close()
		cache.Remove(name)
		t.Fatal(err)
	}
	s := NewServer(p)
	if cfg != nil {
		cfg(s)
	}
	sl := net.Listener(l)
	if wrap != nil {
		sl = wrap(l)
	}
	go s.Serve(sl)
	t.Cleanup(func() {
		s.Close()
		p.Close()
		if err := cache.Remove(name); err != nil {
			t.Errorf("removing the pool: %v", err)
		}
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
	casRe     = regexp.MustCompile(`(VALUE [^ ]+ \d+ \d+) \d+|( c)\d+`)
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
	cmds = append(cmds, longLineCases()...)
	cmds = append(cmds, tooLargeCases()...)
	cmds = append(cmds, noreplyCases()...)
	cmds = append(cmds, parsingCases()...)
	cmds = append(cmds, metaCases()...)
	cmds = append(cmds, cullCases()...)
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

// keys returns n keys "<prefix>0" ... separated by spaces.
func keys(prefix string, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s%d", prefix, i)
	}
	return b.String()
}

// longLineCases: memcached serves get lines of any length (pymemcache's
// get_many of 100 keys is over 2,048 bytes); any other line is answered
// if it ends within memcached's 16 KiB read buffer, and closes the
// connection if it does not.
func longLineCases() []string {
	pad := func(cmd string, n int) string { return cmd + strings.Repeat("x", n-len(cmd)-2) + "\r\n" }
	return []string{
		"set lk10 0 0 2\r\nvA\r\nset lk99 7 0 2\r\nvB\r\n",
		"get " + keys("lk", 100) + "\r\n",
		"gets " + keys("lk", 100) + "\r\n",
		"get " + keys("long-key-of-some-length-", 500) + " lk10\r\n", // ~15 KB
		"get " + keys("lk", 3000) + " lk10\r\n",                      // ~20 KB
		"get " + keys("lk", 20000) + " lk10\r\n",                     // ~130 KB
		"get " + keys("lk", 150000) + " lk99\r\n",                    // ~1.2 MB: streamed
		"gets " + keys("lk", 150000) + " lk99\r\n",
		"get " + keys("lk", 3000) + " " + strings.Repeat("k", 251) + " lk10\r\n",
		"get " + keys("lk", 3000) + " lk10\x00 lk99\r\n",
		"get " + keys("lk", 150000) + " lk10\x00 lk99\r\n",
		"get lk10 " + strings.Repeat(" ", 20000) + " lk99\r\n",
		strings.Repeat(" ", 100) + "get " + keys("lk", 3000) + " lk10\r\n",
		strings.Repeat(" ", 101) + "get " + keys("lk", 3000) + " lk10\r\n",
		"gat 0 " + keys("lk", 3000) + "\r\n",
		"bogus" + strings.Repeat("x", 3000) + "\r\n",
		"set " + strings.Repeat("k", 3000) + " 0 0 1\r\nx\r\n",
		"get " + strings.Repeat("k", 3000) + "\r\n",
		pad("bogus", 16384),
		pad("bogus", 16385),
		pad("gat 0 k ", 16384),
		pad("gat 0 k ", 16385),
		"get lk10\r\n",
	}
}

// tooLargeCases: memcached's item size limit counts its item header, so
// the largest value depends on the key and on whether flags are 0; a set
// it refuses removes the old value, other storage commands leave it.
func tooLargeCases() []string {
	const most = 1048516 // with a 1-byte key and flags 0
	set := func(cmd, key string, flags, n int, extra string) string {
		return fmt.Sprintf("%s %s %d 0 %d%s\r\n%s\r\n", cmd, key, flags, n, extra, strings.Repeat("y", n))
	}
	var cs []string
	for _, c := range []struct{ key, flags, n int }{
		{1, 0, most}, {1, 0, most + 1}, {1, 1, most - 4}, {1, 1, most - 3},
		{250, 0, most - 249}, {250, 0, most - 248}, {250, 9, most - 253}, {250, 9, most - 252},
	} {
		key := strings.Repeat("L", c.key)
		cs = append(cs, set("set", key, c.flags, c.n, "")+"mg "+key+" s f\r\n")
	}
	for _, cmd := range []string{"set", "add", "replace", "append", "prepend", "cas"} {
		extra := ""
		if cmd == "cas" {
			extra = " 1"
		}
		cs = append(cs,
			"set old 3 0 3\r\nold\r\n"+set(cmd, "old", 0, most+1, extra)+"get old\r\n",
			"set old 3 0 3\r\nold\r\n"+set(cmd, "old", 0, most+1, extra+" noreply")+"get old\r\n")
	}
	for _, mode := range []string{"", " MS", " ME", " MR", " MA", " MP", " C1", " q"} {
		cs = append(cs, fmt.Sprintf("set old 3 0 3\r\nold\r\nms old %d%s\r\n%s\r\nget old\r\n", most+1, mode, strings.Repeat("y", most+1)))
	}
	// append and prepend past the limit: NOT_STORED, the old value kept.
	cs = append(cs,
		set("set", "a", 0, most-5, "")+"append a 0 0 5\r\nzzzzz\r\nmg a s\r\n",
		set("set", "a", 0, most-5, "")+"append a 0 0 6\r\nzzzzzz\r\nmg a s\r\n",
		set("set", "a", 5, most-5, "")+"prepend a 0 0 2\r\nzz\r\nmg a s\r\n",
		set("set", "a", 5, most-5, "")+"prepend a 0 0 1\r\nz\r\nmg a s\r\n",
		set("set", "a", 0, most-5, "")+"append a 0 0 6 noreply\r\nzzzzzz\r\nmg a s\r\n",
	)
	return cs
}

// noreplyCases: noreply hides every answer of the classic commands,
// errors included, as memcached's; what follows a bad line is read as
// memcached reads it.
func noreplyCases() []string {
	return []string{
		"set nr 0 0 3 noreply\r\nabcdef\r\nget nr\r\n",
		"set nr 0 0 3 noreply\r\nabc\r\nset nr 0 0 1 noreply\r\nxyz\r\nget nr\r\n",
		"set nr 0 0 abc noreply\r\nget nr\r\n",
		"set nr 0 0 noreply\r\nget nr\r\n",
		"set nr -1 0 1 noreply\r\nx\r\n",
		"set " + strings.Repeat("k", 251) + " 0 0 1 noreply\r\nx\r\n",
		"add nr 0 0 1 noreply\r\nx\r\nadd nr 0 0 1 noreply\r\ny\r\nget nr\r\n",
		"cas nr 0 0 1 1 noreply\r\nz\r\nget nr\r\n",
		"incr nr 1 noreply\r\nincr nr x noreply\r\nincr missing 1 noreply\r\n",
		"touch nr 10 noreply\r\ntouch nr x noreply\r\n",
		"delete nr 1 noreply\r\ndelete nr 0 noreply\r\ndelete nr noreply\r\nget nr\r\n",
		"ms nr 3 q\r\nabcdef\r\n",
		"ms nr 3 q\r\nabc\r\nmg nr v\r\n",
	}
}

// parsingCases: memcached's tokenizer and its C number parsing.
func parsingCases() []string {
	var cs []string
	for _, key := range []string{"k\x01y", "k\ty", "k\x7fy", "k\xffy", "k\ry", "\x1b[0m"} {
		cs = append(cs, "set "+key+" 0 0 1\r\nx\r\nget "+key+"\r\ndelete "+key+"\r\n")
	}
	cs = append(cs, "get a\x00b\r\n", "set nul 0 0 1\x00 junk\r\nx\r\n", "get k\r\r\n", "get k\n", "\n", "\r\n")
	// Not a value of 2^63 or more without a minus sign in it: for those,
	// memcached's check for a minus sign reads past the value into
	// whatever memory follows, and its answer varies.
	for _, v := range []string{"  5", "5  ", "+5", "-5", "-0", "5 abc", "\t7\t", "12abc", "9223372036854775807",
		"18446744073709551616", "00042", "9223372036854775808 -"} {
		cs = append(cs, fmt.Sprintf("set n 0 0 %d\r\n%s\r\nincr n 1\r\nget n\r\ndecr n 3\r\nget n\r\n", len(v), v))
	}
	cs = append(cs, "set n 0 0 0\r\n\r\nincr n 1\r\n", "set n 0 0 2\r\n99\r\nincr n 1\r\nget n\r\n",
		"incr n -1\r\nincr n +1\r\nincr n 18446744073709551616\r\nincr n 1x\r\nincr "+strings.Repeat("k", 251)+" x\r\n")
	for _, flags := range []string{"4294967296", "4294967295", "4294967297", "18446744073709551615", "18446744073709551616",
		"-1", "-0", "+5", "5\t", "5\tjunk", "0x10", "", "1e3"} {
		cs = append(cs, "set fl "+flags+" 0 1\r\nx\r\nget fl\r\n")
	}
	for _, n := range []string{"4294967297", "-4294967295", "+1", "1\t", "2147483646", "9223372036854775808"} {
		cs = append(cs, "set vl 0 0 "+n+"\r\nx\r\nget vl\r\n")
	}
	// Not a TTL of a few seconds: memcached's clock ticks once a second,
	// so such an item may be gone at once.
	for _, e := range []string{"4294967296", "4294967295", "-1", "+0", "x", "2592000", "100000", "-2147483649"} {
		cs = append(cs, "set ex 0 "+e+" 1\r\nx\r\nget ex\r\n")
	}
	cs = append(cs,
		"set e 0 0 1\r\nx\r\nadd e 0 -1 1\r\ny\r\nget e\r\nreplace e 0 -1 1\r\ny\r\nget e\r\nadd e 0 -1 1\r\ny\r\nget e\r\n",
		"set e 0 0 1\r\nx\r\nappend e 0 -1 1\r\ny\r\nget e\r\n",
		"cas e 0 0 1 0\r\nx\r\nset e 0 0 1\r\nx\r\ncas e 0 0 1 0\r\nx\r\n",
		"set g 0 0 1\r\nx\r\ngat -1 g\r\nget g\r\n",
		"set g 0 0 1\r\nx\r\ngat 0 g\r\ngats 100 g g\r\ngat x g\r\ngat 100\r\ngat\r\ngats\r\n",
		"gat 100 "+strings.Repeat("k", 251)+"\r\n",
		"set g 0 0 1\r\nx\r\nbget g\r\ngets\r\ngetx g\r\n",
		"touch "+strings.Repeat("k", 251)+" x\r\ntouch g x\r\ntouch g\r\ntouch g -1\r\nget g\r\n",
		"delete g 1\r\ndelete g 0\r\ndelete g noreply 0\r\ndelete\r\ndelete a b c d\r\ndelete "+strings.Repeat("k", 251)+"\r\n",
		"flush_all 0 2\r\nflush_all x\r\nflush_all noreply\r\nflush_all 0 noreply\r\nflush_all x noreply\r\nflush_all -5\r\nflush_all 0 1 2\r\n",
		"verbosity\r\nverbosity 1\r\nverbosity 1 noreply\r\nverbosity x\r\nverbosity noreply\r\nverbosity 1 2\r\nverbosity 1 2 3\r\nverbosity 0\r\n",
		"stats bogus\r\nstats sizes\r\nstats reset\r\nstats\x01\r\n",
		"set "+strings.Repeat("a ", 30)+"\r\n", "get"+strings.Repeat(" x", 40)+"\r\n",
		"x\r\n", "mz\r\n", "m\r\n", "SET a 0 0 1\r\n",
		"GET / HTTP/1.1\r\n",
		"quit\r\n",
	)
	return cs
}

// metaCases: the meta commands' error paths.
func metaCases() []string {
	return []string{
		"mg\r\nms\r\nmd\r\nma\r\n",
		"ms mk\r\nhi\r\n",
		"ms mk abc\r\nhi\r\n",
		"ms mk -1\r\nhi\r\n",
		"ms mk 2 MZ\r\nhi\r\n",
		"ms mk 2 Ms\r\nhi\r\n",
		"ms mk 2 MSS\r\nhi\r\n",
		"ms mk 2 T\r\nhi\r\n",
		"ms mk 2 Fx\r\nhi\r\n",
		"ms mk 2 F4294967296\r\nhi\r\nmg mk f v\r\n",
		"ms mk 2 !\r\nhi\r\n",
		"ms mk 2 T1 T2\r\nhi\r\n",
		"ms mk 2 O" + strings.Repeat("o", 31) + " k c\r\nhi\r\n",
		"ms mk 2 O" + strings.Repeat("o", 32) + "\r\nhi\r\n",
		"ms mk 2" + strings.Repeat(" s", 17) + "\r\nhi\r\n",
		"ms mk 2" + strings.Repeat(" s", 18) + "\r\nhi\r\n",
		"ms " + strings.Repeat("k", 251) + " 2\r\nhi\r\n",
		"ms mk 2 k O1 c\r\nhi\r\n",
		"ms mk 1 MA k\r\n!\r\nmg mk v k O9\r\n",
		"ms mk 2 q\r\nhix\r\n",
		"mg mk v v\r\nmg mk !\r\nmg mk Tx\r\nmg " + strings.Repeat("k", 251) + " v\r\n",
		"mg nothere O123 k v\r\nmg nothere k b\r\n",
		"mg mk" + strings.Repeat(" s", 17) + "\r\nmg mk" + strings.Repeat(" s", 18) + "\r\n",
		"md mk x\r\nmd mk q q\r\nmd nothere O1 k\r\nmd nothere q\r\n",
		"ma cnt q\r\nma cnt MZ\r\nma cnt Mi\r\nma cnt M+ v\r\nma cnt Dx\r\nma cnt x\r\n",
		"ma cnt2 N0 J5 q\r\nma cnt2 q\r\nma cnt2 v q\r\nma cnt2 v\r\n",
		"ms mk 1\r\nx\r\nma mk\r\nma mk C1\r\n",
		// ma's c and t describe its own write; a t before T the item before.
		"set mt 0 0 2\r\n50\r\nma mt T-1 c v\r\nmg mt v\r\n",
		"set mt2 0 0 2\r\n50\r\nma mt2 t T3600\r\nma mt2 T3600 t\r\n",
		"ma mt3 T-1 N100 v\r\nmg mt3 v\r\nma mt4 N100 T-1 v\r\nmg mt4 v\r\n",
		"set md1 0 0 1\r\nx\r\nmd md1 C1\r\nmd md1 C0\r\nmd nokey C5\r\n",
		"mg mk s v Oxyz k t c f\r\n",
		// memcached's base64 skips what is not in its alphabet.
		"mg raw-3 b v k\r\nma raw-0 MS b\r\nms bWs= 1 b k\r\nq\r\nmg b-W-s= b k v\r\nmd bWs b\r\n",
		// Return flags are written where they stand: a t before T shows
		// the old TTL.
		"ms tt 1\r\nx\r\nmg tt t T100 v\r\nma tc N0 t T100\r\n",
	}
}

// cullCases: a get with a key over 250 bytes drops the answers memcached
// has not sent yet: those since its last get or mn, or since the last 20
// commands it ran in a row (21 on a new connection).
func cullCases() []string {
	bad := "get " + strings.Repeat("K", 251) + "\r\n"
	return []string{
		"bogus\r\n" + bad,
		"set cu 0 0 1\r\nx\r\nget cu\r\nbogus\r\nget cu " + strings.Repeat("K", 251) + "\r\n",
		"set cu 0 0 1\r\nx\r\nmn\r\nbogus\r\n" + bad,
		strings.Repeat("bogus\r\n", 20) + bad,
		strings.Repeat("bogus\r\n", 21) + bad,
		strings.Repeat("bogus\r\n", 40) + bad,
		strings.Repeat("bogus\r\n", 41) + bad,
		"get cu\r\n" + strings.Repeat("bogus\r\n", 19) + bad,
		"get cu\r\n" + strings.Repeat("bogus\r\n", 20) + bad,
		strings.Repeat("set cu 0 0 1 noreply\r\nx\r\n", 5) + "incr cu 1\r\n" + bad,
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
		"set a 0 0 1 noreply\r\nxyz\r\n", "get " + strings.Repeat("k ", 9000) + "\r\n",
		"stats\r\nstats settings\r\nstats reset\r\nverbosity 1 noreply\r\n",
		strings.Repeat("bogus\r\n", 21) + "get " + strings.Repeat("K", 251) + "\r\n",
		"incr a 18446744073709551616\r\nset n 0 0 3\r\n  5\r\nincr n 1\r\n", "ms a 2 b MZ\r\nhi\r\nmg YQ== b k v t T9\r\n",
	} {
		f.Add([]byte(s))
	}
	name := fmt.Sprintf("mc-fuzz-%d", os.Getpid())
	p, err := cache.Open(name, cache.Config{MaxBytes: 4 << 20})
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
		case <-time.After(5 * time.Second): // a hang guard
			t.Fatal("the server hung on its input")
		}
	})
}

// TestUnixSocket: the server speaks the protocol on a unix socket too.
func TestUnixSocket(t *testing.T) {
	name := fmt.Sprintf("mc-unix-%d", os.Getpid())
	p, err := cache.Open(name, cache.Config{MaxBytes: 4 << 20})
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

// parseStats returns a stats answer's fields in order.
func parseStats(t *testing.T, answer string) (names []string, values map[string]string) {
	t.Helper()
	values = map[string]string{}
	lines := strings.Split(strings.TrimSuffix(answer, "\r\n"), "\r\n")
	if len(lines) == 0 || lines[len(lines)-1] != "END" {
		t.Fatalf("stats answer %q does not end with END", trunc(answer))
	}
	for _, line := range lines[:len(lines)-1] {
		f := strings.SplitN(line, " ", 3)
		if len(f) != 3 || f[0] != "STAT" {
			t.Fatalf("stats line %q", line)
		}
		names = append(names, f[1])
		values[f[1]] = f[2]
	}
	return names, values
}

// TestStatsAsMemcached: stats and stats settings give memcached's field
// names in memcached's order, and after the same commands the counters
// that monitoring reads have memcached's values.
func TestStatsAsMemcached(t *testing.T) {
	real, err := testenv.StartMemcached()
	if err != nil {
		t.Fatal(err)
	}
	defer real.Close()
	ours, _ := serve(t)
	cmds := []string{
		"set a 0 0 1\r\n1\r\nset b 0 0 1\r\nx\r\n",
		"get a b missing\r\nget a\r\nmg a v\r\nmg missing v\r\n",
		"add a 0 0 1\r\nx\r\nreplace nope 0 0 1\r\nx\r\nappend b 0 0 1\r\ny\r\nprepend nope 0 0 1\r\ny\r\n",
		"cas a 0 0 1 1\r\nx\r\ncas nope 0 0 1 1\r\nx\r\n",
		"incr a 5\r\nincr nope 1\r\ndecr a 2\r\ndecr a 1\r\ndecr nope 1\r\nincr b 1\r\n",
		"touch a 100\r\ntouch nope 100\r\ngat 100 a nope\r\n",
		"delete b\r\ndelete b\r\nmd a\r\nmd a\r\n",
		"set big 0 0 1048517\r\n" + strings.Repeat("z", 1048517) + "\r\n",
		"set bad 0 0 1\r\nxyz\r\n",
		"set c 0 0 1\r\nc\r\nset d 0 0 1\r\nd\r\n",
		// An invalid flush_all counts, and flushes nothing (memcached
		// would count flushed items in curr_items until it reclaims them).
		"flush_all x noreply\r\nset e 0 0 1\r\ne\r\n",
	}
	// The statistics are read on the same connection, so that every
	// answer before them has been counted.
	cmds = append(cmds, "stats\r\n", "stats settings\r\n")
	want, got := session(t, real.Addr, cmds), session(t, ours, cmds)
	for i := range cmds[:len(cmds)-2] {
		if want[i] != got[i] {
			t.Fatalf("%q: memcached %q, ours %q (the counters below would differ for that)", trunc(cmds[i]), want[i], got[i])
		}
	}
	for i, sub := range []string{"stats", "stats settings"} {
		wantNames, wantValues := parseStats(t, want[len(cmds)-2+i])
		gotNames, gotValues := parseStats(t, got[len(cmds)-2+i])
		// Our fields are memcached's, in its order (a subsequence).
		j := 0
		for _, name := range gotNames {
			for j < len(wantNames) && wantNames[j] != name {
				j++
			}
			if j == len(wantNames) {
				t.Errorf("%s: field %s is not memcached's, or out of its order (memcached: %v)", sub, name, wantNames)
				break
			}
		}
		if sub != "stats" {
			continue
		}
		for _, name := range []string{"cmd_get", "cmd_set", "cmd_flush", "cmd_touch", "cmd_meta", "get_hits", "get_misses",
			"delete_misses", "delete_hits", "incr_misses", "incr_hits", "decr_misses", "decr_hits", "cas_misses",
			"cas_hits", "cas_badval", "touch_hits", "touch_misses", "store_too_large", "store_no_memory", "auth_cmds",
			"auth_errors", "bytes_read", "bytes_written", "limit_maxbytes", "accepting_conns", "curr_items",
			"total_items", "evictions", "rejected_connections", "pointer_size"} {
			if name == "limit_maxbytes" {
				// Each its own memory: the pool's, and memcached's -m.
				continue
			}
			if gotValues[name] != wantValues[name] {
				t.Errorf("stats %s: memcached %q, ours %q", name, wantValues[name], gotValues[name])
			}
		}
		for _, name := range []string{"pid", "uptime", "time", "version", "curr_connections", "total_connections", "threads", "bytes", "limit_maxbytes"} {
			if gotValues[name] == "" {
				t.Errorf("stats: no %s", name)
			}
		}
		if gotValues["curr_connections"] != "1" || gotValues["total_connections"] != "1" {
			t.Errorf("stats curr_connections %s, total_connections %s, want 1 and 1 (the session's)",
				gotValues["curr_connections"], gotValues["total_connections"])
		}
	}
	got = session(t, ours, []string{"verbosity 2\r\n", "stats settings\r\n", "stats reset\r\n", "stats\r\n"})
	if got[0] != "OK\r\n" || got[2] != "RESET\r\n" {
		t.Fatalf("verbosity 2: %q; stats reset: %q", got[0], got[2])
	}
	_, settings := parseStats(t, got[1])
	if settings["item_size_max"] != "1048576" || settings["cas_enabled"] != "yes" ||
		settings["maxbytes"] != strconv.Itoa(16<<20) || settings["verbosity"] != "2" {
		t.Errorf("stats settings: %v", settings)
	}
	_, after := parseStats(t, got[3])
	for _, name := range []string{"cmd_get", "get_hits", "cmd_set", "total_items", "cas_badval", "touch_hits"} {
		if after[name] != "0" {
			t.Errorf("stats %s %s after stats reset", name, after[name])
		}
	}
	if after["curr_items"] == "0" {
		t.Error("stats reset cleared curr_items")
	}
}

// TestMetaDeleteCASRace: md with C compares and deletes in one step, so a
// set landing in between is never lost.
func TestMetaDeleteCASRace(t *testing.T) {
	addr, _ := serve(t)
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	ca, ra := dial()
	cb, rb := dial()
	// ask sends cmd and reads one line of the answer; line is ask for the
	// test's goroutine, which may fail the test. (A t.Fatal in another
	// goroutine would end only that goroutine, and the test would wait
	// for its answer until the test binary's timeout killed it, before
	// the cleanups that remove its pools.)
	ask := func(c net.Conn, r *bufio.Reader, cmd string) (string, error) {
		c.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
		if _, err := io.WriteString(c, cmd); err != nil {
			return "", err
		}
		return r.ReadString('\n')
	}
	line := func(c net.Conn, r *bufio.Reader, cmd string) string {
		t.Helper()
		l, err := ask(c, r, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	for i := range 5000 {
		hd := line(ca, ra, "ms race 1 c\r\nx\r\n")
		var v uint64
		if _, err := fmt.Sscanf(hd, "HD c%d", &v); err != nil {
			t.Fatalf("ms: %q", hd)
		}
		done := make(chan error, 1)
		go func() {
			_, err := ask(ca, ra, fmt.Sprintf("md race C%d\r\n", v))
			done <- err
		}()
		line(cb, rb, "ms race 1\r\ny\r\n")
		if err := <-done; err != nil {
			t.Fatalf("round %d: md: %v", i, err)
		}
		if got := line(cb, rb, "mg race v\r\n"); strings.HasPrefix(got, "EN") {
			t.Fatalf("round %d: a set racing md C%d was lost", i, v)
		} else if strings.HasPrefix(got, "VA") {
			line(cb, rb, "") // the value line
		}
	}
}

// flakyListener fails its first Accept with EMFILE, as a process out of
// descriptors sees.
type flakyListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed.Swap(true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: errors.New("accept4: too many open files")}
	}
	return l.Listener.Accept()
}

// TestServeLimits: an accept error does not stop the server, and beyond
// MaxConns a connection is refused as memcached refuses it.
func TestServeLimits(t *testing.T) {
	addr, _ := serveWith(t, 16<<20, func(s *Server) { s.MaxConns = 2 },
		func(l net.Listener) net.Listener { return &flakyListener{Listener: l} })
	ask := func(c net.Conn, cmd string) string { // one line, or a stats block to END
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, cmd)
		var out strings.Builder
		var one [1]byte
		for {
			if _, err := c.Read(one[:]); err != nil {
				return out.String()
			}
			out.WriteByte(one[0])
			if s := out.String(); strings.HasSuffix(s, "\r\n") && (!strings.HasPrefix(s, "STAT") || strings.HasSuffix(s, "END\r\n")) {
				return s
			}
		}
	}
	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if got := ask(c, "version\r\n"); !strings.HasPrefix(got, "VERSION") {
			t.Fatalf("after an accept error: %q", got)
		}
		conns = append(conns, c)
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if got := ask(extra, "version\r\n"); got != "ERROR Too many open connections\r\n" {
		t.Fatalf("a connection beyond MaxConns: %q", got)
	}
	if got := ask(conns[0], "stats\r\n"); !strings.Contains(got, "STAT rejected_connections 1\r\n") {
		t.Errorf("stats after a refusal: %q", got)
	}
}
