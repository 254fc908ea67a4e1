package rediscache

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// The cluster tests share one Redis Cluster of three masters, started by
// the first of them (TestMain stops it). TestClusterResharding moves
// slots around: the others find keys' masters by asking, never assume.

var (
	clusterOnce sync.Once
	clusterEnv  *testenv.RedisCluster
	clusterErr  error
)

func redisCluster(t testing.TB) *testenv.RedisCluster {
	t.Helper()
	if _, err := StartTestCluster(); err != nil {
		t.Fatal(err)
	}
	return clusterEnv
}

func stopCluster() {
	if clusterEnv != nil {
		clusterEnv.Close()
	}
}

func newClusterClient(t testing.TB, addrs []string, cfg Config) *ClusterClient {
	t.Helper()
	return newClusterClientOpt(t, &redis.ClusterOptions{Addrs: addrs}, cfg)
}

func newClusterClientOpt(t testing.TB, opt *redis.ClusterOptions, cfg Config) *ClusterClient {
	t.Helper()
	c := NewClusterClient(opt, cfg)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitTracking(ctx); err != nil {
		t.Fatalf("WaitTracking: %v (%+v)", err, c.Stats())
	}
	return c
}

func plainCluster(t testing.TB, addrs []string) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}

func syncCluster(t testing.TB, c *ClusterClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Sync(ctx); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// keysByMaster finds n keys starting with prefix on each master (as the
// cluster has them now), by master address.
func keysByMaster(t *testing.T, direct *redis.ClusterClient, prefix string, n int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	byMaster := map[string][]string{}
	for i := 0; ; i++ {
		k := prefix + strconv.Itoa(i)
		m, err := direct.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		addr := m.Options().Addr
		if len(byMaster[addr]) < n {
			byMaster[addr] = append(byMaster[addr], k)
		}
		if done := len(byMaster) == 3; done {
			for _, ks := range byMaster {
				done = done && len(ks) == n
			}
			if done {
				return byMaster
			}
		}
		if i > 10000 {
			t.Fatalf("no %d keys on each of three masters: %v", n, byMaster)
		}
	}
}

// TestKeySlot: keySlot agrees with the server's CLUSTER KEYSLOT, hash tags
// included.
func TestKeySlot(t *testing.T) {
	ctx := context.Background()
	node := redis.NewClient(&redis.Options{Addr: redisCluster(t).Addrs[0]})
	defer node.Close()
	keys := []string{"", "{", "}", "{}", "{}a", "a{}b", "a{b}c", "{a}{b}", "foo{}{bar}", "{user1000}.following",
		"{user1000}.followers", "a{b", "a}b{c}", "{{a}}", "\x00\xff{\x80}", "héllo", strings.Repeat("k", 300)}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, r.IntN(20))
		for i := range b {
			b[i] = "ab{}c\x00\xfe"[r.IntN(7)]
		}
		keys = append(keys, string(b))
	}
	cmds, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.ClusterKeySlot(ctx, k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds {
		if want := c.(*redis.IntCmd).Val(); int64(keySlot(keys[i])) != want {
			t.Errorf("keySlot(%q) = %d, Redis says %d", keys[i], keySlot(keys[i]), want)
		}
	}
}

// TestParseMyself: the node's own line of CLUSTER NODES gives the slots
// it serves; anything else a broken server sends is an error.
func TestParseMyself(t *testing.T) {
	const id1, id2 = "622fc67d58b476bb43f85e43c683e4537dc370d8", "90b03ff2cdc8bff90fa5e9feddccf35e5994d68e"
	line := func(flags, slots string) string {
		return id1 + " 127.0.0.1:7001@17001 " + flags + " - 0 1796136787000 1 connected " + slots + "\n"
	}
	other := id2 + " 127.0.0.1:7002@17002 master - 0 1796136787405 2 connected 5461-10922\n"
	for _, tc := range []struct {
		name, text string
		slots      []int // some that must be in
		notSlots   []int // some that must not
		count      int
	}{
		{"master", other + line("myself,master", "0-5460"), []int{0, 5460}, []int{5461}, 5461},
		{"single slots and ranges", line("myself,master", "1 3-4 16383"), []int{1, 3, 4, 16383}, []int{0, 2, 5}, 4},
		{"migrating away", line("myself,master", "0-5460 [100->-"+id2+"]"), []int{99, 101}, []int{100}, 5460},
		{"importing", line("myself,master", "0-5460 [6000-<-"+id2+"]"), nil, []int{6000}, 5461},
		{"no slots", line("myself,master", ""), nil, []int{0}, 0},
		{"replica", line("myself,slave", "0-5460"), nil, []int{0}, 0},
	} {
		desc, set, err := parseMyself(tc.text)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for _, s := range tc.slots {
			if !set.has(s) {
				t.Errorf("%s: slot %d missing", tc.name, s)
			}
		}
		for _, s := range tc.notSlots {
			if set.has(s) {
				t.Errorf("%s: slot %d served", tc.name, s)
			}
		}
		if set.count() != tc.count {
			t.Errorf("%s: %d slots, want %d", tc.name, set.count(), tc.count)
		}
		if strings.Contains(desc, "1796136787000") {
			t.Errorf("%s: desc %q keeps the pong time, which changes on its own", tc.name, desc)
		}
	}
	for _, bad := range []string{
		"", other, line("myself,master", "0-16384"), line("myself,master", "10-5"), line("myself,master", "-1"),
		line("myself,master", "x"), line("myself,master", "[5]"), line("myself,master", "[99999->-"+id2+"]"),
	} {
		if _, _, err := parseMyself(bad); !errors.Is(err, errProtocol) {
			t.Errorf("%q: %v, want a protocol error", bad, err)
		}
	}
}

