// Package cachesuite is the `ubctl bench cache` suite: cache.Store and the
// go-redis and memcached drop-ins built on it, against real redis-server
// and memcached on the same machine, with the same keys, values and load
// for every contender.
//
// Every value is 64 bytes written by bench.Fill from a seed whose high 32
// bits are the key's index, so every read checks every byte it got (a
// checksum) and that it belongs to the key it asked for, for ubkit and for
// each baseline alike.
//
// Cases:
//
//   - pool-get-64B (ns/op): one GET of a 64-byte value by a client in
//     another process than the one that filled the data: cache.Store.Get on
//     a pool the bench process filled, go-redis over TCP and over a unix
//     socket, gomemcache to memcached. One client goroutine, one GET at a
//     time, each timed; p50 and p99 come from a histogram in the client.
//   - redis-read-heavy (ops/s): 8 goroutines, 99% GET / 1% SET over 10k
//     keys, the same sequence for rediscache (near cache in a fresh pool)
//     and plain go-redis, both against one redis-server over TCP. Before
//     timing, each contender GETs every key once (the near cache's steady
//     state; for go-redis the same requests).
//   - memcached-server (ops/s): 8 gomemcache goroutines, 90% get / 10% set
//     over 10k keys, against cache/memcached serving a pool in another
//     process and against memcached.
//   - pool-multi-process (ops/s): two reader processes, one goroutine each,
//     GETs of uniformly random keys, started together; the sum of their
//     rates. Baseline: the same with go-redis over TCP, one request at a
//     time (no pipelining).
package cachesuite

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

const (
	// ValueSize is every value's size.
	ValueSize = 64
	// Keys is how many keys every case spreads its operations over.
	Keys = 10000
	// Goroutines is the client concurrency of the throughput cases that
	// drive a server.
	Goroutines = 8
	// poolBytes bounds each pool: far more than Keys entries need, so
	// nothing is evicted.
	poolBytes = 64 << 20
)

// Env holds the real servers the baselines (and the redis-read-heavy
// case) run against, started on first use and shared by every run.
type Env struct {
	mu               sync.Mutex
	redis, memcached *testenv.Server
	redisErr, mcErr  error
}

// NewEnv returns an environment that starts servers as cases need them.
// Close stops them.
func NewEnv() *Env { return &Env{} }

// Close stops the servers the environment started.
func (e *Env) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.redis != nil {
		e.redis.Close()
		e.redis = nil
	}
	if e.memcached != nil {
		e.memcached.Close()
		e.memcached = nil
	}
}

// Redis returns a redis-server holding every key with its initial value.
func (e *Env) Redis() (*testenv.Server, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.redis == nil && e.redisErr == nil {
		e.redis, e.redisErr = testenv.StartRedis()
		if e.redisErr == nil {
			e.redisErr = fillRedis(e.redis.Addr)
		}
	}
	return e.redis, e.redisErr
}

// Memcached returns a memcached holding every key with its initial value.
func (e *Env) Memcached() (*testenv.Server, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.memcached == nil && e.mcErr == nil {
		e.memcached, e.mcErr = testenv.StartMemcached()
		if e.mcErr == nil {
			e.mcErr = fillMemcached(e.memcached.Addr)
		}
	}
	return e.memcached, e.mcErr
}

// Cases returns the suite's cases; their runs use e's servers.
func (e *Env) Cases() []bench.Case {
	run := func(f func(e *Env, kind string, d time.Duration) (bench.Measurement, error), kinds ...string) []bench.Contender {
		var cs []bench.Contender
		for _, k := range kinds {
			cs = append(cs, bench.Contender{Name: k, Run: func(d time.Duration) (bench.Measurement, error) { return f(e, k, d) }})
		}
		return cs
	}
	return []bench.Case{
		{Name: "pool-get-64B", Unit: "ns/op", Better: "lower", Latency: true,
			Contenders: run(getLatency, "ubkit", "redis-tcp", "redis-unix", "memcached")},
		{Name: "redis-read-heavy", Unit: "ops/s", Better: "higher",
			Contenders: run(readHeavy, "ubkit", "go-redis")},
		{Name: "memcached-server", Unit: "ops/s", Better: "higher",
			Contenders: run(mcServer, "ubkit", "memcached")},
		{Name: "pool-multi-process", Unit: "ops/s", Better: "higher",
			Contenders: run(multiProcess, "ubkit", "redis-tcp")},
	}
}

