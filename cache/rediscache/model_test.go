package rediscache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// The differential test: random command sequences run through the
// drop-in and through plain go-redis on the same server, each answer
// compared. The drop-in works in database 0 and plain go-redis in
// database 9, so both see the same keys and every answer must be the
// same. Several workers run at once in this process and in a child
// process, all sharing one near cache pool, each on a key space of its
// own (so the answers stay deterministic); coherence across clients
// writing the same keys is TestSharedKeysLinearizable's.
//
//	RC_SEED=n   replay one seed (printed on failure)
//	RC_SEEDS=n  how many seeds (default 3), RC_OPS=n ops per worker (default 1500)

const (
	dropinDB = 0
	plainDB  = 9
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func TestDifferential(t *testing.T) {
	ctx := context.Background()
	seeds := []uint64{}
	if s := os.Getenv("RC_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, n)
	} else {
		base := uint64(time.Now().UnixNano())
		for i := range envInt("RC_SEEDS", 3) {
			seeds = append(seeds, base+uint64(i))
		}
	}
	ops := envInt("RC_OPS", 1500)
	p := newPool(t)
	direct := plain(t)
	for _, seed := range seeds {
		direct.Do(ctx, "flushall")
		const workers = 3
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			rdb := newClient(t, p, Config{})
			wg.Go(func() {
				errs[w] = runModel(ctx, rdb, fmt.Sprintf("w%d:", w), seed+uint64(w)*1000003, ops)
			})
		}
		child := testenv.Child(t, "model", "RC_ADDR="+redisAddr, "RC_POOL="+poolName(t, p),
			"RC_MSEED="+strconv.FormatUint(seed, 10), "RC_MOPS="+strconv.Itoa(ops))
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

func modelChild(ctx context.Context, rdb *Client) error {
	seed, _ := strconv.ParseUint(os.Getenv("RC_MSEED"), 10, 64)
	ops, _ := strconv.Atoi(os.Getenv("RC_MOPS"))
	return runModel(ctx, rdb, "child:", seed+7777777, ops)
}

// runModel runs ops random commands through a drop-in client (on database
// 0) and plain go-redis (on database 9), and returns the first difference.
func runModel(ctx context.Context, rdb *Client, prefix string, seed uint64, ops int) error {
	ref := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, DB: plainDB})
	defer ref.Close()
	if rdb.Options().DB != dropinDB {
		return errors.New("the drop-in must use database 0")
	}
	m := &model{r: rand.New(rand.NewPCG(seed, seed>>1|1)), prefix: prefix}
	var last []string // recent commands, printed with a difference
	for i := range ops {
		desc, run := m.next(ctx)
		got, want := run(rdb), run(ref)
		last = append(last, desc)
		if len(last) > 12 {
			last = last[1:]
		}
		if got != want {
			return fmt.Errorf("op %d, %s:\n  drop-in:        %s\n  plain go-redis: %s\n  recent ops: %s",
				i, desc, got, want, strings.Join(last, "; "))
		}
	}
	if st := rdb.Stats(); st.Hits == 0 || st.Fills == 0 {
		return fmt.Errorf("the near cache served nothing: %+v", st)
	}
	return nil
}

type model struct {
	r      *rand.Rand
	prefix string
	names  []string // the six key names, if not prefix + a letter
	reads  []op     // recent reads, replayed so that they hit the near cache
}

// op is a command built on a Cmdable (a client or a pipeline).
type op struct {
	name string
	mk   func(c redis.Cmdable) redis.Cmder
}

func (m *model) key() string {
	i := m.r.IntN(6)
	if m.names != nil {
		return m.names[i]
	}
	return m.prefix + []string{"a", "b", "c", "d", "e", "f"}[i]
}

func (m *model) val() string {
	if m.r.IntN(5) == 0 {
		return strconv.Itoa(m.r.IntN(20) - 5)
	}
	return []string{"x", "yy", "", "hello world", "42", " 7"}[m.r.IntN(6)]
}

func (m *model) field() string { return []string{"f1", "f2", "f3"}[m.r.IntN(3)] }