// FuzzClusterNodes: whatever the server sends as CLUSTER NODES, the
// parser returns an error or a set, never a panic.
func FuzzClusterNodes(f *testing.F) {
	f.Add("x 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-5460 [7->-y]\n")
	f.Add("x a myself,master - 0 0 1 connected 5 [6-<-y] 16383\nz b master - 0 0 1 connected 1-2\n")
	f.Fuzz(func(t *testing.T, text string) {
		if _, set, err := parseMyself(text); err == nil && set == nil {
			t.Fatal("no error and no set")
		}
	})
}

// TestClusterBasic: GET, SET, DEL and the other cached reads through the
// drop-in answer as plain go-redis's ClusterClient does on the same keys,
// on every master, served from the near cache when nothing changed, and
// a write by another client is read back once synced.
func TestClusterBasic(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t).Addrs
	rdb := newClusterClient(t, addrs, Config{Store: newPool(t), MaxStaleness: 10 * time.Second})
	direct := plainCluster(t, addrs)
	same := func(what string, got, want redis.Cmder) {
		t.Helper()
		if g, w := answer(got), answer(want); g != w {
			t.Errorf("%s: %s, plain go-redis: %s", what, g, w)
		}
	}
	hit := func(what string, read func() redis.Cmder, want redis.Cmder) {
		t.Helper()
		before := rdb.Stats().Hits
		same(what, read(), want)
		if rdb.Stats().Hits != before+1 {
			t.Errorf("%s: not served from the near cache (%+v)", what, rdb.Stats())
		}
	}
	st := rdb.Stats()
	slots := 0
	for _, n := range st.Nodes {
		slots += n.Slots
		if !n.Tracking || n.Slots == 0 {
			t.Errorf("node %+v: no tracking or no slots", n)
		}
	}
	if len(st.Nodes) != 3 || slots != numSlots || !st.Tracking {
		t.Fatalf("nodes %+v: want three masters serving %d slots between them", st.Nodes, numSlots)
	}
	for addr, keys := range keysByMaster(t, direct, "basic:", 2) {
		k, k2 := keys[0], keys[1]
		direct.Del(ctx, k, k2)
		syncCluster(t, rdb)
		same(addr+" GET of a missing key", rdb.Get(ctx, k), direct.Get(ctx, k))
		hit(addr+" GET of a missing key again", func() redis.Cmder { return rdb.Get(ctx, k) }, direct.Get(ctx, k))
		same(addr+" SET", rdb.Set(ctx, k, "v1", 0), redis.NewStatusResult("OK", nil))
		same(addr+" GET after SET", rdb.Get(ctx, k), direct.Get(ctx, k))
		// The SET's own invalidation, still on its way, rightly voids
		// what the read stored: let it land, and read again.
		syncCluster(t, rdb)
		same(addr+" GET after SET, synced", rdb.Get(ctx, k), direct.Get(ctx, k))
		hit(addr+" GET again", func() redis.Cmder { return rdb.Get(ctx, k) }, direct.Get(ctx, k))
		same(addr+" EXISTS", rdb.Exists(ctx, k), direct.Exists(ctx, k))
		hit(addr+" EXISTS again", func() redis.Cmder { return rdb.Exists(ctx, k) }, direct.Exists(ctx, k))
		same(addr+" DEL", rdb.Del(ctx, k), redis.NewIntResult(1, nil))
		same(addr+" GET after DEL", rdb.Get(ctx, k), direct.Get(ctx, k))
		same(addr+" EXISTS after DEL", rdb.Exists(ctx, k), direct.Exists(ctx, k))
		direct.HSet(ctx, k2, "f", "1", "g", "2")
		syncCluster(t, rdb)
		same(addr+" HGETALL", rdb.HGetAll(ctx, k2), direct.HGetAll(ctx, k2))
		hit(addr+" HGETALL again", func() redis.Cmder { return rdb.HGetAll(ctx, k2) }, direct.HGetAll(ctx, k2))
		direct.HSet(ctx, k2, "f", "changed")
		syncCluster(t, rdb)
		same(addr+" HGET after a write by another client", rdb.HGet(ctx, k2, "f"), direct.HGet(ctx, k2, "f"))
		direct.Set(ctx, k, "v2", 0)
		syncCluster(t, rdb)
		same(addr+" GET after a write by another client", rdb.Get(ctx, k), direct.Get(ctx, k))
	}
	// MGET within one slot, and across slots (Redis 7.0 refuses it:
	// CROSSSLOT, for both).
	direct.Set(ctx, "basic:{m}a", "1", 0)
	direct.Set(ctx, "basic:x", "2", 0)
	syncCluster(t, rdb)
	for range 2 {
		same("MGET across slots", rdb.MGet(ctx, "basic:{m}a", "basic:x", "basic:none"), direct.MGet(ctx, "basic:{m}a", "basic:x", "basic:none"))
		same("MGET in one slot", rdb.MGet(ctx, "basic:{m}a", "basic:{m}b"), direct.MGet(ctx, "basic:{m}a", "basic:{m}b"))
	}
	// A pipeline of reads across masters, served in part from the cache.
	var keys []string
	for _, ks := range keysByMaster(t, direct, "basic:p", 1) {
		keys = append(keys, ks...)
	}
	direct.Set(ctx, keys[0], "p0", 0)
	syncCluster(t, rdb)
	rdb.Get(ctx, keys[0])
	pipe := func(c redis.Cmdable) string {
		return pipelineAnswer(c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Get(ctx, k)
			}
			p.Exists(ctx, keys[0])
			return nil
		}))
	}
	for round := range 3 {
		if got, want := pipe(rdb), pipe(direct); got != want {
			t.Errorf("pipeline round %d: %s, plain go-redis: %s", round, got, want)
		}
	}
	if st := rdb.Stats(); st.Hits == 0 || st.Fills == 0 || st.Forgotten == 0 {
		t.Errorf("the near cache was not exercised: %+v", st)
	}
}