// Keys and values.

var keyStrs, keyBytes = func() ([]string, [][]byte) {
	s, b := make([]string, Keys), make([][]byte, Keys)
	for i := range s {
		s[i] = "bench:" + strconv.Itoa(100000+i)
		b[i] = []byte(s[i])
	}
	return s, b
}()

// seedFor is the seed of key k's value, version v: the high half names
// the key, so a read can tell it got the value of the key it asked for.
func seedFor(k int, v uint32) uint64 { return uint64(k)<<32 | uint64(v) }

// fillValue writes key k's value, version v, into b (ValueSize bytes).
func fillValue(b []byte, k int, v uint32) { bench.Fill(b, seedFor(k, v)) }

var errValue = errors.New("value read does not match any value written for its key")

// check reads every byte of a value read for key k.
func check(val []byte, k int) error {
	if len(val) != ValueSize {
		return fmt.Errorf("key %d: %d bytes, want %d", k, len(val), ValueSize)
	}
	seed := binary.LittleEndian.Uint64(val)
	if int(seed>>32) != k || bench.Sum(val) != bench.FillSum(ValueSize, seed) {
		return fmt.Errorf("key %d: %w", k, errValue)
	}
	return nil
}

// rng returns the deterministic operation sequence number i of a case:
// every contender draws the same keys and operations.
func rng(caseSeed, i uint64) *rand.Rand { return rand.New(rand.NewPCG(caseSeed, i)) }

// poolName returns a fresh pool name for one run.
func poolName() string {
	return fmt.Sprintf("bench-cache-%d-%d", os.Getpid(), poolSeq.Add(1))
}

var poolSeq atomic.Uint64

// filledPool creates pool name holding every key's initial value.
func filledPool(name string) (*cache.Store, error) {
	p, err := cache.Open(name, cache.Config{MaxBytes: poolBytes})
	if err != nil {
		return nil, err
	}
	v := make([]byte, ValueSize)
	for k := range Keys {
		fillValue(v, k, 0)
		if _, err := p.Set(bg, keyBytes[k], v, cache.SetOptions{}); err != nil {
			p.Close()
			cache.Remove(name)
			return nil, err
		}
	}
	return p, nil
}

// peerArgs tell a peer process what to do.
type peerArgs struct {
	Kind     string        `json:"kind"`           // ubkit, redis-tcp, redis-unix or memcached
	Addr     string        `json:"addr,omitempty"` // pool name, host:port or socket path
	Seed     uint64        `json:"seed"`
	Duration time.Duration `json:"duration"`
}

// peerResult is what a client peer prints when it is done.
type peerResult struct {
	Ops uint64  `json:"ops"`
	NS  int64   `json:"ns"`            // measured time
	P50 float64 `json:"p50,omitempty"` // ns, latency peers
	P99 float64 `json:"p99,omitempty"`
}

func init() {
	reg := func(role string, f func(a peerArgs) error) {
		bench.RegisterPeer(role, func(raw json.RawMessage) error {
			var a peerArgs
			if err := json.Unmarshal(raw, &a); err != nil {
				return err
			}
			return f(a)
		})
	}
	reg("cache-get", getPeer)
	reg("cache-reader", readerPeer)
	reg("cache-mcserver", mcServerPeer)
}

// report prints r as the peer's last line of output, then waits to be
// killed: the harness closes a peer's output once the peer has exited,
// possibly before the parent read it.
func report(r peerResult) error {
	bench.PeerFinished()
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return err
	}
	time.Sleep(time.Hour)
	return nil
}

// readResult reads a client peer's result from out (its output).
func readResult(p *bench.Peer, out io.Reader) (peerResult, error) {
	var r peerResult
	if err := json.NewDecoder(out).Decode(&r); err != nil {
		return r, fmt.Errorf("peer result: %v (peer: %v)", err, p.Wait())
	}
	if r.Ops == 0 || r.NS <= 0 {
		return r, fmt.Errorf("peer result %+v: no operations", r)
	}
	return r, nil
}