// readOp and writeOp make one random command.
func (m *model) readOp(ctx context.Context) op {
	k, k2 := m.key(), m.key()
	f := m.field()
	i, j := int64(m.r.IntN(6)-2), int64(m.r.IntN(6)-2)
	ops := []op{
		{"get " + k, func(c redis.Cmdable) redis.Cmder { return c.Get(ctx, k) }},
		{"get " + k, func(c redis.Cmdable) redis.Cmder { return c.Get(ctx, k) }},
		{"mget " + k + " " + k2, func(c redis.Cmdable) redis.Cmder { return c.MGet(ctx, k, k2) }},
		{"getrange " + k, func(c redis.Cmdable) redis.Cmder { return c.GetRange(ctx, k, i, j) }},
		{"strlen " + k, func(c redis.Cmdable) redis.Cmder { return c.StrLen(ctx, k) }},
		{"exists " + k, func(c redis.Cmdable) redis.Cmder { return c.Exists(ctx, k) }},
		{"hget " + k, func(c redis.Cmdable) redis.Cmder { return c.HGet(ctx, k, f) }},
		{"hmget " + k, func(c redis.Cmdable) redis.Cmder { return c.HMGet(ctx, k, f, "f2") }},
		{"hgetall " + k, func(c redis.Cmdable) redis.Cmder { return c.HGetAll(ctx, k) }},
		{"hexists " + k, func(c redis.Cmdable) redis.Cmder { return c.HExists(ctx, k, f) }},
		{"hlen " + k, func(c redis.Cmdable) redis.Cmder { return c.HLen(ctx, k) }},
		{"hkeys " + k, func(c redis.Cmdable) redis.Cmder { return c.HKeys(ctx, k) }},
		{"hvals " + k, func(c redis.Cmdable) redis.Cmder { return c.HVals(ctx, k) }},
		{"lrange " + k, func(c redis.Cmdable) redis.Cmder { return c.LRange(ctx, k, i, j) }},
		{"llen " + k, func(c redis.Cmdable) redis.Cmder { return c.LLen(ctx, k) }},
		{"lindex " + k, func(c redis.Cmdable) redis.Cmder { return c.LIndex(ctx, k, i) }},
		{"smembers " + k, func(c redis.Cmdable) redis.Cmder { return c.SMembers(ctx, k) }},
		{"sismember " + k, func(c redis.Cmdable) redis.Cmder { return c.SIsMember(ctx, k, "x") }},
		{"scard " + k, func(c redis.Cmdable) redis.Cmder { return c.SCard(ctx, k) }},
		{"zscore " + k, func(c redis.Cmdable) redis.Cmder { return c.ZScore(ctx, k, "x") }},
		{"zcard " + k, func(c redis.Cmdable) redis.Cmder { return c.ZCard(ctx, k) }},
		{"zrange " + k, func(c redis.Cmdable) redis.Cmder { return c.ZRange(ctx, k, i, j) }},
		{"type " + k, func(c redis.Cmdable) redis.Cmder { return c.Type(ctx, k) }},
	}
	return ops[m.r.IntN(len(ops))]
}