// TestClusterDifferential is TestDifferential against the cluster: random
// command sequences through the drop-in and through plain go-redis, on
// keys of their own that hash to the same slots (a key's hash tag is the
// same on both sides, so cross-slot errors match too), from three workers
// and a child process sharing one pool. Now and then a write goes through
// a third client, plain go-redis, to both sides' keys, bypassing the
// near cache; the worker then syncs (Sync) and goes on, so every answer
// must still be the same.
//
//	RC_SEED=n   replay one seed (printed on failure)
//	RC_SEEDS=n  how many seeds (default 2), RC_OPS=n ops per worker (default 800)
func TestClusterDifferential(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t).Addrs
	var seeds []uint64
	if s := os.Getenv("RC_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, n)
	} else {
		base := uint64(time.Now().UnixNano())
		for i := range envInt("RC_SEEDS", 2) {
			seeds = append(seeds, base+uint64(i))
		}
	}
	ops := envInt("RC_OPS", 800)
	p := newPool(t)
	for _, seed := range seeds {
		const workers = 3
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			rdb := newClusterClient(t, addrs, Config{Store: p})
			wg.Go(func() {
				errs[w] = runClusterModel(ctx, rdb, fmt.Sprintf("w%d", w), seed+uint64(w)*1000003, ops)
			})
		}
		child := testenv.Child(t, "clustermodel", "RC_CLUSTER="+strings.Join(addrs, ","),
			"RC_POOL="+poolName(t, p), "RC_MSEED="+strconv.FormatUint(seed, 10), "RC_MOPS="+strconv.Itoa(ops))
		out := &strings.Builder{}
		child.Stderr = out
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := child.Wait(); err != nil {
			t.Errorf("seed %d (replay with RC_SEED=%d): the child process: %v\n%s", seed, seed, err, out)
		}
		for w, err := range errs {
			if err != nil {
				t.Errorf("seed %d (replay with RC_SEED=%d), worker %d: %v", seed, seed, w, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// clusterChildMain runs the child process of TestClusterDifferential.
func clusterChildMain() {
	ctx := context.Background()
	p, err := openPool(os.Getenv("RC_POOL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer p.Close()
	rdb := NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(os.Getenv("RC_CLUSTER"), ",")}, Config{Store: p})
	defer rdb.Close()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.WaitTracking(wctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	seed, _ := strconv.ParseUint(os.Getenv("RC_MSEED"), 10, 64)
	ops, _ := strconv.Atoi(os.Getenv("RC_MOPS"))
	if err := runClusterModel(ctx, rdb, "child", seed+7777777, ops); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runClusterModel runs ops random commands through the drop-in and plain
// go-redis, two models in lockstep (one seed) on their own key names,
// and returns the first difference.
func runClusterModel(ctx context.Context, rdb *ClusterClient, worker string, seed uint64, ops int) error {
	addrs := rdb.Options().Addrs
	ref := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer ref.Close()
	bypass := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer bypass.Close()
	// Six keys in three hash tags: pairs in one slot, others across slots.
	names := func(side string) []string {
		var ks []string
		for i, letter := range []string{"a", "b", "c", "d", "e", "f"} {
			ks = append(ks, fmt.Sprintf("{%s:%d}%s:%s", worker, i/2, letter, side))
		}
		return ks
	}
	dropinKeys, plainKeys := names("d"), names("p")
	for _, k := range append(dropinKeys, plainKeys...) {
		if err := ref.Del(ctx, k).Err(); err != nil {
			return fmt.Errorf("clear %s: %w", k, err)
		}
	}
	if err := rdb.Sync(ctx); err != nil {
		return err
	}
	newModel := func(keys []string) *model {
		return &model{r: rand.New(rand.NewPCG(seed, seed>>1|1)), names: keys}
	}
	md, mp := newModel(dropinKeys), newModel(plainKeys)
	pick := rand.New(rand.NewPCG(seed^0x5bd1e995, 7))
	var last []string
	for i := range ops {
		var desc, got, want string
		if pick.IntN(100) < 8 {
			od, opl := md.writeOp(ctx), mp.writeOp(ctx)
			desc = "bypass " + od.name
			if a, b := answer(od.mk(bypass)), answer(opl.mk(bypass)); a != b {
				return fmt.Errorf("op %d, %s: plain go-redis answers the two sides differently: %s, %s", i, desc, a, b)
			}
			if err := rdb.Sync(ctx); err != nil {
				return fmt.Errorf("op %d: Sync: %w", i, err)
			}
		} else {
			var rd, rp func(redis.Cmdable) string
			desc, rd = md.next(ctx)
			_, rp = mp.next(ctx)
			got, want = rd(rdb), rp(ref)
		}
		last = append(last, desc)
		if len(last) > 12 {
			last = last[1:]
		}
		if got != want {
			return fmt.Errorf("op %d, %s:\n  drop-in:        %s\n  plain go-redis: %s\n  recent ops: %s",
				i, desc, strings.ReplaceAll(got, ":d", ":?"), strings.ReplaceAll(want, ":p", ":?"), strings.Join(last, "; "))
		}
	}
	if st := rdb.Stats(); st.Hits == 0 || st.Fills == 0 {
		return fmt.Errorf("the near cache served nothing: %+v", st)
	}
	return nil
}

// TestClusterTrackingLost: killing one master's tracking connection (CLIENT
// KILL) flushes the entries filled from that master, and only those: once
// it is back, that master's keys are read from Redis again while the
// other masters' are still served from the near cache.
func TestClusterTrackingLost(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t).Addrs
	// A long MaxStaleness: a hit below must not depend on how soon the
	// loaded machine runs the tracker's next PING.
	rdb := newClusterClient(t, addrs, Config{Store: newPool(t), MaxStaleness: 10 * time.Second})
	direct := plainCluster(t, addrs)
	byMaster := keysByMaster(t, direct, "lost:", 1)
	for _, keys := range byMaster {
		direct.Set(ctx, keys[0], "before", 0)
	}
	syncCluster(t, rdb)
	for _, keys := range byMaster {
		rdb.Get(ctx, keys[0])
	}
	victim := addrs[1]
	nodeStats := func(addr string) NodeStats {
		for _, n := range rdb.Stats().Nodes {
			if n.Addr == addr {
				return n
			}
		}
		t.Fatalf("no node %s in %+v", addr, rdb.Stats().Nodes)
		return NodeStats{}
	}
	flushes := nodeStats(victim).Flushes
	otherFlushes := rdb.Stats().Flushes - flushes
	victimClient := redis.NewClient(&redis.Options{Addr: victim})
	defer victimClient.Close()
	if killTracking(t, victimClient) == 0 {
		t.Fatal("no tracking connection to kill on " + victim)
	}
	// The victim's key changes meanwhile; its invalidation may be lost.
	direct.Set(ctx, byMaster[victim][0], "after", 0)
	eventually(t, "the victim's tracking is lost and back", func() bool {
		return nodeStats(victim).Flushes >= flushes+2 && nodeStats(victim).Tracking
	})
	syncCluster(t, rdb)
	st := rdb.Stats()
	for addr, keys := range byMaster {
		v, err := rdb.Get(ctx, keys[0]).Result()
		want := "before"
		if addr == victim {
			want = "after"
		}
		if err != nil || v != want {
			t.Errorf("%s (on %s): %q %v, want %q", keys[0], addr, v, err, want)
		}
	}
	after := rdb.Stats()
	if after.Hits-st.Hits != 2 || after.Misses-st.Misses != 1 {
		t.Errorf("after the victim's flush: %d hits and %d misses, want the two other masters' keys hit and the victim's missed",
			after.Hits-st.Hits, after.Misses-st.Misses)
	}
	if after.Flushes-nodeStats(victim).Flushes != otherFlushes {
		t.Errorf("other masters flushed too: %+v", after.Nodes)
	}
}

// killTracking kills the near cache's tracking connections on one server
// and says how many there were.
func killTracking(t *testing.T, c *redis.Client) int {
	t.Helper()
	ctx := context.Background()
	list, err := c.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	sc := bufio.NewScanner(strings.NewReader(list))
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "name="+trackingName) {
			continue
		}
		var id int64
		if _, err := fmt.Sscanf(line, "id=%d", &id); err != nil {
			t.Fatalf("CLIENT LIST line %q: %v", line, err)
		}
		if c.ClientKillByFilter(ctx, "ID", strconv.FormatInt(id, 10)).Err() == nil {
			killed++
		}
	}
	return killed
}

// TestClusterWatchNoLostUpdates: WATCH/GET/MULTI/SET/EXEC increments from
// two goroutines through the cluster drop-in lose nothing, though the key
// is in the near cache (a Watch transaction reads from Redis).
func TestClusterWatchNoLostUpdates(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t).Addrs
	rdb := newClusterClient(t, addrs, Config{Store: newPool(t)})
	direct := plainCluster(t, addrs)
	const key, n = "cwatch:counter", 300
	direct.Set(ctx, key, 0, 0)
	syncCluster(t, rdb)
	rdb.Get(ctx, key)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			for range n {
				for {
					err := rdb.Watch(ctx, func(tx *redis.Tx) error {
						v, err := tx.Get(ctx, key).Int()
						if err != nil {
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
						errs[i] = err
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := direct.Get(ctx, key).Val(); got != strconv.Itoa(2*n) {
		t.Fatalf("%s after %d increments", got, 2*n)
	}
	if got := rdb.Get(ctx, key).Val(); got != strconv.Itoa(2*n) {
		t.Fatalf("the drop-in reads %s after %d increments", got, 2*n)
	}
}

// TestNewUniversalClient: several addresses or IsClusterMode give a
// ClusterClient, one address a Client, and what is not supported an
// error.
func TestNewUniversalClient(t *testing.T) {
	addrs := redisCluster(t).Addrs
	p := newPool(t)
	for _, tc := range []struct {
		opt  *redis.UniversalOptions
		cfg  Config
		want string
	}{
		{&redis.UniversalOptions{Addrs: addrs}, Config{Store: p}, "*rediscache.ClusterClient"},
		{&redis.UniversalOptions{Addrs: addrs[:1], IsClusterMode: true}, Config{Store: p}, "*rediscache.ClusterClient"},
		{&redis.UniversalOptions{Addrs: []string{redisAddr}}, Config{Store: p}, "*rediscache.Client"},
		{&redis.UniversalOptions{Addrs: addrs, MasterName: "mymaster"}, Config{Store: p}, "error: Sentinel"},
		{&redis.UniversalOptions{Addrs: addrs}, Config{}, "error: Config.Store is required"},
		{nil, Config{Store: p}, "error: needs options"},
	} {
		c, err := NewUniversalClient(tc.opt, tc.cfg)
		got := fmt.Sprintf("%T", c)
		if err != nil {
			got = "error: " + err.Error()
		}
		matches := strings.HasPrefix(got, tc.want)
		if wantErr, isErr := strings.CutPrefix(tc.want, "error: "); isErr {
			matches = strings.HasPrefix(got, "error: ") && strings.Contains(got, wantErr)
		}
		if !matches {
			t.Errorf("%+v: %s, want %s", tc.opt, got, tc.want)
		}
		if c == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.WaitTracking(ctx); err != nil {
			t.Errorf("%s: WaitTracking: %v", got, err)
		}
		cancel()
		c.Set(context.Background(), "universal:k", "v", 0)
		if v := c.Get(context.Background(), "universal:k").Val(); v != "v" {
			t.Errorf("%s: read %q back", got, v)
		}
		c.Close()
	}
}

// TestClusterResharding moves the slots of hot keys from master to master
// (CLUSTER SETSLOT ... IMPORTING and MIGRATING, MIGRATE, SETSLOT ... NODE
// on every master, as redis-cli --cluster reshard does) while two
// drop-ins sharing a pool read them (GET, EXISTS, pipelines of GETs) and
// three writers set and delete them: one through each drop-in, and plain
// go-redis standing for another host. Some keys are absent until their
// slot has moved once, and deletes keep making absent keys, so cached
// misses filled from the old owner meet keys created on the new one,
// whose invalidation only the new owner sends. During each move the new
// owner's tracking connections are held (their bytes kept, as a stuck
// middlebox would), and every phase of the move lasts longer than
// MaxStaleness: what keeps the old owner's entries from being served then
// is their owner's CLUSTER NODES, not an invalidation. Each move also has
// two fresh keys of the moving slot, read (and cached as missing) from
// the start and created once while the slot is migrating, one by the
// plain client and one through a drop-in, so they exist on the new owner
// alone.
//
// Every key has one writer, which numbers its writes 1, 2, 3 ... (a SET
// stores the number), so each read can be checked. The promise is the
// one the single-server drop-in makes: a read that starts after a write
// through a drop-in of this host returned sees it or a later write, and
// a read that starts more than MaxStaleness after any other client's
// write returned does too.
func TestClusterResharding(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t).Addrs
	const maxStale = 100 * time.Millisecond
	gate := newTrackingGate()
	t.Cleanup(gate.releaseAll)
	cfg := Config{Store: newPool(t), Prefixes: []string{"rs:"}, MaxStaleness: maxStale}
	opt := func() *redis.ClusterOptions { return &redis.ClusterOptions{Addrs: addrs, Dialer: gate.dial} }
	a, b := newClusterClientOpt(t, opt(), cfg), newClusterClientOpt(t, opt(), cfg)
	remote := plainCluster(t, addrs)
	masters := make([]*redis.Client, len(addrs))
	ids := make([]string, len(addrs))
	index := map[string]int{}
	for i, addr := range addrs {
		masters[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer masters[i].Close()
		id, err := masters[i].ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		ids[i], index[addr] = id, i
	}
	const tags, perTag, moves = 3, 6, 4
	key := func(tag, i int) string { return fmt.Sprintf("rs:{t%d}:%d", tag, i) }
	fresh := func(move int, by string) string { return fmt.Sprintf("rs:{t%d}:fresh%d%s", move%tags, move, by) }
	keysOf := make([][]string, tags) // what the readers read
	for tag := range tags {
		for i := range perTag {
			keysOf[tag] = append(keysOf[tag], key(tag, i))
		}
	}
	for move := range moves {
		keysOf[move%tags] = append(keysOf[move%tags], fresh(move, "r"), fresh(move, "l"))
	}
	owner := make([]int, tags) // which master serves each tag's slot
	for tag := range tags {
		m, err := remote.MasterForKey(ctx, key(tag, 0))
		if err != nil {
			t.Fatal(err)
		}
		owner[tag] = index[m.Options().Addr]
		for _, k := range keysOf[tag] {
			remote.Del(ctx, k)
		}
	}
	syncCluster(t, a)
	syncCluster(t, b)

	base := time.Now()
	type event struct {
		key        string
		write, del bool
		local      bool // a write through a drop-in
		ok         bool // a write that returned without error
		exists     bool // an EXISTS read
		val        int64
		start, end time.Duration
	}
	var mu sync.Mutex
	var history []event
	record := func(e event) {
		mu.Lock()
		history = append(history, e)
		mu.Unlock()
	}
	var ops, readErrs counter
	moved := make([]chan struct{}, tags) // closed once a tag's slot has moved
	for i := range moved {
		moved[i] = make(chan struct{})
	}
	late := func(i int) bool { return i >= perTag-2 }
	paced := make(chan struct{})
	done := make(chan struct{})
	var wg sync.WaitGroup
	// Writers: key i of every tag is writer i%3's, written once for every
	// few reads.
	for w, c := range []redis.Cmdable{a, b, remote} {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(base.UnixNano()), uint64(w)))
			seq := map[string]int64{}
			for {
				select {
				case <-done:
					return
				case <-paced:
				}
				tag, i := r.IntN(tags), w+3*r.IntN(perTag/3)
				if late(i) {
					select {
					case <-moved[tag]:
					default:
						continue
					}
				}
				k := key(tag, i)
				seq[k]++
				e := event{key: k, write: true, local: w < 2, val: seq[k], del: r.IntN(5) == 0, start: time.Since(base)}
				var err error
				if e.del {
					err = c.Del(ctx, k).Err()
				} else {
					err = c.Set(ctx, k, e.val, 0).Err()
				}
				e.end, e.ok = time.Since(base), err == nil
				record(e)
				ops.add()
			}
		})
	}
	// Readers: two on each drop-in.
	for id, c := range []*ClusterClient{a, a, b, b} {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(base.UnixNano()), uint64(10+id)))
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				if n%3 == 0 {
					select {
					case paced <- struct{}{}:
					default:
					}
				}
				tag := r.IntN(tags)
				k, k2 := keysOf[tag][r.IntN(len(keysOf[tag]))], keysOf[tag][r.IntN(len(keysOf[tag]))]
				start := time.Since(base)
				var evs []event
				var err error
				switch x := r.IntN(100); {
				case x < 15:
					var n int64
					n, err = c.Exists(ctx, k).Result()
					evs = append(evs, event{key: k, exists: true, val: n})
				case x < 30:
					var cmds []redis.Cmder
					cmds, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
						p.Get(ctx, k)
						p.Get(ctx, k2)
						return nil
					})
					if errors.Is(err, redis.Nil) {
						err = nil
					}
					for i, kk := range []string{k, k2} {
						if i < len(cmds) {
							v, e := getValue(cmds[i].(*redis.StringCmd))
							err = errors.Join(err, e)
							evs = append(evs, event{key: kk, val: v})
						}
					}
				default:
					v, e := getValue(c.Get(ctx, k))
					err = e
					evs = append(evs, event{key: k, val: v})
				}
				end := time.Since(base)
				ops.add()
				if err != nil {
					readErrs.add()
					continue
				}
				for _, e := range evs {
					e.start, e.end = start, end
					record(e)
				}
			}
		})
	}
	// The resharder. Each phase of a move holds until the others have
	// run a few hundred operations in it and MaxStaleness has passed more
	// than twice: long enough for an entry that should not be served to
	// be caught.
	phase := func() {
		start, target := time.Now(), ops.load()+200
		for ops.load() < target || time.Since(start) < 5*maxStale/2 {
			time.Sleep(time.Millisecond)
		}
	}
	do := func(m int, args ...any) {
		if err := masters[m].Do(ctx, args...).Err(); err != nil {
			t.Errorf("%v on %s: %v", args, addrs[m], err)
		}
	}
	for move := range moves {
		tag := move % tags
		src, dst := owner[tag], (owner[tag]+1)%len(masters)
		slot := keySlot(fmt.Sprintf("t%d", tag))
		phase()
		gate.hold(addrs[dst], true)
		do(dst, "cluster", "setslot", slot, "importing", ids[src])
		do(src, "cluster", "setslot", slot, "migrating", ids[dst])
		phase()
		for _, c := range []struct {
			by    string
			local bool
			c     redis.Cmdable
		}{{"r", false, remote}, {"l", true, a}} {
			e := event{key: fresh(move, c.by), write: true, local: c.local, val: 1, start: time.Since(base)}
			err := c.c.Set(ctx, e.key, 1, 0).Err()
			e.end, e.ok = time.Since(base), err == nil
			if err != nil {
				t.Errorf("SET %s: %v", e.key, err)
			}
			record(e)
		}
		phase()
		host, port, _ := strings.Cut(addrs[dst], ":")
		for {
			ks, err := masters[src].ClusterGetKeysInSlot(ctx, slot, 100).Result()
			if err != nil {
				t.Errorf("CLUSTER GETKEYSINSLOT %d on %s: %v", slot, addrs[src], err)
			}
			if len(ks) == 0 {
				break
			}
			args := []any{"migrate", host, port, "", 0, 5000, "keys"}
			for _, k := range ks {
				args = append(args, k)
			}
			do(src, args...)
		}
		phase()
		for _, m := range []int{dst, src, 3 - src - dst} {
			do(m, "cluster", "setslot", slot, "node", ids[dst])
		}
		owner[tag] = dst
		if move < tags {
			close(moved[tag])
		}
		phase()
		gate.hold(addrs[dst], false)
	}
	phase()
	close(done)
	wg.Wait()

	// The check: what each read may return. A key's writes are in the
	// order of their numbers (one writer each, one write at a time), so
	// write n is writes[key][n-1], and its start and end grow with n.
	writes := map[string][]event{}
	for _, e := range history {
		if e.write {
			writes[e.key] = append(writes[e.key], e)
		}
	}
	dels := map[string][]int{} // dels[key][i]: deletes among the first i writes
	for k, ws := range writes {
		d := make([]int, len(ws)+1)
		for i, w := range ws {
			if w.val != int64(i+1) {
				t.Fatalf("%s: write %d numbered %d", k, i+1, w.val)
			}
			d[i+1] = d[i]
			if w.del {
				d[i+1]++
			}
		}
		dels[k] = d
	}
	reads, bad := 0, 0
	for _, rd := range history {
		if rd.write {
			continue
		}
		reads++
		ws := writes[rd.key]
		// least: the latest write the read must see; begun: how many
		// writes began before it ended. It may return the state a write
		// numbered least to begun made (absence also when least is 0).
		visibleBy := func(w event) time.Duration {
			if w.local {
				return w.end
			}
			return w.end + maxStale
		}
		least := int64(sort.Search(len(ws), func(i int) bool { return visibleBy(ws[i]) >= rd.start }))
		for least > 0 && !ws[least-1].ok {
			least--
		}
		begun := int64(sort.Search(len(ws), func(i int) bool { return ws[i].start >= rd.end }))
		from := max(least, 1)
		delsIn := int64(dels[rd.key][begun] - dels[rd.key][min(from-1, begun)])
		var allowed bool
		switch {
		case rd.val == 0: // absent
			allowed = least == 0 || delsIn > 0
		case rd.exists:
			allowed = begun-from+1-delsIn > 0
		default:
			allowed = rd.val >= from && rd.val <= begun && !ws[rd.val-1].del
		}
		if !allowed {
			if bad++; bad <= 5 {
				var near []string
				for _, w := range ws {
					if w.end > rd.start-maxStale-10*time.Millisecond && w.start < rd.end+time.Millisecond {
						near = append(near, fmt.Sprintf("%d del=%v [%v, %v] local=%v ok=%v", w.val, w.del, w.start, w.end, w.local, w.ok))
					}
				}
				t.Errorf("a read (exists=%v) of %s during [%v, %v] returned %d, where the write numbered %d must be seen; writes around it:\n  %s",
					rd.exists, rd.key, rd.start, rd.end, rd.val, least, strings.Join(near, "\n  "))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d reads stale", bad, reads)
	}
	sa, sb := a.Stats(), b.Stats()
	t.Logf("%d moves, %d reads (%d failed), %d writes; drop-in a: %+v", moves, reads, readErrs.load(), len(history)-reads, sa)
	if sa.Hits+sb.Hits == 0 {
		t.Errorf("the near cache served nothing: %+v %+v", sa, sb)
	}
	if readErrs.load() > int64(reads)/10 {
		t.Errorf("%d reads failed, of %d", readErrs.load(), reads)
	}
}

// getValue is a GET's answer as a number (a missing key is 0).
func getValue(c *redis.StringCmd) (int64, error) {
	v, err := c.Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(v, 10, 64)
}

// counter is a count shared by the test's goroutines.
type counter struct {
	mu sync.Mutex
	n  int64
}

func (c *counter) add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *counter) load() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// trackingGate dials for go-redis and can hold what the near cache's
// tracking connections to one server read: bytes that arrive stay with
// the gate until it lets them through, as a stuck middlebox would keep
// them. A connection is a tracking one once it names itself so (CLIENT
// SETNAME); others are never held.
type trackingGate struct {
	mu    sync.Mutex
	cond  *sync.Cond
	held  map[string]bool
	conns []*gatedConn
}

