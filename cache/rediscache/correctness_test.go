package rediscache

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// TestReadYourWrites: after a write through the drop-in returns, the same
// client's read gives what plain go-redis gives, without waiting for the
// invalidation push. Each case runs many times, since the push usually
// wins the race and the bug shows only when it does not.
func TestReadYourWrites(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	type step func(c redis.Cmdable, i int) redis.Cmder
	cases := []struct {
		name  string
		setup func(i int)
		write step
		read  step
	}{
		{"set-get", func(i int) { direct.Set(ctx, "ryw:s", "v1", 0) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Set(ctx, "ryw:s", "v2-"+strconv.Itoa(i), 0) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:s") }},
		{"hset-hget", func(i int) { direct.HSet(ctx, "ryw:h", "f", "v1") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.HSet(ctx, "ryw:h", "f", "v2-"+strconv.Itoa(i)) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.HGet(ctx, "ryw:h", "f") }},
		{"hset-hgetall", func(i int) { direct.HSet(ctx, "ryw:h2", "f", "v1") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.HSet(ctx, "ryw:h2", "g", i) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.HGetAll(ctx, "ryw:h2") }},
		{"rpush-lrange", func(i int) { direct.Del(ctx, "ryw:l"); direct.RPush(ctx, "ryw:l", "a") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.RPush(ctx, "ryw:l", i) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.LRange(ctx, "ryw:l", 0, -1) }},
		{"sadd-scard", func(i int) { direct.Del(ctx, "ryw:set"); direct.SAdd(ctx, "ryw:set", "a") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.SAdd(ctx, "ryw:set", "b") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.SCard(ctx, "ryw:set") }},
		{"del-get", func(i int) { direct.Set(ctx, "ryw:d", "v1", 0) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Del(ctx, "ryw:d") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:d") }},
		{"missing-then-set", func(i int) { direct.Del(ctx, "ryw:m") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Set(ctx, "ryw:m", i, 0) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:m") }},
		{"mset-mget", func(i int) { direct.MSet(ctx, "ryw:a", "1", "ryw:b", "1") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.MSet(ctx, "ryw:a", i, "ryw:b", i) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.MGet(ctx, "ryw:a", "ryw:b") }},
		{"rename", func(i int) { direct.Set(ctx, "ryw:r1", "x", 0); direct.Set(ctx, "ryw:r2", "old", 0) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Rename(ctx, "ryw:r1", "ryw:r2") },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:r2") }},
		{"zunionstore", func(i int) {
			direct.Del(ctx, "ryw:zd")
			direct.ZAdd(ctx, "ryw:zs", redis.Z{Score: 1, Member: "m"})
		},
			func(c redis.Cmdable, i int) redis.Cmder {
				return c.ZUnionStore(ctx, "ryw:zd", &redis.ZStore{Keys: []string{"ryw:zs"}})
			},
			func(c redis.Cmdable, i int) redis.Cmder { return c.ZCard(ctx, "ryw:zd") }},
		{"eval", func(i int) { direct.Set(ctx, "ryw:e", "v1", 0) },
			func(c redis.Cmdable, i int) redis.Cmder {
				return c.Eval(ctx, "return redis.call('SET', KEYS[1], ARGV[1])", []string{"ryw:e"}, i)
			},
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:e") }},
		{"pipelined-set-then-get", func(i int) { direct.Set(ctx, "ryw:p", "v1", 0) },
			func(c redis.Cmdable, i int) redis.Cmder {
				cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
					p.Set(ctx, "ryw:p", i, 0)
					p.Get(ctx, "ryw:p")
					return nil
				})
				return cmds[1]
			},
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:p") }},
		{"tx-set", func(i int) { direct.Set(ctx, "ryw:t", "v1", 0) },
			func(c redis.Cmdable, i int) redis.Cmder {
				cmds, _ := c.TxPipelined(ctx, func(p redis.Pipeliner) error { p.Set(ctx, "ryw:t", i, 0); return nil })
				return cmds[0]
			},
			func(c redis.Cmdable, i int) redis.Cmder {
				cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, "ryw:t"); return nil })
				return cmds[0]
			}},
		{"flushdb", func(i int) { direct.Set(ctx, "ryw:f", "v1", 0) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.FlushDB(ctx) },
			func(c redis.Cmdable, i int) redis.Cmder { return c.Get(ctx, "ryw:f") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wrong := 0
			for i := range 300 {
				tc.setup(i)
				// Wait out the setup's invalidation, so the read below
				// fills the cache with the setup's value.
				marker(t, rdb, direct)
				tc.read(rdb, i)
				tc.read(rdb, i)
				tc.write(rdb, i)
				got := answer(tc.read(rdb, i))
				want := answer(tc.read(direct, i))
				if got != want {
					if wrong++; wrong <= 3 {
						t.Errorf("round %d: read after the write: %s, plain go-redis: %s", i, got, want)
					}
				}
			}
			if wrong > 0 {
				t.Errorf("%d of 300 reads missed the client's own write", wrong)
			}
		})
	}
	if st := rdb.Stats(); st.Hits == 0 || st.Forgotten == 0 {
		t.Errorf("the cache was not exercised: %+v", st)
	}
}

// marker waits until rdb has applied every write completed before the
// call (Sync).
func marker(t testing.TB, rdb *Client, _ *redis.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Sync(ctx); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// answer is a command's result and error, maps and sets in a canonical
// order.
func answer(c redis.Cmder) string {
	v := reflect.ValueOf(c).MethodByName("Val").Call(nil)[0].Interface()
	if s, ok := v.([]string); ok && (c.Name() == "smembers" || c.Name() == "hkeys" || c.Name() == "hvals") {
		s = append([]string(nil), s...)
		slicesSort(s)
		v = s
	}
	err := c.Err()
	if err != nil {
		return fmt.Sprintf("%#v err=%s", v, err)
	}
	return fmt.Sprintf("%#v", v)
}

// TestWatchNoLostUpdates: a WATCH/GET/MULTI/SET/EXEC increment repeated
// by one client, and by two processes at once, loses nothing.
func TestWatchNoLostUpdates(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	rdb := newClient(t, p, Config{})
	direct := plain(t)
	const key, n = "watch:counter", 1500
	direct.Set(ctx, key, 0, 0)
	marker(t, rdb, direct)
	rdb.Get(ctx, key) // cached, so a read that used the cache would go wrong
	if err := watchIncr(ctx, rdb, key, n); err != nil {
		t.Fatal(err)
	}
	if got := direct.Get(ctx, key).Val(); got != strconv.Itoa(n) {
		t.Fatalf("one client: %s after %d increments", got, n)
	}
	// Two processes, the same pool, at once.
	direct.Set(ctx, key, 0, 0)
	marker(t, rdb, direct)
	rdb.Get(ctx, key)
	child := testenv.Child(t, "watch", "RC_ADDR="+redisAddr, "RC_POOL="+poolName(t, p), "RC_N="+strconv.Itoa(n))
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	err := watchIncr(ctx, rdb, key, n)
	if cerr := child.Wait(); cerr != nil {
		t.Fatalf("child: %v", cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got := direct.Get(ctx, key).Val(); got != strconv.Itoa(2*n) {
		t.Fatalf("two processes: %s after %d increments", got, 2*n)
	}
}

// watchIncr increments key n times with optimistic transactions, as the
// go-redis documentation's example does.
func watchIncr(ctx context.Context, rdb *Client, key string, n int) error {
	for range n {
		for {
			err := rdb.Watch(ctx, func(tx *redis.Tx) error {
				v, err := tx.Get(ctx, key).Int()
				if err != nil && !errors.Is(err, redis.Nil) {
					return err
				}
				_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					p.Set(ctx, key, v+1, 0)
					return nil
				})
				return err
			}, key)
			if errors.Is(err, redis.TxFailedErr) {
				continue
			}
			if err != nil {
				return err
			}
			break
		}
	}
	return nil
}

// TestPipelineErrors: a pipeline served partly from the cache returns the
// error plain go-redis returns, the first failing command's, and each
// command its own.
func TestPipelineErrors(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	direct.Del(ctx, "pe:missing")
	direct.Set(ctx, "pe:str", "x", 0)
	marker(t, rdb, direct)
	rdb.Get(ctx, "pe:missing") // a cached miss
	orders := [][]func(p redis.Pipeliner) redis.Cmder{
		{
			func(p redis.Pipeliner) redis.Cmder { return p.Get(ctx, "pe:missing") },
			func(p redis.Pipeliner) redis.Cmder { return p.HGet(ctx, "pe:str", "f") }, // WRONGTYPE
		},
		{
			func(p redis.Pipeliner) redis.Cmder { return p.HGet(ctx, "pe:str", "f") },
			func(p redis.Pipeliner) redis.Cmder { return p.Get(ctx, "pe:missing") },
		},
		{
			func(p redis.Pipeliner) redis.Cmder { return p.Get(ctx, "pe:str") },
			func(p redis.Pipeliner) redis.Cmder { return p.Get(ctx, "pe:missing") },
			func(p redis.Pipeliner) redis.Cmder { return p.LLen(ctx, "pe:str") },
		},
	}
	for i, order := range orders {
		for round := range 3 {
			run := func(c redis.Cmdable) string {
				return pipelineAnswer(c.Pipelined(ctx, func(p redis.Pipeliner) error {
					for _, f := range order {
						f(p)
					}
					return nil
				}))
			}
			if got, want := run(rdb), run(direct); got != want {
				t.Errorf("pipeline %d round %d: %s\nplain go-redis: %s", i, round, got, want)
			}
		}
	}
}

// TestExpiredKeys: an entry never outlives its Redis key's TTL, though
// Redis sends the invalidation only when it gets round to deleting it.
func TestExpiredKeys(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	for i := range 5 {
		key := "exp:" + strconv.Itoa(i)
		direct.Set(ctx, key, "v", 30*time.Millisecond)
		direct.HSet(ctx, key+"h", "f", "v")
		direct.PExpire(ctx, key+"h", 30*time.Millisecond)
		marker(t, rdb, direct)
		rdb.Get(ctx, key)
		rdb.HGet(ctx, key+"h", "f")
		// Redis's own reads say when the keys are gone (its lazy expiry
		// deletes them then, but the push may come later).
		for end := time.Now().Add(5 * time.Second); direct.Exists(ctx, key, key+"h").Val() != 0; {
			if time.Now().After(end) {
				t.Fatalf("%s never expired in Redis", key)
			}
		}
		if err := rdb.Get(ctx, key).Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("%s after it expired: %v", key, err)
		}
		if err := rdb.HGet(ctx, key+"h", "f").Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("%sh after it expired: %v", key, err)
		}
	}
}

// silencer is a TCP proxy to Redis that can stop forwarding the tracking
// connection while keeping it open, as a stuck middlebox would.
type silencer struct {
	l      net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	silent bool
	conns  []net.Conn
}

func newSilencer(t *testing.T) *silencer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silencer{l: l}
	s.cond = sync.NewCond(&s.mu)
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		s.silent = false
		s.cond.Broadcast()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", redisAddr)
			if err != nil {
				c.Close()
				continue
			}
			s.mu.Lock()
			s.conns = append(s.conns, c, up)
			s.mu.Unlock()
			tracking := make(chan struct{})
			go s.pipe(up, c, tracking, true)
			go s.pipe(c, up, tracking, false)
		}
	}()
	return s
}