func (m *model) writeOp(ctx context.Context) op {
	k, k2 := m.key(), m.key()
	v, f := m.val(), m.field()
	n := int64(m.r.IntN(7) - 3)
	ops := []op{
		{"set " + k + " " + v, func(c redis.Cmdable) redis.Cmder { return c.Set(ctx, k, v, 0) }},
		{"set ex " + k, func(c redis.Cmdable) redis.Cmder { return c.Set(ctx, k, v, 100*time.Second) }},
		{"setnx " + k, func(c redis.Cmdable) redis.Cmder { return c.SetNX(ctx, k, v, 0) }},
		{"getset " + k, func(c redis.Cmdable) redis.Cmder { return c.GetSet(ctx, k, v) }},
		{"getdel " + k, func(c redis.Cmdable) redis.Cmder { return c.GetDel(ctx, k) }},
		{"mset " + k + " " + k2, func(c redis.Cmdable) redis.Cmder { return c.MSet(ctx, k, v, k2, "m") }},
		{"del " + k, func(c redis.Cmdable) redis.Cmder { return c.Del(ctx, k) }},
		{"incrby " + k, func(c redis.Cmdable) redis.Cmder { return c.IncrBy(ctx, k, n) }},
		{"append " + k, func(c redis.Cmdable) redis.Cmder { return c.Append(ctx, k, v) }},
		{"setrange " + k, func(c redis.Cmdable) redis.Cmder { return c.SetRange(ctx, k, 2, v) }},
		{"expire 100 " + k, func(c redis.Cmdable) redis.Cmder { return c.Expire(ctx, k, 100*time.Second) }},
		{"persist " + k, func(c redis.Cmdable) redis.Cmder { return c.Persist(ctx, k) }},
		{"pexpire 0 " + k, func(c redis.Cmdable) redis.Cmder { return c.PExpire(ctx, k, 0) }},
		{"rename " + k + " " + k2, func(c redis.Cmdable) redis.Cmder { return c.Rename(ctx, k, k2) }},
		{"hset " + k, func(c redis.Cmdable) redis.Cmder { return c.HSet(ctx, k, f, v) }},
		{"hdel " + k, func(c redis.Cmdable) redis.Cmder { return c.HDel(ctx, k, f) }},
		{"hincrby " + k, func(c redis.Cmdable) redis.Cmder { return c.HIncrBy(ctx, k, f, n) }},
		{"rpush " + k, func(c redis.Cmdable) redis.Cmder { return c.RPush(ctx, k, v) }},
		{"lpush " + k, func(c redis.Cmdable) redis.Cmder { return c.LPush(ctx, k, v, "z") }},
		{"lpop " + k, func(c redis.Cmdable) redis.Cmder { return c.LPop(ctx, k) }},
		{"lrem " + k, func(c redis.Cmdable) redis.Cmder { return c.LRem(ctx, k, n, v) }},
		{"lmove " + k + " " + k2, func(c redis.Cmdable) redis.Cmder { return c.LMove(ctx, k, k2, "LEFT", "RIGHT") }},
		{"sadd " + k, func(c redis.Cmdable) redis.Cmder { return c.SAdd(ctx, k, v, "x") }},
		{"srem " + k, func(c redis.Cmdable) redis.Cmder { return c.SRem(ctx, k, "x") }},
		{"smove " + k + " " + k2, func(c redis.Cmdable) redis.Cmder { return c.SMove(ctx, k, k2, "x") }},
		{"zadd " + k, func(c redis.Cmdable) redis.Cmder {
			return c.ZAdd(ctx, k, redis.Z{Score: float64(n), Member: "x"}, redis.Z{Score: 1.5, Member: v})
		}},
		{"zincrby " + k, func(c redis.Cmdable) redis.Cmder { return c.ZIncrBy(ctx, k, 0.5, "x") }},
		{"zrem " + k, func(c redis.Cmdable) redis.Cmder { return c.ZRem(ctx, k, "x") }},
		{"zunionstore " + k, func(c redis.Cmdable) redis.Cmder {
			return c.ZUnionStore(ctx, k, &redis.ZStore{Keys: []string{k2}})
		}},
		{"eval set " + k, func(c redis.Cmdable) redis.Cmder {
			return c.Eval(ctx, "return redis.call('SET', KEYS[1], ARGV[1])", []string{k}, v)
		}},
	}
	return ops[m.r.IntN(len(ops))]
}

func (m *model) oneOp(ctx context.Context) op {
	if m.r.IntN(10) < 6 {
		o := m.readOp(ctx)
		m.reads = append(m.reads, o)
		if len(m.reads) > 8 {
			m.reads = m.reads[1:]
		}
		return o
	}
	return m.writeOp(ctx)
}

