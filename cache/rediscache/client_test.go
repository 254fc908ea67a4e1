package rediscache

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

var redisAddr string

func TestMain(m *testing.M) {
	for _, mode := range []string{"watch", "model"} {
		testenv.RegisterChild(mode, func() int { return childMain(mode) })
	}
	testenv.RegisterChild("clustermodel", func() int { clusterChildMain(); return 0 })
	testenv.RunChildIfAsked()
	srv, err := testenv.StartRedis()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisAddr = srv.Addr
	testenv.Main(m, func() { srv.Close(); stopCluster() })
}

var (
	poolSeq   atomic.Int64
	poolNames sync.Map // *cache.Store → its name, for child processes
)

func newPool(t testing.TB) *cache.Store {
	name := fmt.Sprintf("rc-test-%d-%d", os.Getpid(), poolSeq.Add(1))
	p, err := cache.Open(name, cache.Config{MaxBytes: 32 << 20})
	if err != nil {
		t.Fatal(err)
	}
	poolNames.Store(p, name)
	t.Cleanup(func() {
		p.Close()
		cache.Remove(name)
	})
	return p
}

func poolName(t testing.TB, p *cache.Store) string {
	name, ok := poolNames.Load(p)
	if !ok {
		t.Fatal("a pool not made by newPool")
	}
	return name.(string)
}

// openPool attaches a child process to its parent's pool.
func openPool(name string) (*cache.Store, error) { return cache.Open(name, cache.Config{}) }

func newClient(t testing.TB, p *cache.Store, cfg Config) *Client {
	cfg.Store = p
	c := NewClient(&redis.Options{Addr: redisAddr}, cfg)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.WaitTracking(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

func plain(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { c.Close() })
	return c
}

// hangGuard bounds the waits of tests for what takes milliseconds when
// the code works: only a hang waits that long, and it fails the test.
const hangGuard = 10 * time.Second

// eventually polls f until it holds, and fails the test after hangGuard.
// Polling: what a tracker receives shows only in its stats and its cache.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for end := time.Now().Add(hangGuard); !f(); {
		if time.Now().After(end) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestHitsAndInvalidation(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	direct.Set(ctx, "hi:k", "one", 0)
	// That write's own invalidation may still be on its way: wait for it,
	// or it would (rightly) void the first fill.
	eventually(t, "the first invalidation", func() bool { return rdb.Stats().Invalidations > 0 })
	for range 3 {
		if v, err := rdb.Get(ctx, "hi:k").Result(); err != nil || v != "one" {
			t.Fatalf("get: %q %v", v, err)
		}
	}
	if st := rdb.Stats(); st.Hits < 2 || st.Fills != 1 {
		t.Fatalf("stats after three reads: %+v", st)
	}
	direct.Set(ctx, "hi:k", "two", 0)
	eventually(t, "the write reaches the near cache", func() bool { return rdb.Get(ctx, "hi:k").Val() == "two" })
	// Misses are cached too, and invalidated when the key appears.
	if err := rdb.Get(ctx, "hi:none").Err(); !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	if err := rdb.Get(ctx, "hi:none").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("cached miss: %v", err)
	}
	direct.Set(ctx, "hi:none", "here", 0)
	eventually(t, "a created key replaces a cached miss", func() bool { return rdb.Get(ctx, "hi:none").Val() == "here" })
}