func newTrackingGate() *trackingGate {
	g := &trackingGate{held: map[string]bool{}}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *trackingGate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	gc := &gatedConn{Conn: c, g: g, addr: addr}
	g.mu.Lock()
	g.conns = append(g.conns, gc)
	g.mu.Unlock()
	return gc, nil
}

func (g *trackingGate) hold(addr string, on bool) {
	g.mu.Lock()
	g.held[addr] = on
	g.cond.Broadcast()
	g.mu.Unlock()
}

func (g *trackingGate) releaseAll() {
	g.mu.Lock()
	clear(g.held)
	g.cond.Broadcast()
	g.mu.Unlock()
}

type gatedConn struct {
	net.Conn
	g                *trackingGate
	addr             string
	tracking, closed atomic.Bool
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if !c.tracking.Load() && bytes.Contains(b, []byte(trackingName)) {
		c.tracking.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.tracking.Load() {
		c.g.mu.Lock()
		for c.g.held[c.addr] && !c.closed.Load() {
			c.g.cond.Wait()
		}
		c.g.mu.Unlock()
	}
	return n, err
}

func (c *gatedConn) Close() error {
	c.closed.Store(true)
	c.g.mu.Lock()
	c.g.cond.Broadcast()
	c.g.mu.Unlock()
	return c.Conn.Close()
}

// BenchmarkClusterHit is one GET served by the cluster drop-in's near
// cache (BenchmarkHit's counterpart: the key's slot is hashed and its
// owner looked up before the pool is read).
func BenchmarkClusterHit(b *testing.B) {
	ctx := context.Background()
	addrs := redisCluster(b).Addrs
	rdb := newClusterClient(b, addrs, Config{Store: newPool(b)})
	plainCluster(b, addrs).Set(ctx, "bench:hit", "0123456789012345678901234567890123456789012345678901234567890123", 0)
	syncCluster(b, rdb)
	rdb.Get(ctx, "bench:hit")
	b.ReportAllocs()
	for b.Loop() {
		if err := rdb.Get(ctx, "bench:hit").Err(); err != nil {
			b.Fatal(err)
		}
	}
	// As in BenchmarkHit: a loaded machine can delay the trackers' PINGs
	// past MaxStaleness; say how many reads hit, fail only when few did.
	st := rdb.Stats()
	b.ReportMetric(float64(st.Hits)/float64(b.N), "hits/op")
	if st.Hits < uint64(b.N)/2 {
		b.Fatalf("%d hits for %d reads: %+v", st.Hits, b.N, st)
	}
}

// TestClusterNodeClientClosed: when go-redis closes a node's client (as
// it does for a node that left the cluster's state), the near cache drops
// the node once its tracking connection ends, and does not dial it again.
func TestClusterNodeClientClosed(t *testing.T) {
	ctx := context.Background()
	addrs := redisCluster(t).Addrs
	rdb := newClusterClient(t, addrs, Config{Store: newPool(t)})
	node, err := rdb.MasterForKey(ctx, "gone:k")
	if err != nil {
		t.Fatal(err)
	}
	addr := node.Options().Addr
	node.Close() // what go-redis's clusterNodes.GC does
	server := redis.NewClient(&redis.Options{Addr: addr})
	defer server.Close()
	if killTracking(t, server) == 0 {
		t.Fatal("no tracking connection on " + addr)
	}
	eventually(t, "the node is dropped", func() bool { return len(rdb.Stats().Nodes) == len(addrs)-1 })
	for _, n := range rdb.Stats().Nodes {
		if n.Addr == addr {
			t.Fatalf("%s still tracked: %+v", addr, rdb.Stats().Nodes)
		}
	}
	if killTracking(t, server) != 0 {
		t.Errorf("the tracker dialled %s again", addr)
	}
}