// next returns a description and a runner giving a comparable answer.
func (m *model) next(ctx context.Context) (string, func(redis.Cmdable) string) {
	switch x := m.r.IntN(100); {
	case x < 25 && len(m.reads) > 0: // the same read again: a cache hit
		o := m.reads[m.r.IntN(len(m.reads))]
		return o.name, func(c redis.Cmdable) string { return answer(o.mk(c)) }
	case x < 35: // a pipeline
		ops := m.batch(ctx)
		return "pipeline[" + names(ops) + "]", func(c redis.Cmdable) string {
			return pipelineAnswer(c.Pipelined(ctx, queueAll(ops)))
		}
	case x < 40: // a transaction
		ops := m.batch(ctx)
		return "multi[" + names(ops) + "]", func(c redis.Cmdable) string {
			return pipelineAnswer(c.TxPipelined(ctx, queueAll(ops)))
		}
	case x < 45: // WATCH, read, write
		k := m.key()
		return "watch-incr " + k, func(c redis.Cmdable) string {
			var err error
			switch cl := c.(type) {
			case *Client:
				err = watchOnce(ctx, cl.Watch, k)
			case *redis.Client:
				err = watchOnce(ctx, cl.Watch, k)
			case *ClusterClient:
				err = watchOnce(ctx, cl.Watch, k)
			case *redis.ClusterClient:
				err = watchOnce(ctx, cl.Watch, k)
			default:
				err = fmt.Errorf("watch-incr on a %T", c)
			}
			return fmt.Sprintf("err=%v", err)
		}
	}
	o := m.oneOp(ctx)
	return o.name, func(c redis.Cmdable) string { return answer(o.mk(c)) }
}

// batch is 1 to 5 commands: sometimes reads only (served in part from the
// cache), sometimes mixed.
func (m *model) batch(ctx context.Context) []op {
	readOnly := m.r.IntN(2) == 0
	var ops []op
	for range 1 + m.r.IntN(5) {
		if readOnly {
			ops = append(ops, m.readOp(ctx))
		} else {
			ops = append(ops, m.oneOp(ctx))
		}
	}
	return ops
}

// queueAll queues ops on a pipeline.
func queueAll(ops []op) func(redis.Pipeliner) error {
	return func(p redis.Pipeliner) error {
		for _, o := range ops {
			o.mk(p)
		}
		return nil
	}
}

func names(ops []op) string {
	s := make([]string, len(ops))
	for i, o := range ops {
		s[i] = o.name
	}
	return strings.Join(s, ", ")
}

func pipelineAnswer(cmds []redis.Cmder, err error) string {
	var b strings.Builder
	fmt.Fprintf(&b, "err=%v", err)
	for _, c := range cmds {
		b.WriteString(" | " + answer(c))
	}
	return b.String()
}

// watchOnce is one optimistic increment: WATCH, GET, MULTI SET EXEC.
func watchOnce(ctx context.Context, watch func(context.Context, func(*redis.Tx) error, ...string) error, k string) error {
	return watch(ctx, func(tx *redis.Tx) error {
		v, err := tx.Get(ctx, k).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, k, v+"+", 0)
			return nil
		})
		return err
	}, k)
}