// TestSameAnswersAsRedis: every cached command answers, from the cache, as
// Redis does.
func TestSameAnswersAsRedis(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	direct.Set(ctx, "s", "hello world", 0)
	direct.HSet(ctx, "h", "a", "1", "b", "2")
	direct.RPush(ctx, "l", "x", "y", "z")
	direct.SAdd(ctx, "set", "m1", "m2")
	direct.ZAdd(ctx, "z", redis.Z{Score: 1.5, Member: "p"}, redis.Z{Score: 2, Member: "q"})
	// Wait for the setup's invalidations, which would void earlier fills.
	eventually(t, "the setup's invalidations", func() bool { return rdb.Stats().Invalidations >= 5 })
	cmds := []func(redis.Cmdable) redis.Cmder{
		func(c redis.Cmdable) redis.Cmder { return c.Get(ctx, "s") },
		func(c redis.Cmdable) redis.Cmder { return c.Get(ctx, "missing") },
		func(c redis.Cmdable) redis.Cmder { return c.MGet(ctx, "s", "missing", "s") },
		func(c redis.Cmdable) redis.Cmder { return c.GetRange(ctx, "s", 0, 4) },
		func(c redis.Cmdable) redis.Cmder { return c.StrLen(ctx, "s") },
		func(c redis.Cmdable) redis.Cmder { return c.Exists(ctx, "s") },
		func(c redis.Cmdable) redis.Cmder { return c.HGet(ctx, "h", "a") },
		func(c redis.Cmdable) redis.Cmder { return c.HGet(ctx, "h", "zz") },
		func(c redis.Cmdable) redis.Cmder { return c.HMGet(ctx, "h", "a", "zz", "b") },
		func(c redis.Cmdable) redis.Cmder { return c.HGetAll(ctx, "h") },
		func(c redis.Cmdable) redis.Cmder { return c.HExists(ctx, "h", "b") },
		func(c redis.Cmdable) redis.Cmder { return c.HLen(ctx, "h") },
		func(c redis.Cmdable) redis.Cmder { return c.HKeys(ctx, "h") },
		func(c redis.Cmdable) redis.Cmder { return c.HVals(ctx, "h") },
		func(c redis.Cmdable) redis.Cmder { return c.LRange(ctx, "l", 0, -1) },
		func(c redis.Cmdable) redis.Cmder { return c.LLen(ctx, "l") },
		func(c redis.Cmdable) redis.Cmder { return c.LIndex(ctx, "l", 1) },
		func(c redis.Cmdable) redis.Cmder { return c.SMembers(ctx, "set") },
		func(c redis.Cmdable) redis.Cmder { return c.SIsMember(ctx, "set", "m2") },
		func(c redis.Cmdable) redis.Cmder { return c.SCard(ctx, "set") },
		func(c redis.Cmdable) redis.Cmder { return c.ZScore(ctx, "z", "p") },
		func(c redis.Cmdable) redis.Cmder { return c.ZScore(ctx, "z", "nobody") },
		func(c redis.Cmdable) redis.Cmder { return c.ZCard(ctx, "z") },
		func(c redis.Cmdable) redis.Cmder { return c.ZRange(ctx, "z", 0, -1) },
	}
	result := func(c redis.Cmder) string {
		v := reflect.ValueOf(c).MethodByName("Val").Call(nil)[0].Interface()
		switch s := v.(type) {
		case []string:
			if c.Name() == "smembers" || c.Name() == "hkeys" || c.Name() == "hvals" {
				s = append([]string(nil), s...)
				slicesSort(s)
				v = s
			}
		}
		return fmt.Sprintf("%#v %v", v, c.Err())
	}
	for i, mk := range cmds {
		want := result(mk(direct))
		for round := range 3 { // miss, then hits
			if got := result(mk(rdb)); got != want {
				t.Errorf("command %d round %d: %s, Redis says %s", i, round, got, want)
			}
		}
	}
	if st := rdb.Stats(); st.Hits < uint64(2*len(cmds)) {
		t.Errorf("stats %+v: the cache served too little", st)
	}
}

func slicesSort(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// TestReadRacingWrites hammers the race between reads that fill the cache
// and writes that invalidate it, with two clients (two trackers) sharing
// one pool as two processes would: once the writes stop and their
// invalidations are in, no key may read differently from Redis.
func TestReadRacingWrites(t *testing.T) {
	ctx := context.Background()
	p := newPool(t)
	a, b := newClient(t, p, Config{Prefixes: []string{"race:"}}), newClient(t, p, Config{Prefixes: []string{"race:"}})
	direct := plain(t)
	const keys = 20
	for round := range 5 {
		stop := make(chan struct{})
		var writers, wg sync.WaitGroup
		var writes atomic.Int64
		for w := range 2 {
			writers.Go(func() {
				r := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for range 2000 {
					k := "race:" + strconv.Itoa(r.IntN(keys))
					direct.Set(ctx, k, strconv.FormatInt(writes.Add(1), 10), 0)
				}
			})
		}
		for _, c := range []*Client{a, b, a, b} {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(round), 9))
				for {
					select {
					case <-stop:
						return
					default:
					}
					c.Get(ctx, "race:"+strconv.Itoa(r.IntN(keys)))
				}
			})
		}
		writers.Wait()
		close(stop)
		wg.Wait()
		// Every write's invalidation is in once each tracker has had a
		// PING answered that it sent after the writes stopped.
		for _, c := range []*Client{a, b} {
			marker(t, c, direct)
		}
		for i := range keys {
			k := "race:" + strconv.Itoa(i)
			want := direct.Get(ctx, k).Val()
			for _, c := range []*Client{a, b} {
				for range 2 {
					if got := c.Get(ctx, k).Val(); got != want {
						t.Fatalf("round %d: %s reads %q from the near cache, Redis has %q", round, k, got, want)
					}
				}
			}
		}
	}
	st := a.Stats()
	if st.Hits == 0 || st.Invalidations == 0 {
		t.Errorf("the race was not exercised: %+v", st)
	}
	t.Logf("client a: %+v", st)
}