// pipe copies src to dst; once the client side named itself the tracking
// connection, a silent proxy holds its bytes in both directions.
func (s *silencer) pipe(dst, src net.Conn, tracking chan struct{}, fromClient bool) {
	buf := make([]byte, 32<<10)
	isTracking := false
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if fromClient && !isTracking && strings.Contains(string(buf[:n]), trackingName) {
				isTracking = true
				close(tracking)
			}
			if !isTracking {
				select {
				case <-tracking:
					isTracking = true
				default:
				}
			}
			if isTracking {
				s.mu.Lock()
				for s.silent {
					s.cond.Wait() // held, as a stuck middlebox holds it
				}
				s.mu.Unlock()
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (s *silencer) silence(on bool) {
	s.mu.Lock()
	s.silent = on
	s.cond.Broadcast()
	s.mu.Unlock()
}

// TestSilentTracking: while the tracking connection is open but silent,
// no answer older than MaxStaleness is served, and reads honour their
// context.
func TestSilentTracking(t *testing.T) {
	ctx := context.Background()
	px := newSilencer(t)
	const maxStale = 200 * time.Millisecond
	rdb := NewClient(&redis.Options{Addr: px.l.Addr().String()}, Config{Store: newPool(t), MaxStaleness: maxStale})
	t.Cleanup(func() { rdb.Close() })
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.WaitTracking(wctx); err != nil {
		t.Fatal(err)
	}
	direct := plain(t)
	direct.Set(ctx, "silent:k", "v1", 0)
	marker(t, rdb, direct)
	rdb.Get(ctx, "silent:k")
	if rdb.Get(ctx, "silent:k").Val() != "v1" || rdb.Stats().Hits == 0 {
		t.Fatalf("not cached: %+v", rdb.Stats())
	}
	px.silence(true)
	defer px.silence(false)
	direct.Set(ctx, "silent:k", "v2", 0)
	written := time.Now()
	// Reads may see v1 for at most maxStale after the write; every read
	// that starts later must see v2, and none may block past its context.
	// On through the PING deadline: the tracker gives the connection up
	// and redials (into the same silence) while reads go on.
	for time.Since(written) < minDeadAfter+300*time.Millisecond {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		v, err := rdb.Get(rctx, "silent:k").Result()
		cancel()
		if err != nil {
			t.Fatalf("read during silence: %v (after %v)", err, time.Since(start))
		}
		if v != "v2" && start.Sub(written) > maxStale {
			t.Fatalf("read %v after the write, with MaxStaleness %v, served %q", start.Sub(written), maxStale, v)
		}
	}
	if rdb.Stats().Unconfirmed == 0 {
		t.Errorf("no read was refused the cache while tracking was silent: %+v", rdb.Stats())
	}
}

// TestCommandTableKeys checks which keys writes are found to touch, with
// the real server's command table.
func TestCommandTableKeys(t *testing.T) {
	rdb := newClient(t, newPool(t), Config{})
	tbl := rdb.nc.table()
	if tbl == nil {
		t.Fatal("no command table loaded")
	}
	for _, tc := range []struct {
		args []any
		keys []string
		all  bool
	}{
		{[]any{"get", "k"}, nil, false},
		{[]any{"set", "k", "v", "ex", 10}, []string{"k"}, false},
		{[]any{"mset", "a", 1, "b", 2}, []string{"a", "b"}, false},
		{[]any{"del", "a", "b", "c"}, []string{"a", "b", "c"}, false},
		{[]any{"rename", "a", "b"}, []string{"a", "b"}, false},
		{[]any{"hset", "h", "f", "v"}, []string{"h"}, false},
		{[]any{"zunionstore", "d", 2, "s1", "s2"}, []string{"d"}, false},
		{[]any{"eval", "return 1", 2, "k1", "k2", "arg"}, []string{"k1", "k2"}, false},
		{[]any{"evalsha", "abc", 0}, nil, false},
		{[]any{"lmpop", 2, "l1", "l2", "left"}, []string{"l1", "l2"}, false},
		{[]any{"sort", "l", "store", "dst"}, []string{"dst"}, false},
		{[]any{"sort", "l", "limit", 0, 1}, nil, false},
		{[]any{"sort", "l", "get", "store", "store", "d"}, []string{"d"}, false},
		{[]any{"sort", "l", "by", "w_*", "limit", 0, 5, "alpha", "store", "d"}, []string{"d"}, false},
		{[]any{"pfcount", "hll"}, []string{"hll"}, false},
		{[]any{"blmove", "a", "b", "left", "right", 0}, []string{"a", "b"}, false},
		{[]any{"bzmpop", 0, 2, "z1", "z2", "min"}, []string{"z1", "z2"}, false},
		{[]any{"sinterstore", "d", "s1", "s2"}, []string{"d"}, false},
		{[]any{"geosearchstore", "d", "src", "frommember", "m", "byradius", 1, "km"}, []string{"d"}, false},
		{[]any{"bitop", "and", "d", "s1", "s2"}, []string{"d"}, false},
		{[]any{"pfmerge", "d", "s1"}, []string{"d"}, false},
		{[]any{"xadd", "s", "*", "f", "v"}, []string{"s"}, false},
		{[]any{"object", "encoding", "k"}, nil, false},
		{[]any{"set", "k", "v", "get"}, []string{"k"}, false},
		{[]any{"eval_ro", "return 1", 1, "k"}, nil, false},
		{[]any{"georadius", "g", 0, 0, 1, "km", "store", "dst"}, []string{"dst"}, false},
		{[]any{"xgroup", "create", "s", "g", "$"}, []string{"s"}, false},
		{[]any{"client", "setinfo", "lib-name", "x"}, nil, false},
		{[]any{"flushall"}, nil, true},
		{[]any{"swapdb", 0, 1}, nil, true},
		{[]any{"no-such-command", "k"}, nil, true},
		{[]any{"multi"}, nil, false},
	} {
		keys, all := tbl.writtenKeys(tc.args)
		if all != tc.all || !reflect.DeepEqual(keys, tc.keys) {
			t.Errorf("%v: keys %q all %v, want %q %v", tc.args, keys, all, tc.keys, tc.all)
		}
	}
}

// childMain runs the other process of a multi-process test, in mode.
func childMain(mode string) int {
	ctx := context.Background()
	addr, poolName := os.Getenv("RC_ADDR"), os.Getenv("RC_POOL")
	p, err := openPool(poolName)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer p.Close()
	rdb := NewClient(&redis.Options{Addr: addr}, Config{Store: p})
	defer rdb.Close()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := rdb.WaitTracking(wctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch mode {
	case "watch":
		n, _ := strconv.Atoi(os.Getenv("RC_N"))
		err = watchIncr(ctx, rdb, "watch:counter", n)
	case "model":
		err = modelChild(ctx, rdb)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestReviewRegressions: answers a review of the drop-in found different
// from plain go-redis, each compared with it.
func TestReviewRegressions(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	a, b := newClient(t, p, Config{}), newClient(t, p, Config{})
	direct := plain(t)
	same := func(t *testing.T, what string, got, want redis.Cmder) {
		t.Helper()
		if g, w := answer(got), answer(want); g != w {
			t.Errorf("%s: %s, plain go-redis: %s", what, g, w)
		}
	}
	t.Run("argument types", func(t *testing.T) {
		direct.Del(ctx, "rr:s")
		direct.SAdd(ctx, "rr:s", "1")
		marker(t, a, direct)
		for _, arg := range []any{uint64(1), uint64(2), uint32(2), int32(2), float32(2), true, 2.5} {
			for range 2 {
				same(t, fmt.Sprintf("SISMEMBER %T(%v)", arg, arg), a.SIsMember(ctx, "rr:s", arg), direct.SIsMember(ctx, "rr:s", arg))
			}
		}
	})
	t.Run("a flushing write is seen by the other clients of the pool", func(t *testing.T) {
		for i := range 50 {
			direct.Set(ctx, "rr:f", i, 0)
			marker(t, b, direct)
			b.Get(ctx, "rr:f")
			a.FlushDB(ctx)
			same(t, "GET after FLUSHDB", b.Get(ctx, "rr:f"), direct.Get(ctx, "rr:f"))
		}
	})
	t.Run("MULTI and EXEC one command at a time on a Conn", func(t *testing.T) {
		conn := a.Conn()
		defer conn.Close()
		for i := range 100 {
			direct.Set(ctx, "rr:m", "old", 0)
			marker(t, a, direct)
			a.Get(ctx, "rr:m")
			conn.Do(ctx, "multi")
			conn.Set(ctx, "rr:m", i, 0)
			a.Get(ctx, "rr:m") // before EXEC: the old value, rightly, and cached again
			conn.Do(ctx, "exec")
			same(t, "GET after EXEC", a.Get(ctx, "rr:m"), direct.Get(ctx, "rr:m"))
		}
	})
	t.Run("PFCOUNT rewrites its key", func(t *testing.T) {
		for i := range 100 {
			direct.Del(ctx, "rr:hll")
			direct.PFAdd(ctx, "rr:hll", "a", i)
			marker(t, a, direct)
			a.Get(ctx, "rr:hll")
			a.PFCount(ctx, "rr:hll")
			same(t, "GET after PFCOUNT", a.Get(ctx, "rr:hll"), direct.Get(ctx, "rr:hll"))
		}
	})
	t.Run("a cancelled context", func(t *testing.T) {
		direct.Set(ctx, "rr:c", "v", 0)
		marker(t, a, direct)
		a.Get(ctx, "rr:c")
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		same(t, "GET with a cancelled context", a.Get(cctx, "rr:c"), direct.Get(cctx, "rr:c"))
		cmds, err := a.Pipelined(cctx, func(p redis.Pipeliner) error { p.Get(cctx, "rr:c"); return nil })
		pcmds, perr := direct.Pipelined(cctx, func(p redis.Pipeliner) error { p.Get(cctx, "rr:c"); return nil })
		if g, w := pipelineAnswer(cmds, err), pipelineAnswer(pcmds, perr); g != w {
			t.Errorf("pipeline with a cancelled context: %s, plain go-redis: %s", g, w)
		}
	})
	t.Run("writes into another database", func(t *testing.T) {
		db1 := NewClient(&redis.Options{Addr: redisAddr, DB: 1}, Config{Store: p})
		defer db1.Close()
		direct1 := redis.NewClient(&redis.Options{Addr: redisAddr, DB: 1})
		defer direct1.Close()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := db1.WaitTracking(wctx); err != nil {
			t.Fatal(err)
		}
		conn := a.Conn()
		defer conn.Close()
		for i := range 30 {
			direct1.Set(ctx, "rr:x", "old", 0)
			direct.Set(ctx, "rr:x", i, 0)
			direct1.Set(ctx, "rr:y", "old", 0)
			marker(t, db1, direct)
			db1.Get(ctx, "rr:x")
			db1.Get(ctx, "rr:y")
			direct1.Del(ctx, "rr:x")
			marker(t, db1, direct)
			db1.Get(ctx, "rr:x") // a cached miss
			a.Move(ctx, "rr:x", 1)
			same(t, "GET in db 1 after MOVE", db1.Get(ctx, "rr:x"), direct1.Get(ctx, "rr:x"))
			conn.Select(ctx, 1)
			conn.Set(ctx, "rr:y", i, 0)
			conn.Select(ctx, 0)
			same(t, "GET in db 1 after SELECT 1, SET on a Conn", db1.Get(ctx, "rr:y"), direct1.Get(ctx, "rr:y"))
		}
	})
	t.Run("SWAPDB", func(t *testing.T) {
		direct5 := redis.NewClient(&redis.Options{Addr: redisAddr, DB: 5})
		defer direct5.Close()
		direct.Set(ctx, "rr:sw", "db0", 0)
		direct5.Set(ctx, "rr:sw", "db5", 0)
		marker(t, a, direct)
		a.Get(ctx, "rr:sw")
		a.Do(ctx, "swapdb", 0, 5) // through a drop-in: forgotten
		same(t, "GET after SWAPDB through the drop-in", a.Get(ctx, "rr:sw"), direct.Get(ctx, "rr:sw"))
		a.Get(ctx, "rr:sw")
		direct.Do(ctx, "swapdb", 0, 5) // behind its back: Redis says nothing
		if err := a.FlushNearCache(); err != nil {
			t.Fatal(err)
		}
		same(t, "GET after SWAPDB and FlushNearCache", a.Get(ctx, "rr:sw"), direct.Get(ctx, "rr:sw"))
	})
	t.Run("nested Watch", func(t *testing.T) {
		err := a.Watch(ctx, func(tx *redis.Tx) error {
			return a.Watch(ctx, func(tx2 *redis.Tx) error { return tx2.Get(ctx, "rr:n").Err() }, "rr:n")
		}, "rr:n")
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
	})
}

// TestCloseWhileDialling: Close does not wait out the tracker's dial.
func TestCloseWhileDialling(t *testing.T) {
	dialing := make(chan struct{}, 1)
	ended := make(chan error, 1) // why the first dial's context ended
	var first atomic.Bool
	rdb := NewClient(&redis.Options{Addr: redisAddr, Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !first.CompareAndSwap(false, true) {
			return nil, errors.New("only one dial")
		}
		dialing <- struct{}{}
		<-ctx.Done() // a black hole, but one that honours its context
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}, Config{Store: newPool(t)})
	<-dialing
	done := make(chan struct{})
	go func() { rdb.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatal("Close hung")
	}
	// The dial's own timeout would end it with DeadlineExceeded.
	if err := <-ended; err != context.Canceled {
		t.Fatalf("the tracker's dial ended with %v: Close waited it out instead of cancelling it", err)
	}
}

// TestHostileServer: what a broken or hostile server sends the tracking
// connection's reader, or puts in its command table, gives errors, never
// a crash.
func TestHostileServer(t *testing.T) {
	in := strings.Repeat("|0\r\n", 1<<20) + "+OK\r\n"
	if _, err := readValue(bufio.NewReader(strings.NewReader(in)), 0); err == nil {
		t.Error("a million attributes were read")
	}
	in = "*1000000\r\n" + strings.Repeat("*1000000\r\n", 3)
	if _, err := readValue(bufio.NewReader(strings.NewReader(in)), 0); err == nil {
		t.Error("nested huge aggregates were read")
	}
	spec := func(kind, idxName string, idx int64) value {
		return value{kind: '%', items: []value{
			{kind: '+', str: "begin_search"}, {kind: '%', items: []value{
				{kind: '+', str: "type"}, {kind: '+', str: kind},
				{kind: '+', str: "spec"}, {kind: '%', items: []value{{kind: '+', str: idxName}, {kind: ':', num: idx}}},
			}},
			{kind: '+', str: "find_keys"}, {kind: '%', items: []value{
				{kind: '+', str: "type"}, {kind: '+', str: "keynum"},
				{kind: '+', str: "spec"}, {kind: '%', items: []value{
					{kind: '+', str: "keynumidx"}, {kind: ':', num: -5}, {kind: '+', str: "firstkey"}, {kind: ':', num: -1}}},
			}},
		}}
	}
	cmd := value{kind: '*', items: []value{
		{kind: '$', str: "evil"}, {kind: ':', num: -2}, {kind: '~', items: []value{{kind: '+', str: "write"}}},
		{kind: ':', num: -1}, {kind: ':', num: -7}, {kind: ':', num: -3},
		{kind: '~'}, {kind: '~'}, {kind: '*', items: []value{spec("index", "index", -1), spec("index", "index", 1)}},
	}}
	tbl := parseCommandTable(value{kind: '*', items: []value{cmd}})
	for _, args := range [][]any{{"evil"}, {"evil", "a"}, {"evil", "a", "b", "c"}} {
		if _, all := tbl.writtenKeys(args); !all {
			t.Errorf("%v: a write whose keys cannot be told must flush", args)
		}
	}
}

// TestHitReadAgainKeepsNoOldAnswer: a hit decodes its entry inside the
// store's View, which calls it again when a write changed the bucket
// meanwhile. When the second look finds a cached miss, the answer is
// go-redis's for a miss (no value, redis.Nil), not the value the first
// look decoded. (Under load a reader preempted in the middle of View
// returned a refused fill's stale value with redis.Nil this way, which
// TestSharedKeysLinearizable reported as an impossible read.) The hook
// deletes the key through the drop-in, waits for its invalidation and
// reads it, caching the miss, between the first look and its validation.
func TestHitReadAgainKeepsNoOldAnswer(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	rdb := newClient(t, p, Config{})
	direct := plain(t)
	cases := []struct {
		name  string
		write func(k string) // makes the key hold what the read first finds
		read  func(c redis.Cmdable, k string) redis.Cmder
		del   func(k string) error // through the drop-in: the read then misses
	}{
		{"get",
			func(k string) { direct.Set(ctx, k, "old", 0) },
			func(c redis.Cmdable, k string) redis.Cmder { return c.Get(ctx, k) },
			func(k string) error { return rdb.Del(ctx, k).Err() }},
		{"pipelined get",
			func(k string) { direct.Set(ctx, k, "old", 0) },
			func(c redis.Cmdable, k string) redis.Cmder {
				var cmd redis.Cmder
				_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error { cmd = p.Get(ctx, k); return nil })
				return cmd
			},
			func(k string) error { return rdb.Del(ctx, k).Err() }},
		{"hget",
			func(k string) { direct.HSet(ctx, k, "f", "old") },
			func(c redis.Cmdable, k string) redis.Cmder { return c.HGet(ctx, k, "f") },
			func(k string) error { return rdb.HDel(ctx, k, "f").Err() }},
		{"zscore",
			func(k string) { direct.ZAdd(ctx, k, redis.Z{Score: 1.5, Member: "x"}) },
			func(c redis.Cmdable, k string) redis.Cmder { return c.ZScore(ctx, k, "x") },
			func(k string) error { return rdb.ZRem(ctx, k, "x").Err() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := "reread:" + strings.ReplaceAll(tc.name, " ", "-")
			direct.Del(ctx, k)
			tc.write(k)
			marker(t, rdb, direct)
			tc.read(rdb, k) // fills
			looks, changed := 0, false
			testHookDecoded = func() {
				looks++
				if changed {
					return
				}
				changed = true
				if err := tc.del(k); err != nil {
					t.Errorf("delete: %v", err)
				}
				// Its invalidation applied first, so none voids the miss
				// cached next.
				if err := rdb.Sync(ctx); err != nil {
					t.Errorf("Sync: %v", err)
				}
				if err := tc.read(rdb, k).Err(); !errors.Is(err, redis.Nil) { // caches the miss
					t.Errorf("the read after the delete: %v, want redis.Nil", err)
				}
			}
			defer func() { testHookDecoded = nil }()
			hits := rdb.Stats().Hits
			got := answer(tc.read(rdb, k))
			testHookDecoded = nil
			if want := answer(tc.read(direct, k)); got != want {
				t.Errorf("drop-in: %s, plain go-redis: %s", got, want)
			}
			// The hook's own read missed (its entry was forgotten); the
			// outer one must have hit, on its second look.
			if st := rdb.Stats(); st.Hits != hits+1 || looks < 2 {
				t.Errorf("the read was not served from the cache on a second look (%d looks, %d hits): the test no longer tests anything", looks, st.Hits-hits)
			}
		})
	}
}