// TestSharedKeysLinearizable: several clients read and write the same
// keys at once: two drop-ins sharing one pool (two trackers, as two
// processes of one host would have) and a plain go-redis client standing
// for another host. Every read is checked against the history: it must
// return a value that could have been current at some instant between the
// read's start and end, where a write by another host counts only once it
// is MaxStaleness old (the documented bound) and a write through the
// drop-ins of this host counts as soon as it returns.
func TestSharedKeysLinearizable(t *testing.T) {
	ctx := context.Background()
	const maxStale = 100 * time.Millisecond
	p := newPool(t)
	a := newClient(t, p, Config{Prefixes: []string{"lin:", "marker:"}, MaxStaleness: maxStale})
	b := newClient(t, p, Config{Prefixes: []string{"lin:", "marker:"}, MaxStaleness: maxStale})
	remote := plain(t)
	const keys = 3
	for k := range keys {
		remote.Del(ctx, "lin:"+strconv.Itoa(k))
	}
	marker(t, a, remote)
	marker(t, b, remote)
	base := time.Now()
	seed := uint64(time.Now().UnixNano())
	type event struct {
		write, remote bool
		key           int
		val           string // "" for absent (a DEL or a miss)
		start, end    time.Duration
	}
	var mu sync.Mutex
	var history []event
	var failures []string
	paced := make(chan struct{})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	run := func(id int, c redis.Cmdable, isRemote bool) {
		r := rand.New(rand.NewPCG(seed, uint64(id)))
		for i := 0; time.Since(base) < 1500*time.Millisecond; i++ {
			k := r.IntN(keys)
			key := "lin:" + strconv.Itoa(k)
			ev := event{key: k, remote: isRemote, start: time.Since(base)}
			var err error
			x := r.IntN(100)
			switch {
			case isRemote || x < 20:
				ev.write = true
				if r.IntN(5) == 0 {
					err = c.Del(ctx, key).Err()
				} else {
					ev.val = fmt.Sprintf("c%d-%d", id, i)
					err = c.Set(ctx, key, ev.val, 0).Err()
				}
			case x < 30:
				cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, key); return nil })
				ev.val, err = cmds[0].(*redis.StringCmd).Result()
			default:
				ev.val, err = c.Get(ctx, key).Result()
			}
			ev.end = time.Since(base)
			if errors.Is(err, redis.Nil) && ev.val != "" {
				// go-redis gives a miss no value; the history would
				// take it for one.
				err = fmt.Errorf("a miss (redis.Nil) with the value %q", ev.val)
			}
			if err != nil && !errors.Is(err, redis.Nil) {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("client %d: %v", id, err))
				mu.Unlock()
				return
			}
			mu.Lock()
			history = append(history, ev)
			mu.Unlock()
			if isRemote {
				// Another host writes now and then: once per few
				// operations of the drop-ins.
				select {
				case <-paced:
				case <-stop:
					return
				}
			} else if i%8 == 0 {
				select {
				case paced <- struct{}{}:
				default:
				}
			}
		}
	}
	var local sync.WaitGroup
	for id, c := range []redis.Cmdable{a, a, b, b} {
		local.Go(func() { run(id, c, false) })
	}
	wg.Go(func() { run(9, remote, true) })
	local.Wait()
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("commands failed: %v", failures)
	}
	// Per key: writes by start (the initial absence first); for each, the
	// earliest moment a write begun after it ended became visible to every
	// read (after it, the write cannot be current any more).
	type candidate struct {
		start, until time.Duration
	}
	never := time.Duration(1 << 62)
	byVal := make([]map[string][]candidate, keys)
	for k := range keys {
		ws := []event{{write: true, key: k, start: -time.Hour, end: -time.Hour}}
		for _, e := range history {
			if e.write && e.key == k {
				ws = append(ws, e)
			}
		}
		slices.SortFunc(ws, func(x, y event) int { return cmp.Compare(x.start, y.start) })
		sufMin := make([]time.Duration, len(ws)+1)
		sufMin[len(ws)] = never
		for i := len(ws) - 1; i >= 0; i-- {
			v := ws[i].end
			if ws[i].remote {
				v += maxStale
			}
			sufMin[i] = min(sufMin[i+1], v)
		}
		byVal[k] = map[string][]candidate{}
		for _, w := range ws {
			j, _ := slices.BinarySearchFunc(ws, w.end, func(x event, end time.Duration) int {
				if x.start > end {
					return 1
				}
				return -1
			})
			byVal[k][w.val] = append(byVal[k][w.val], candidate{w.start, sufMin[j]})
		}
	}
	reads, bad := 0, 0
	for _, rd := range history {
		if rd.write {
			continue
		}
		reads++
		ok := false
		for _, c := range byVal[rd.key][rd.val] {
			if c.start <= rd.end && c.until >= rd.start {
				ok = true
				break
			}
		}
		if !ok {
			if bad++; bad <= 5 {
				var near []string
				for _, e := range history {
					if e.write && e.key == rd.key && e.end > rd.start-maxStale-5*time.Millisecond && e.start < rd.end+time.Millisecond {
						near = append(near, fmt.Sprintf("%q [%v, %v] remote=%v", e.val, e.start, e.end, e.remote))
					}
				}
				t.Errorf("seed %d: a read of lin:%d during [%v, %v] returned %q, which no write could have left there then; writes around it:\n  %s",
					seed, rd.key, rd.start, rd.end, rd.val, strings.Join(near, "\n  "))
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d reads impossible", bad, reads)
	}
	st := a.Stats()
	if st.Hits == 0 || st.Fills == 0 {
		t.Errorf("the near cache was not exercised: %+v", st)
	}
	t.Logf("%d events, %d reads; client a: %+v", len(history), reads, st)
}