// TestTrackingLost: killing the tracking connection flushes the near cache,
// the client reconnects, and a write made meanwhile is read back.
func TestTrackingLost(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	direct.Set(ctx, "tl:k", "before", 0)
	rdb.Get(ctx, "tl:k")
	rdb.Get(ctx, "tl:k")
	flushes := rdb.Stats().Flushes
	// Kill the tracking connection from the server side.
	list, err := direct.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	sc := bufio.NewScanner(bytes.NewBufferString(list))
	for sc.Scan() {
		var id int64
		line := sc.Text()
		if !bytes.Contains([]byte(line), []byte("name="+trackingName)) {
			continue
		}
		fmt.Sscanf(line, "id=%d", &id)
		if direct.ClientKillByFilter(ctx, "ID", strconv.FormatInt(id, 10)).Err() == nil {
			killed++
		}
	}
	if killed == 0 {
		t.Fatal("no tracking connection to kill")
	}
	direct.Set(ctx, "tl:k", "after", 0)
	eventually(t, "the near cache drops the entry", func() bool { return rdb.Get(ctx, "tl:k").Val() == "after" })
	eventually(t, "tracking comes back", func() bool { return rdb.Stats().Tracking })
	if st := rdb.Stats(); st.Flushes < flushes+2 {
		t.Errorf("flushes %d, want the loss and the return (>= %d)", st.Flushes, flushes+2)
	}
	// And it caches again.
	rdb.Get(ctx, "tl:k")
	hits := rdb.Stats().Hits
	rdb.Get(ctx, "tl:k")
	if rdb.Stats().Hits != hits+1 {
		t.Error("no hit after tracking came back")
	}
}

func TestFlushAllAndPipelines(t *testing.T) {
	ctx := context.Background()
	rdb := newClient(t, newPool(t), Config{})
	direct := plain(t)
	inv := rdb.Stats().Invalidations
	direct.Set(ctx, "fp:a", "1", 0)
	direct.Set(ctx, "fp:b", "2", 0)
	// Those writes' invalidations would (rightly) void fills made before
	// they arrive.
	eventually(t, "the setup's invalidations", func() bool { return rdb.Stats().Invalidations >= inv+2 })
	rdb.Get(ctx, "fp:a")
	// A read-only pipeline is served from the cache where it can.
	hits := rdb.Stats().Hits
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "fp:a")
		p.Get(ctx, "fp:b")
		p.Get(ctx, "fp:none")
		return nil
	})
	if !errors.Is(err, redis.Nil) || cmds[0].(*redis.StringCmd).Val() != "1" || cmds[1].(*redis.StringCmd).Val() != "2" || cmds[2].Err() != redis.Nil {
		t.Fatalf("pipeline: %v %v", cmds, err)
	}
	if rdb.Stats().Hits != hits+1 {
		t.Errorf("pipeline hits %d, want 1", rdb.Stats().Hits-hits)
	}
	// A pipeline with a write goes to Redis untouched, in order.
	cmds, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "fp:a", "3", 0)
		p.Get(ctx, "fp:a")
		return nil
	})
	if err != nil || cmds[1].(*redis.StringCmd).Val() != "3" {
		t.Fatalf("write-then-read pipeline: %v %v", cmds, err)
	}
	// A transaction too.
	_, err = rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "fp:b", "4", 0)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the transaction's write is seen", func() bool { return rdb.Get(ctx, "fp:b").Val() == "4" })
	flushes := rdb.Stats().Flushes
	direct.FlushAll(ctx)
	eventually(t, "FLUSHALL reaches the tracker", func() bool { return rdb.Stats().Flushes > flushes })
	if err := rdb.Get(ctx, "fp:b").Err(); err != redis.Nil {
		t.Fatalf("after FLUSHALL: %v", err)
	}
}

// FuzzRESP feeds the tracking connection's reader garbage: errors, never a
// panic or an allocation beyond its limits.
func FuzzRESP(f *testing.F) {
	for _, s := range []string{
		">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nkey\r\n", ">2\r\n$10\r\ninvalidate\r\n_\r\n", "+PONG\r\n",
		"%1\r\n+server\r\n+redis\r\n", "$99999999999\r\n", "*-1\r\n", "|1\r\n+a\r\n+b\r\n:1\r\n", ":x\r\n",
		"*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n*3\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(in), 4096)
		for range 100 {
			v, err := readValue(r, 0)
			if err != nil {
				return
			}
			if v.kind == '$' && int64(len(v.str)) > maxBulk {
				t.Fatal("bulk beyond the limit")
			}
		}
	})
}

// BenchmarkHit is one GET served by the near cache.
func BenchmarkHit(b *testing.B) {
	ctx := context.Background()
	rdb := newClient(b, newPool(b), Config{})
	direct := plain(b)
	direct.Set(ctx, "bench:hit", "0123456789012345678901234567890123456789012345678901234567890123", 0)
	marker(b, rdb, direct) // the write's own invalidation is in
	rdb.Get(ctx, "bench:hit")
	b.ReportAllocs()
	for b.Loop() {
		if err := rdb.Get(ctx, "bench:hit").Err(); err != nil {
			b.Fatal(err)
		}
	}
	// A loaded machine can delay the tracker's PING past MaxStaleness, and
	// those reads go to Redis: say how many did, and fail only when the
	// cache was hardly measured at all.
	st := rdb.Stats()
	b.ReportMetric(float64(st.Hits)/float64(b.N), "hits/op")
	if st.Hits < uint64(b.N)/2 {
		b.Fatalf("%d hits for %d reads: %+v", st.Hits, b.N, st)
	}
}
