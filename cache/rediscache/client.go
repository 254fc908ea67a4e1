// Package rediscache is a drop-in for github.com/redis/go-redis/v9: one
// constructor change gives a *redis.Client (embedded, so every go-redis
// method is there) whose reads of common read commands are served from a
// near cache in a shared cache.Store, one near cache for every process on
// the host. Writes, and everything else, go to Redis as usual.
//
//	store, _ := cache.Open("redis-near", cache.Config{})
//	rdb := rediscache.NewClient(&redis.Options{Addr: "10.0.0.5:6379"}, rediscache.Config{Store: store})
//	defer rdb.Close()
//	v, err := rdb.Get(ctx, "user:42").Result() // from shared memory once cached
//
// NewClusterClient does the same for a *redis.ClusterClient, and
// NewUniversalClient for redis.UniversalOptions (one server or a cluster).
//
// # Coherence
//
// The near cache is kept coherent by Redis client tracking in BCAST mode:
// each process keeps one RESP3 connection with CLIENT TRACKING ON BCAST
// (with the configured key prefixes), and Redis sends it an invalidation
// for every key written. BCAST rather than default tracking, because the
// cache is shared: in default mode Redis remembers which connection read a
// key and tells only that one, so once the process that filled an entry
// exits (or loses that connection) nobody would hear that the entry went
// stale, while other processes keep reading it. With BCAST every live
// process hears about every write, so the entry is dropped as long as any
// of them runs. The price is an invalidation per write to a tracked key,
// per process: narrow it with Config.Prefixes.
//
// A write through the drop-in makes the near cache forget the keys it
// touched before it returns (the server's COMMAND table says which), so a
// client, and every process sharing the pool, reads its own writes without
// waiting for the push. A read that races a write never leaves a stale
// value behind: each Redis key has a generation in the pool, bumped by
// every invalidation and every write through the drop-in; a miss notes the
// generations before it asks Redis and stores its answer with them, and an
// entry whose generations have moved is never served. GET's answer lives
// in the key's generation entry itself and is stored by compare-and-swap
// on that generation, so a hit is one read of the pool. A miss asks for
// its keys' PTTLs in the same round trip, so no entry outlives its key.
//
// Writes by clients that do not share the pool arrive by invalidation,
// and the bound on how late is Config.MaxStaleness: an entry is served
// only while the tracking connection has proved, by an answered PING sent
// less than MaxStaleness ago, that it had heard every earlier write. While
// a process's tracking connection is down it neither serves nor fills, and
// when it loses or regains that connection it flushes the near cache for
// that server (a namespace generation, so the flush is one write).
//
// # Redis Cluster
//
// A ClusterClient keeps one tracking connection per cluster node (BCAST,
// as above), and each node has a namespace generation of its own: losing
// or regaining a node's tracking connection flushes the entries filled
// from that node only. The keys' generations are shared by all nodes, so
// an invalidation from any node, or a write through any drop-in, voids
// an entry wherever it was filled. An entry filled from a node is served
// only while that node is the one whose latest CLUSTER NODES (asked with
// every tracking PING) says it serves the key's slot, without migrating
// it, and no other node's says so too; a node that stops serving a slot
// (a MIGRATING state or a move) flushes its entries. So during a
// resharding, an entry of a moving slot is never served from the old
// owner once its tracking has seen the move, and at most MaxStaleness
// after: a key created on the new owner (whose invalidation only the new
// owner sends) cannot leave a cached miss behind, and a key whose slot
// went away and came back is never read through a generation that missed
// the time in between.
//
// Watch transactions, Conn and EphemeralConn always read from Redis: their
// reads decide writes under WATCH or run after SELECT.
//
// # Why hooks and not go-redis's client-side cache
//
// go-redis v9.22+ has an experimental client-side cache (Options.
// ClientSideCache with its Cache interface). It is built on default-mode
// tracking: entries belong to the connection that fetched them
// (FulfillOwned, EvictByConn), which is right for a cache inside one
// process and wrong for one shared by many, for the reason above. So this
// package uses go-redis hooks (ProcessHook, ProcessPipelineHook) and its
// own BCAST tracking connection.
//
// Cached commands: GET, MGET, GETRANGE, STRLEN, EXISTS (one key), HGET,
// HMGET, HGETALL, HEXISTS, HLEN, HKEYS, HVALS, LRANGE, LLEN, LINDEX,
// SMEMBERS, SISMEMBER, SCARD, ZSCORE, ZCARD, ZRANGE (no options). Misses
// (redis.Nil) are cached too. A pipeline made only of cached commands is
// served from the cache where it can, the rest sent together; any other
// pipeline or transaction goes to Redis untouched.
package rediscache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
)

// Config configures the near cache.
type Config struct {
	// Store holds the near cache; every process that opens the same
	// store shares it. Required.
	Store *cache.Store
	// Pool is the old name of Store, used when Store is nil.
	//
	// Deprecated: use Store.
	Pool *cache.Store
	// Prefixes limits caching, and the invalidations this process
	// receives, to keys starting with one of them. Empty: every key.
	Prefixes []string
	// TTL bounds how long an entry lives even without invalidations
	// (default 0: until invalidated or evicted). An entry never outlives
	// the Redis key's own expiry either way.
	TTL time.Duration
	// MaxStaleness bounds how old an answer from the near cache may be
	// with respect to writes made by other clients (writes through this
	// host's near cache are never missed): an entry is served only while
	// the tracking connection has proved, less than MaxStaleness ago,
	// that it had heard every write completed by then (a PING every
	// MaxStaleness/5). Otherwise reads go to Redis. Default 500ms.
	MaxStaleness time.Duration
	// Logger receives, at Warn, what makes the near cache serve less
	// (a flush of it that failed, a server that refused COMMAND). Nil:
	// nothing is logged.
	Logger *slog.Logger
}

// Client is a go-redis client with a shared near cache.
//
// Only the Client's own commands and pipelines are served from the near
// cache. A Conn, EphemeralConn or Watch transaction (a connection of its
// own, where SELECT, WATCH and friends hold) always reads from Redis, so a
// read that decides a write under WATCH sees what WATCH guards; its writes
// still make the near cache forget the keys they touch.
type Client struct {
	*redis.Client
	nc *nearCache
	h  *nodeHook
}

// NewClient returns a go-redis client for opt whose cacheable reads go
// through the near cache in cfg.Store.
func NewClient(opt *redis.Options, cfg Config) *Client {
	rdb := redis.NewClient(opt)
	addr := opt.Addr
	if addr == "" {
		addr = "localhost:6379"
	}
	ns := namespace(addr, opt.DB, opt.Username)
	nc := newNearCache(cfg, ns, false)
	nc.addr, nc.user, nc.db = addr, opt.Username, opt.DB
	nd := nc.newNode(addr, []byte(ns+"n"), rdb)
	nc.single = nd
	nd.start(opt)
	c := &Client{Client: rdb, nc: nc, h: &nodeHook{nd: nd}}
	c.AddHook(c.h)
	return c
}

// AddHook adds a go-redis hook, as redis.Client's does. Add hooks through
// this method, not through the embedded Client: the near cache tells its
// own chain of hooks from the ones go-redis builds for Conn and Tx (and a
// chain rebuilt behind its back is left uncached, never wrong).
func (c *Client) AddHook(h redis.Hook) {
	c.h.chainMu.Lock()
	defer c.h.chainMu.Unlock()
	c.h.building.Store(true)
	defer c.h.building.Store(false)
	c.Client.AddHook(h)
}

// Watch is redis.Client's Watch; the transaction's reads go to Redis.
func (c *Client) Watch(ctx context.Context, fn func(*redis.Tx) error, keys ...string) error {
	// The chain lock is held while go-redis builds the Tx's hooks, not
	// while fn runs (fn may open a Conn or Watch of its own).
	c.h.chainMu.Lock()
	var once sync.Once
	unlock := func() { once.Do(c.h.chainMu.Unlock) }
	defer unlock()
	return c.Client.Watch(ctx, func(tx *redis.Tx) error {
		unlock()
		return fn(tx)
	}, keys...)
}

// Conn is redis.Client's Conn; its reads go to Redis.
func (c *Client) Conn() *redis.Conn {
	c.h.chainMu.Lock()
	defer c.h.chainMu.Unlock()
	return c.Client.Conn()
}

// EphemeralConn is redis.Client's EphemeralConn; its reads go to Redis.
func (c *Client) EphemeralConn() *redis.Conn {
	c.h.chainMu.Lock()
	defer c.h.chainMu.Unlock()
	return c.Client.EphemeralConn()
}

// Close stops the tracking connection and closes the client.
func (c *Client) Close() error {
	c.nc.close()
	return c.Client.Close()
}

// Stats are the near cache's counters for this client.
type Stats struct {
	Hits, Misses, Fills, Bypassed uint64
	// Unconfirmed counts reads sent to Redis because tracking had not
	// proved itself current within MaxStaleness (in a cluster also: no
	// node was known to serve the keys' slot).
	Unconfirmed uint64
	// Forgotten counts keys dropped from the near cache by writes through
	// this client (before the write returned).
	Forgotten uint64
	// Invalidations counts keys invalidated by Redis; Flushes the times
	// the near cache of a server was dropped (tracking lost or regained,
	// FLUSHDB/FLUSHALL, a cluster node that stopped serving a slot).
	// Both are summed over the nodes of a cluster.
	Invalidations, Flushes uint64
	// Tracking reports whether the tracking connection is up (in a
	// cluster: every node's).
	Tracking bool
	// Nodes has each server's tracking, by address: one for a Client,
	// every node go-redis made a client for in a cluster.
	Nodes []NodeStats
}

// NodeStats are one server's tracking counters.
type NodeStats struct {
	Addr                   string
	Tracking               bool
	Invalidations, Flushes uint64
	// Slots is how many hash slots the node's latest CLUSTER NODES said
	// it serves (its own, less those it is migrating away); 0 outside a
	// cluster.
	Slots int
}

// Stats returns the counters.
func (c *Client) Stats() Stats { return c.nc.stats() }

// FlushNearCache drops the near cache for this client's server and
// database, for every process sharing the pool (one pool write). Needed
// only after a change Redis does not announce to tracking clients: a
// SWAPDB made by a client that is not a drop-in on this host.
func (c *Client) FlushNearCache() error { return c.nc.flushNearCache() }

// Sync waits until the near cache has applied every invalidation for
// writes that completed before Sync was called, by anyone, or ctx ends: a
// read after it sees them all (until MaxStaleness passes again). It costs
// a round trip on the tracking connection.
func (c *Client) Sync(ctx context.Context) error { return c.nc.single.t.sync(ctx) }

// WaitTracking waits until the tracking connection is up and current (the
// cache serves nothing before), or ctx ends.
func (c *Client) WaitTracking(ctx context.Context) error { return c.nc.waitTracking(ctx) }

// nearCache is one keyspace of the near cache: a Client's server and
// database as one user sees it, or a ClusterClient's cluster. Its keys'
// generations are shared by all its nodes.
type nearCache struct {
	pool      *cache.Store
	log       *slog.Logger
	ns        string // the prefix of every pool key of the keyspace
	genPrefix []byte // the prefix of the keys' generations
	prefixes  []string
	ttl       time.Duration
	maxStale  time.Duration
	cluster   bool
	// A Client's server, database and user: writes into other databases
	// name those databases' namespaces.
	addr, user string
	db         int
	cmds       atomic.Pointer[cmdTable] // the server's, loaded by the trackers

	single *node // a Client's one server

	// A ClusterClient's nodes by address, and which of them serves each
	// slot (from their trackers' latest CLUSTER NODES).
	nodesMu sync.Mutex
	nodes   map[string]*node
	closed  bool
	owners  atomic.Pointer[slotOwners]

	hits, misses                            stripedCounter
	fills, bypassed, unconfirmed, forgotten atomic.Uint64
}

func newNearCache(cfg Config, ns string, cluster bool) *nearCache {
	if cfg.Store == nil {
		cfg.Store = cfg.Pool
	}
	if cfg.Store == nil {
		panic("rediscache: Config.Store is required")
	}
	if cfg.MaxStaleness <= 0 {
		cfg.MaxStaleness = defaultMaxStaleness
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &nearCache{pool: cfg.Store, log: log, prefixes: cfg.Prefixes, ttl: cfg.TTL, maxStale: cfg.MaxStaleness,
		ns: ns, genPrefix: []byte(ns + "g\x00"), cluster: cluster}
}

// namespace prefixes the pool keys of one server's database as one user
// sees it.
func namespace(addr string, db int, user string) string {
	return "rc\x00" + addr + "\x00" + strconv.Itoa(db) + "\x00" + user + "\x00"
}

// clusterNamespace prefixes the pool keys of Redis Clusters as one user
// sees them. It names no cluster: two clusters read through one pool
// share their keys' generations, which costs them each other's
// invalidations and nothing else (an entry is served only through the
// namespace generation of the node it was filled from).
func clusterNamespace(user string) string { return "rcc\x00" + user + "\x00" }

// node is one Redis server of a keyspace: its tracking connection, the
// generation of its namespace (a flush of the node makes every entry
// filled from it unservable) and, in a cluster, the slots it serves.
type node struct {
	nc       *nearCache
	addr     string
	nsKeyB   []byte
	nsStamp  cache.Stamp
	nsKnown  atomic.Pointer[nsState]
	t        *tracker
	rdb      atomic.Pointer[redis.Client] // for the misses' round trips
	poisoned atomic.Bool                  // a flush failed: serve nothing until one succeeds
	slots    atomic.Pointer[slotSet]      // cluster: nil until its tracker has read CLUSTER NODES
}

func (n *nearCache) newNode(addr string, nsKey []byte, rdb *redis.Client) *node {
	nd := &node{nc: n, addr: addr, nsKeyB: nsKey, nsStamp: n.pool.StampOf(nsKey)}
	nd.rdb.Store(rdb)
	return nd
}

// start starts the node's tracker, unless the client is closed.
func (nd *node) start(opt *redis.Options) {
	nd.t = newTracker(opt, nd)
	if nd.nc.closed {
		nd.t.closed = true
		close(nd.t.done)
		return
	}
	go nd.t.run()
}

// close stops every tracker.
func (n *nearCache) close() {
	for _, nd := range n.allNodes(true) {
		nd.t.stop()
	}
}

// allNodes returns the keyspace's nodes (and with closing, marks it
// closed: no tracker starts after).
func (n *nearCache) allNodes(closing bool) []*node {
	if n.single != nil {
		return []*node{n.single}
	}
	n.nodesMu.Lock()
	defer n.nodesMu.Unlock()
	if closing {
		n.closed = true
	}
	nodes := make([]*node, 0, len(n.nodes))
	for _, nd := range n.nodes {
		nodes = append(nodes, nd)
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].addr < nodes[j].addr })
	return nodes
}

func (n *nearCache) stats() Stats {
	st := Stats{Hits: n.hits.load(), Misses: n.misses.load(), Fills: n.fills.Load(), Bypassed: n.bypassed.Load(),
		Unconfirmed: n.unconfirmed.Load(), Forgotten: n.forgotten.Load()}
	nodes := n.allNodes(false)
	st.Tracking = len(nodes) > 0
	for _, nd := range nodes {
		ns := NodeStats{Addr: nd.addr, Tracking: nd.t.up.Load(), Invalidations: nd.t.invalidations.Load(),
			Flushes: nd.t.flushes.Load(), Slots: nd.slots.Load().count()}
		st.Invalidations += ns.Invalidations
		st.Flushes += ns.Flushes
		st.Tracking = st.Tracking && ns.Tracking
		st.Nodes = append(st.Nodes, ns)
	}
	return st
}

func (n *nearCache) flushNearCache() error {
	if err := n.flushAll(); err != nil {
		return fmt.Errorf("rediscache: flush the near cache: %w", err)
	}
	return nil
}

// waitTracking waits until every node's tracking is up and current.
func (n *nearCache) waitTracking(ctx context.Context) error {
	for {
		nodes := n.allNodes(false)
		ready := len(nodes) > 0
		for _, nd := range nodes {
			ready = ready && nd.t.fresh()
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Keys in the pool: each node's namespace generation, each Redis key's
// generation, and the entries.

func (n *nearCache) genKey(redisKey string) []byte {
	return append(append(make([]byte, 0, len(n.genPrefix)+len(redisKey)), n.genPrefix...), redisKey...)
}

// genKeyIn builds a generation key in buf (no allocation when it fits).
func (n *nearCache) genKeyIn(buf []byte, redisKey string) []byte {
	return append(append(buf[:0], n.genPrefix...), redisKey...)
}

// forget makes every entry that depends on a Redis key unservable: the
// key's generation moves (its GET answer, kept in the same entry, goes
// with it). A key with no generation has nothing cached: a fill creates
// one before it asks Redis, so a fill that raced this already has it. If
// the pool refuses, the whole keyspace is flushed instead.
func (n *nearCache) forget(redisKey string) {
	if !n.forgetIn(n.genPrefix, redisKey) {
		_ = n.flushAll()
	}
}

// forgetIn moves a key's generation under genPrefix; false: the store
// could not, and the caller must flush.
//
// Invalidations run on a context of their own (invalidating), not the
// caller's: one abandoned because a caller gave up would leave a stale
// entry servable. They wait for a stopped writer's bucket at most the
// store's limit, then fail, and the caller flushes.
func (n *nearCache) forgetIn(genPrefix []byte, redisKey string) bool {
	var kb [256]byte
	gk := append(append(kb[:0], genPrefix...), redisKey...)
	_, err := n.pool.Set(invalidating, gk, nil, cache.SetOptions{Mode: cache.IfPresent})
	if err == nil || errors.Is(err, cache.ErrNotFound) || errors.Is(err, cache.ErrTooLarge) {
		return true // a key too long for the pool is never cached
	}
	_, err = n.pool.Delete(invalidating, gk)
	return err == nil
}

// invalidating is the context of invalidations (see forgetIn).
var invalidating = context.Background()

// flushAll drops the entries of every node of the keyspace.
func (n *nearCache) flushAll() error {
	var first error
	for _, nd := range n.allNodes(false) {
		if err := nd.flush(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// flush drops the near cache for this node: a new namespace generation,
// which every process's next hit reads.
func (nd *node) flush() error { return nd.flushIn(nd.nsKeyB) }

func (nd *node) flushIn(nsKey []byte) error {
	_, err := nd.nc.pool.Set(invalidating, nsKey, nil, cache.SetOptions{})
	if bytes.Equal(nsKey, nd.nsKeyB) {
		// A failed flush of this node's namespace may leave entries of the
		// old generation servable: serve nothing until one goes through.
		// (Another database's namespace is its clients' own.)
		nd.poisoned.Store(err != nil)
		if err != nil {
			nd.nc.log.Warn("rediscache: near cache flush failed: nothing is served from it until one succeeds", "addr", nd.addr, "err", err)
		}
	} else if err != nil {
		nd.nc.log.Warn("rediscache: flush of another database's near cache failed: its clients may read stale entries", "addr", nd.addr, "err", err)
	}
	return err
}

func (n *nearCache) table() cmdTable {
	if p := n.cmds.Load(); p != nil {
		return *p
	}
	return nil
}

// forgetWritten makes the near cache forget what cmd, run on this node,
// may have written in database db (and in any other database it names).
// It runs after the command returns, whatever its outcome: a fill that
// read the old value from Redis before the write noted the key's
// generation before that, so this voids it, or, if it comes later, its
// compare-and-swap fails.
func (nd *node) forgetWritten(cmd redis.Cmder, db int) {
	n := nd.nc
	args := cmd.Args()
	keys, all := n.table().writtenKeys(args)
	if all || len(keys) > 0 {
		n.forgotten.Add(1)
	}
	if n.cluster {
		// A cluster has database 0 alone (SWAPDB, MOVE and COPY ... DB
		// fail there). A write whose keys cannot be told may have written
		// a key whose slot another node's stale CLUSTER NODES still
		// claims, so it flushes every node.
		if name := cmd.Name(); all || name == "flushall" || name == "swapdb" {
			_ = n.flushAll()
			return
		}
		for _, k := range keys {
			if n.tracked1(k) {
				n.forget(k)
			}
		}
		return
	}
	nsOf := func(db int) (gen, nsKey []byte) {
		if db == n.db {
			return n.genPrefix, nd.nsKeyB
		}
		ns := namespace(n.addr, db, n.user)
		return []byte(ns + "g\x00"), []byte(ns + "n")
	}
	forgetIn := func(gen, nsKey []byte, k string) {
		if !n.forgetIn(gen, k) {
			_ = nd.flushIn(nsKey)
		}
	}
	gen, nsKey := nsOf(db)
	// Writes into other databases: MOVE, COPY ... DB, SWAPDB, FLUSHALL.
	switch name := cmd.Name(); {
	case name == "flushall":
		for d := range allDBs {
			_, k := nsOf(d)
			_ = nd.flushIn(k)
		}
		return
	case name == "swapdb" && len(args) == 3:
		for _, a := range args[1:] {
			if d, ok := dbArg(a); ok {
				_, k := nsOf(d)
				_ = nd.flushIn(k)
			}
		}
	case name == "move" && len(args) == 3 && len(keys) == 1:
		if d, ok := dbArg(args[2]); ok {
			g, k := nsOf(d)
			forgetIn(g, k, keys[0])
		}
	case name == "copy" && len(keys) == 1:
		for i := 3; i+1 < len(args); i++ {
			if s, _ := argString(args[i]); strings.EqualFold(s, "db") {
				if d, ok := dbArg(args[i+1]); ok {
					g, k := nsOf(d)
					forgetIn(g, k, keys[0])
				}
			}
		}
	}
	if all {
		_ = nd.flushIn(nsKey)
		return
	}
	for _, k := range keys {
		if n.tracked1(k) {
			forgetIn(gen, nsKey, k)
		}
	}
}

// allDBs is how many databases FLUSHALL flushes near caches of: Redis's
// default, 16.
const allDBs = 16

func dbArg(a any) (int, bool) {
	s, ok := argString(a)
	if !ok {
		return 0, false
	}
	d, err := strconv.Atoi(s)
	return d, err == nil && d >= 0
}

// session follows what a Conn or Tx does to its connection: the database
// SELECT chose, and the commands queued since MULTI, which are written
// only when EXEC runs. A cluster node client's own chain shares one
// session between goroutines (it sees no SELECT or MULTI of its own), so
// it has a lock.
type session struct {
	mu      sync.Mutex
	db      int
	inMulti bool
	queued  []redis.Cmder
}

func (st *session) after(nd *node, cmd redis.Cmder, err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch cmd.Name() {
	case "select":
		if d, ok := dbArg(argAt(cmd, 1)); ok && err == nil {
			st.db = d
		}
	case "reset":
		st.db, st.inMulti, st.queued = nd.nc.db, false, nil
	case "multi":
		if err == nil {
			st.inMulti, st.queued = true, nil
		}
		return
	case "exec", "discard":
		for _, q := range st.queued {
			nd.forgetWritten(q, st.db)
		}
		st.inMulti, st.queued = false, nil
		return
	}
	if st.inMulti {
		st.queued = append(st.queued, cmd)
	}
	nd.forgetWritten(cmd, st.db)
}

func argAt(cmd redis.Cmder, i int) any {
	if args := cmd.Args(); i < len(args) {
		return args[i]
	}
	return nil
}

// nsCurrent says whether an entry's namespace generation g is this node's
// current one. A flush by any process sharing the pool (its tracking came
// back, or a write whose keys could not be told) must void every entry at
// once, so the generation is the pool's; it is remembered with the stamp
// of its bucket, and read again only when that stamp moves.
func (nd *node) nsCurrent(ctx context.Context, g uint64) bool {
	s := nd.nsStamp.Load()
	if k := nd.nsKnown.Load(); k != nil && k.stamp == s {
		return g == k.version
	}
	cur, ok, err := nd.nc.pool.Version(ctx, nd.nsKeyB)
	if err != nil {
		return false // unread: not current, and nothing learnt
	}
	if s&1 == 0 && nd.nsStamp.Load() == s {
		if !ok {
			cur = 0 // no generation: nothing is current
		}
		nd.nsKnown.Store(&nsState{stamp: s, version: cur})
	}
	return ok && g == cur
}

// nsState is the namespace generation found while its bucket's stamp read
// stamp before and after.
type nsState struct{ stamp, version uint64 }

// generation reads key's generation, creating it if needed.
func (n *nearCache) generation(ctx context.Context, key []byte) (uint64, bool) {
	for range 4 {
		if _, in, err := n.pool.Get(ctx, key, nil); err == nil {
			return in.Version, true
		}
		if v, err := n.pool.Set(ctx, key, nil, cache.SetOptions{Mode: cache.IfAbsent}); err == nil {
			return v, true
		}
	}
	return 0, false
}

func (n *nearCache) tracked(keys []string) bool {
	for _, k := range keys {
		if !n.tracked1(k) {
			return false
		}
	}
	return true
}

func (n *nearCache) tracked1(k string) bool {
	if len(n.prefixes) == 0 {
		return true
	}
	for _, p := range n.prefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// Which node's entries may be served. A Client's: its server's. A
// cluster's: those of the node whose tracker's latest CLUSTER NODES says
// it serves the keys' slot (every key in one slot), if no other node's
// says so too. An entry is served through that node's namespace
// generation, so one filled from any other node, or from this one before
// a flush, never is.

func (n *nearCache) owner(keys []string) *node {
	if n.single != nil {
		return n.single
	}
	if len(keys) == 0 {
		return nil
	}
	o := n.owners.Load()
	if o == nil {
		return nil
	}
	slot := keySlot(keys[0])
	for _, k := range keys[1:] {
		if keySlot(k) != slot {
			return nil
		}
	}
	return o[slot]
}

func (n *nearCache) owner1(key string) *node {
	if n.single != nil {
		return n.single
	}
	if o := n.owners.Load(); o != nil {
		return o[keySlot(key)]
	}
	return nil
}

// servable says whether the entries of owner o may be served now: its
// tracking is current and its namespace sound. count: count a read
// refused for that.
func (n *nearCache) servable(o *node, count bool) bool {
	if o != nil && o.t.fresh() && !o.poisoned.Load() {
		return true
	}
	if count {
		n.unconfirmed.Add(1)
	}
	return false
}

// snapshot is what a miss noted before asking Redis.
type snapshot struct {
	epoch uint64
	gens  []uint64 // namespace, then each key
}

func (nd *node) snap(ctx context.Context, keys []string) (snapshot, bool) {
	n := nd.nc
	s := snapshot{epoch: nd.t.epoch.Load(), gens: make([]uint64, 0, 1+len(keys))}
	g, ok := n.generation(ctx, nd.nsKeyB)
	if !ok {
		return s, false
	}
	s.gens = append(s.gens, g)
	for _, k := range keys {
		g, ok := n.generation(ctx, n.genKey(k))
		if !ok {
			return s, false
		}
		s.gens = append(s.gens, g)
	}
	return s, nd.t.up.Load()
}

// lookup serves cmd from its entry through owner o, if the entry's
// generations are all current. Entry layout: generation count u32,
// generations u64..., payload. The entry is read in place (no copy);
// decode copies out what the command keeps.
func (n *nearCache) lookup(ctx context.Context, o *node, ck []byte, keys []string, cmd redis.Cmder) bool {
	served, decoded := false, false
	var kb [256]byte
	found, err := n.pool.View(ctx, ck, func(v []byte, _ cache.Info) {
		served = false
		if len(v) < 4 {
			return
		}
		cnt := int(binary.LittleEndian.Uint32(v))
		if cnt != 1+len(keys) || len(v) < 4+8*cnt {
			return
		}
		if !o.nsCurrent(ctx, binary.LittleEndian.Uint64(v[4:])) {
			return
		}
		for i := 1; i < cnt; i++ {
			cur, ok, err := n.pool.Version(ctx, n.genKeyIn(kb[:], keys[i-1]))
			if err != nil || !ok || cur != binary.LittleEndian.Uint64(v[4+8*i:]) {
				return
			}
		}
		decoded = true
		served = decode(cmd, v[4+8*cnt:])
		if testHookDecoded != nil {
			testHookDecoded()
		}
	})
	if found && err == nil && served {
		return true
	}
	if decoded {
		clearResult(cmd) // a look whose answer was not kept
	}
	return false
}

// testHookDecoded runs in a lookup's View callback after the entry was
// decoded, before the store has validated what it read (so a write made
// there makes the store call the callback again).
var testHookDecoded func()

// GET, the commonest read, is served with one read of the pool: its
// answer lives in the key's generation entry itself, as the namespace
// generation and the payload. An invalidation overwrites that entry (a new
// generation, no payload), and a fill stores only if the generation is
// still the one noted before asking Redis (compare-and-swap), so a fill
// that raced a write is refused rather than voided later.

func (n *nearCache) getLookup(ctx context.Context, o *node, cmd redis.Cmder, key string) bool {
	var kb [256]byte
	served, decoded := false, false
	found, err := n.pool.View(ctx, n.genKeyIn(kb[:], key), func(v []byte, _ cache.Info) {
		served = false
		if len(v) <= 8 || !o.nsCurrent(ctx, binary.LittleEndian.Uint64(v)) {
			return
		}
		decoded = true
		served = decode(cmd, v[8:])
		if testHookDecoded != nil {
			testHookDecoded()
		}
	})
	if found && err == nil && served {
		return true
	}
	if decoded {
		clearResult(cmd) // a look whose answer was not kept
	}
	return false
}

// lookupAny serves cmd from the near cache if it is a cached read with a
// servable entry. The ClusterClient's own hook calls it before go-redis
// routes the command, and counts only the hits.
func (n *nearCache) lookupAny(ctx context.Context, cmd redis.Cmder) bool {
	if args := cmd.Args(); len(args) == 2 {
		if name, _ := args[0].(string); name == "get" || name == "GET" {
			key, ok := args[1].(string)
			if !ok || !n.tracked1(key) {
				return false
			}
			o := n.owner1(key)
			return n.servable(o, false) && n.getLookup(ctx, o, cmd, key)
		}
	}
	name, keys, ok := cacheable(cmd)
	if !ok || !n.tracked(keys) {
		return false
	}
	o := n.owner(keys)
	if !n.servable(o, false) {
		return false
	}
	if name == "get" {
		return n.getLookup(ctx, o, cmd, keys[0])
	}
	ck, ok := entryKey(n.ns, cmd)
	return ok && n.lookup(ctx, o, ck, keys, cmd)
}

// getSnap notes what a GET fill must find unchanged.
type getSnap struct {
	epoch, ns, gen uint64
	ok             bool
}

func (nd *node) getSnapshot(ctx context.Context, key string) getSnap {
	n := nd.nc
	s := getSnap{epoch: nd.t.epoch.Load()}
	var okNs, okGen bool
	s.ns, okNs = n.generation(ctx, nd.nsKeyB)
	s.gen, okGen = n.generation(ctx, n.genKey(key))
	s.ok = okNs && okGen
	return s
}

// fillable says whether an answer from this node may be stored: its
// tracking has stayed up since the snapshot, and in a cluster it serves
// the keys' slot (an answer from anywhere else could never be served).
func (nd *node) fillable(epoch uint64, rerr error, ttl time.Duration, owner *node) bool {
	return (rerr == nil || rerr == redis.Nil) && nd.t.up.Load() && nd.t.epoch.Load() == epoch && ttl >= 0 && owner == nd
}

func (nd *node) getFill(ctx context.Context, cmd redis.Cmder, key string, s getSnap, rerr error, ttl time.Duration) {
	n := nd.nc
	if !s.ok || !nd.fillable(s.epoch, rerr, ttl, n.owner1(key)) {
		return
	}
	payload, ok := encode(cmd, rerr)
	if !ok {
		return
	}
	v := append(binary.LittleEndian.AppendUint64(make([]byte, 0, 8+len(payload)), s.ns), payload...)
	if _, err := n.pool.Set(ctx, n.genKey(key), v, cache.SetOptions{Mode: cache.IfVersion, Version: s.gen, TTL: ttl}); err == nil {
		n.fills.Add(1)
	}
}

func (nd *node) fill(ctx context.Context, ck []byte, keys []string, s snapshot, cmd redis.Cmder, rerr error, ttl time.Duration) {
	n := nd.nc
	// Tracking lost (and maybe regained) since the snapshot: invalidations
	// may have been missed.
	if !nd.fillable(s.epoch, rerr, ttl, n.owner(keys)) {
		return
	}
	payload, ok := encode(cmd, rerr)
	if !ok {
		return
	}
	v := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+8*len(s.gens)+len(payload)), uint32(len(s.gens)))
	for _, g := range s.gens {
		v = binary.LittleEndian.AppendUint64(v, g)
	}
	v = append(v, payload...)
	if _, err := n.pool.Set(ctx, ck, v, cache.SetOptions{TTL: ttl}); err == nil {
		n.fills.Add(1)
	}
}

// expiry asks Redis, with a read, for its keys' times to live, so that an
// entry never outlives its key: Redis expires keys on its own, and the
// invalidation of an expired key comes only when Redis gets round to
// deleting it.
type expiry struct {
	start time.Time
	cmds  []*redis.IntCmd
}

func newExpiry(ctx context.Context, keys []string) expiry {
	e := expiry{start: time.Now(), cmds: make([]*redis.IntCmd, len(keys))}
	for i, k := range keys {
		e.cmds[i] = redis.NewIntCmd(ctx, "pttl", k)
	}
	return e
}

func (e expiry) queue(rest []redis.Cmder) []redis.Cmder {
	for _, c := range e.cmds {
		rest = append(rest, c)
	}
	return rest
}

// ttl is how long an entry may live: the configured TTL, cut to the
// shortest key's remaining life counted from before it was asked (so
// that the entry expires no later than the key); -1: do not store.
func (e expiry) ttl(cfg time.Duration) time.Duration {
	ttl := cfg
	for _, c := range e.cmds {
		ms, err := c.Result()
		switch {
		case err != nil:
			return -1
		case ms == -1 || ms == -2: // no expiry, or no key
			continue
		case ms < 0:
			return -1
		}
		left := time.Duration(ms)*time.Millisecond - time.Since(e.start)
		if left <= 0 {
			return -1
		}
		if ttl == 0 || left < ttl {
			ttl = left
		}
	}
	return ttl
}

// fetch sends a missed read to the node together with its keys' PTTLs,
// in one round trip, and returns the read's outcome and the entry's TTL.
func (nd *node) fetch(ctx context.Context, cmd redis.Cmder, keys []string) (time.Duration, error) {
	e := newExpiry(ctx, keys)
	// Through the node client's own pipeline: PTTL is not a cached read,
	// so this hook passes the pipeline on untouched.
	// The PTTLs go first: a change to a key after them is a write, whose
	// invalidation voids the entry.
	p := nd.rdb.Load().Pipeline()
	for _, c := range e.cmds {
		_ = p.Process(ctx, c)
	}
	_ = p.Process(ctx, cmd)
	_, _ = p.Exec(ctx)
	return e.ttl(nd.nc.ttl), cmd.Err()
}

func (nd *node) get(ctx context.Context, cmd redis.Cmder, key string) error {
	n := nd.nc
	if o := n.owner1(key); n.servable(o, true) && n.getLookup(ctx, o, cmd, key) {
		n.hits.add()
		return cmd.Err()
	}
	n.misses.add()
	s := nd.getSnapshot(ctx, key)
	ttl, err := nd.fetch(ctx, cmd, []string{key})
	nd.getFill(ctx, cmd, key, s, err, ttl)
	return err
}

// Hooks.

// nodeHook is the near cache's go-redis hook on one client of a node.
//
// A Client's own chain is built while building is set; a chain built
// otherwise belongs to a Conn or Tx, which never reads the cache and only
// forgets what it writes. chainMu is held while any chain is built
// through the Client's methods, so that a Conn's or Tx's process and
// pipeline hooks, built one after the other, share one session (pending
// hands it over).
//
// On a cluster node's client, go-redis builds chains for every pipeline
// and for each Tx, so the hook tells them apart by context instead: calls
// made through the ClusterClient carry clusterCall, and only they read
// the cache; a Tx's calls (Watch), and anyone's calls straight to a node
// client, only forget.
type nodeHook struct {
	nd       *node
	building atomic.Bool
	chainMu  sync.Mutex
	pending  atomic.Pointer[session]
}

func (h *nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook wraps the Client's own commands in the near cache, and a
// Conn's or Tx's so that only their writes are looked at.
func (h *nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	nd := h.nd
	if nd.nc.cluster {
		st := &session{}
		return func(ctx context.Context, cmd redis.Cmder) error {
			if ctx.Value(clusterCall{}) != nil {
				return nd.process(ctx, cmd, next)
			}
			err := next(ctx, cmd)
			st.after(nd, cmd, err)
			return err
		}
	}
	if !h.building.Load() {
		st := &session{db: nd.nc.db}
		h.pending.Store(st) // for the pipeline hooks built next (under chainMu)
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			st.after(nd, cmd, err)
			return err
		}
	}
	return func(ctx context.Context, cmd redis.Cmder) error { return nd.process(ctx, cmd, next) }
}

// process runs one command of the client's own through the near cache.
func (nd *node) process(ctx context.Context, cmd redis.Cmder, next redis.ProcessHook) error {
	n := nd.nc
	// GET, the commonest read, without the general path's lookups.
	if args := cmd.Args(); len(args) == 2 {
		if name, _ := args[0].(string); name == "get" || name == "GET" {
			if key, ok := args[1].(string); ok && n.tracked1(key) && ctx.Err() == nil && nd.t.up.Load() {
				return nd.get(ctx, cmd, key)
			}
		}
	}
	name, keys, ok := cacheable(cmd)
	var ck []byte
	if ok && name != "get" {
		ck, ok = entryKey(n.ns, cmd)
	}
	if !ok || !n.tracked(keys) || ctx.Err() != nil {
		err := next(ctx, cmd)
		nd.forgetWritten(cmd, n.db)
		return err
	}
	if !nd.t.up.Load() {
		n.bypassed.Add(1)
		return next(ctx, cmd)
	}
	if name == "get" {
		return nd.get(ctx, cmd, keys[0])
	}
	if o := n.owner(keys); n.servable(o, true) && n.lookup(ctx, o, ck, keys, cmd) {
		n.hits.add()
		return cmd.Err()
	}
	n.misses.add()
	s, ok := nd.snap(ctx, keys)
	ttl, err := nd.fetch(ctx, cmd, keys)
	if ok {
		nd.fill(ctx, ck, keys, s, cmd, err, ttl)
	}
	return err
}

func (h *nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	nd := h.nd
	var st *session
	switch {
	case nd.nc.cluster:
		st = &session{}
	case !h.building.Load():
		st = h.pending.Load()
		if st == nil {
			st = &session{db: nd.nc.db}
		}
	default:
		return func(ctx context.Context, cmds []redis.Cmder) error { return nd.pipeline(ctx, cmds, next) }
	}
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if nd.nc.cluster && ctx.Value(clusterCall{}) != nil {
			return nd.pipeline(ctx, cmds, next)
		}
		err := next(ctx, cmds)
		for _, c := range cmds {
			st.after(nd, c, c.Err())
		}
		return err
	}
}

// pipeline runs a pipeline of the client's own through the near cache.
func (nd *node) pipeline(ctx context.Context, cmds []redis.Cmder, next redis.ProcessPipelineHook) error {
	n := nd.nc
	untouched := func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			nd.forgetWritten(c, n.db) // MULTI ... EXEC of a TxPipeline: EXEC has run
		}
		return err
	}
	if !nd.t.up.Load() || ctx.Err() != nil {
		return untouched(ctx, cmds)
	}
	keys := make([][]string, len(cmds))
	cks := make([][]byte, len(cmds))
	isGet := make([]bool, len(cmds))
	for i, cmd := range cmds {
		name, k, ok := cacheable(cmd)
		isGet[i] = name == "get"
		if ok && !isGet[i] {
			cks[i], ok = entryKey(n.ns, cmd)
		}
		if !ok || !n.tracked(k) {
			return untouched(ctx, cmds) // writes or transactions
		}
		keys[i] = k
	}
	type miss struct {
		cmd   redis.Cmder
		keys  []string
		ck    []byte
		s     snapshot
		gs    getSnap
		isGet bool
		snaps bool
		exp   expiry
	}
	var sent, missed []redis.Cmder
	var misses []miss
	for i, cmd := range cmds {
		m := miss{cmd: cmd, keys: keys[i], isGet: isGet[i], ck: cks[i]}
		o := n.owner(m.keys)
		serve := n.servable(o, true)
		if m.isGet {
			if serve && n.getLookup(ctx, o, cmd, m.keys[0]) {
				n.hits.add()
				continue
			}
			n.misses.add()
			m.gs = nd.getSnapshot(ctx, m.keys[0])
		} else {
			if serve && n.lookup(ctx, o, m.ck, m.keys, cmd) {
				n.hits.add()
				continue
			}
			n.misses.add()
			m.s, m.snaps = nd.snap(ctx, m.keys)
		}
		m.exp = newExpiry(ctx, m.keys)
		sent = m.exp.queue(sent)
		missed, misses = append(missed, cmd), append(misses, m)
	}
	if len(misses) == 0 {
		if n.cluster {
			// go-redis's cluster pipeline gives a node's commands the
			// error its hooks return when none reached the node, and
			// returns the first command error of the whole pipeline
			// itself.
			return nil
		}
		return firstErr(cmds)
	}
	err := next(ctx, append(sent, missed...))
	for _, m := range misses {
		e, ttl := m.cmd.Err(), m.exp.ttl(n.ttl)
		if m.isGet {
			nd.getFill(ctx, m.cmd, m.keys[0], m.gs, e, ttl)
		} else if m.snaps {
			nd.fill(ctx, m.ck, m.keys, m.s, m.cmd, e, ttl)
		}
	}
	var re redis.Error
	if err != nil && !errors.As(err, &re) {
		return err // the connection failed: every command sent failed with it
	}
	return firstErr(cmds)
}

// firstErr is what go-redis's pipeline returns: the first command error.
func firstErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// cacheable returns the Redis keys a cached command reads.
func cacheable(cmd redis.Cmder) (name string, keys []string, ok bool) {
	args := cmd.Args()
	if len(args) < 2 {
		return "", nil, false
	}
	name = cmd.Name()
	want, ok := readCommands[name]
	if !ok || (want > 0 && len(args) != want) || (want < 0 && len(args) < -want) {
		return "", nil, false
	}
	if name == "mget" {
		keys := make([]string, 0, len(args)-1)
		for _, a := range args[1:] {
			s, ok := a.(string)
			if !ok {
				return "", nil, false
			}
			keys = append(keys, s)
		}
		return name, keys, true
	}
	k, ok := args[1].(string)
	return name, []string{k}, ok
}

// readCommands maps each cached command to its exact argument count
// (negative: at least that many).
var readCommands = map[string]int{
	"get": 2, "mget": -2, "getrange": 4, "strlen": 2, "exists": 2,
	"hget": 3, "hmget": -3, "hgetall": 2, "hexists": 3, "hlen": 2, "hkeys": 2, "hvals": 2,
	"lrange": 4, "llen": 2, "lindex": 3,
	"smembers": 2, "sismember": 3, "scard": 2,
	"zscore": 3, "zcard": 2, "zrange": 4,
}

// entryKey names a command's entry: the namespace, then each argument with
// its length. false: an argument whose wire form this does not know (the
// entry could be shared by commands Redis answers differently).
func entryKey(ns string, cmd redis.Cmder) ([]byte, bool) {
	b := append([]byte(ns), 'e', 0)
	for _, a := range cmd.Args() {
		s, ok := argString(a)
		if !ok {
			return nil, false
		}
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b, true
}

// Payload encodings, by result type.
const (
	tagNil   = 'n'
	tagStr   = 's'
	tagInt   = 'i'
	tagBool  = 'b'
	tagFloat = 'f'
	tagList  = 'l' // nullable strings
	tagArr   = 'a' // strings
	tagMap   = 'm'
)

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func readStr(b []byte) (string, []byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return "", nil, false
	}
	return string(b[k : k+int(n)]), b[k+int(n):], true
}

// encode a command's result; err is its outcome (a hook sees it returned
// before go-redis sets it on the command).
func encode(cmd redis.Cmder, err error) ([]byte, bool) {
	if err == redis.Nil {
		return []byte{tagNil}, true
	}
	switch c := cmd.(type) {
	case *redis.StringCmd:
		return appendStr([]byte{tagStr}, c.Val()), true
	case *redis.IntCmd:
		return binary.AppendVarint([]byte{tagInt}, c.Val()), true
	case *redis.BoolCmd:
		if c.Val() {
			return []byte{tagBool, 1}, true
		}
		return []byte{tagBool, 0}, true
	case *redis.FloatCmd:
		return binary.LittleEndian.AppendUint64([]byte{tagFloat}, math.Float64bits(c.Val())), true
	case *redis.SliceCmd:
		b := binary.AppendUvarint([]byte{tagList}, uint64(len(c.Val())))
		for _, v := range c.Val() {
			switch s := v.(type) {
			case nil:
				b = append(b, 0)
			case string:
				b = appendStr(append(b, 1), s)
			default:
				return nil, false
			}
		}
		return b, true
	case *redis.StringSliceCmd:
		b := binary.AppendUvarint([]byte{tagArr}, uint64(len(c.Val())))
		for _, s := range c.Val() {
			b = appendStr(b, s)
		}
		return b, true
	case *redis.MapStringStringCmd:
		b := binary.AppendUvarint([]byte{tagMap}, uint64(len(c.Val())))
		for k, v := range c.Val() {
			b = appendStr(appendStr(b, k), v)
		}
		return b, true
	}
	return nil, false
}

// decode sets cmd's result from a payload; false if it does not fit.
//
// The store may call a View's callback again when a write changed the
// bucket meanwhile (the first look may even have seen a record being
// rewritten), so decode first clears what an earlier look set: a miss
// decoded after a value must not keep that value (go-redis gives none
// with redis.Nil), and a look that ends unserved leaves the command as
// it found it, for Redis to answer.
func decode(cmd redis.Cmder, p []byte) bool {
	clearResult(cmd)
	if len(p) == 0 {
		return false
	}
	tag, p := p[0], p[1:]
	if tag == tagNil {
		switch cmd.(type) {
		case *redis.StringCmd, *redis.FloatCmd:
			cmd.SetErr(redis.Nil)
			return true
		}
		return false
	}
	switch c := cmd.(type) {
	case *redis.StringCmd:
		s, _, ok := readStr(p)
		if tag != tagStr || !ok {
			return false
		}
		c.SetVal(s)
	case *redis.IntCmd:
		v, k := binary.Varint(p)
		if tag != tagInt || k <= 0 {
			return false
		}
		c.SetVal(v)
	case *redis.BoolCmd:
		if tag != tagBool || len(p) != 1 {
			return false
		}
		c.SetVal(p[0] == 1)
	case *redis.FloatCmd:
		if tag != tagFloat || len(p) != 8 {
			return false
		}
		c.SetVal(math.Float64frombits(binary.LittleEndian.Uint64(p)))
	case *redis.SliceCmd:
		n, k := binary.Uvarint(p)
		if tag != tagList || k <= 0 || n > uint64(len(p)) {
			return false
		}
		p = p[k:]
		out := make([]interface{}, 0, n)
		for range n {
			if len(p) == 0 {
				return false
			}
			if p[0] == 0 {
				out, p = append(out, nil), p[1:]
				continue
			}
			s, rest, ok := readStr(p[1:])
			if !ok {
				return false
			}
			out, p = append(out, s), rest
		}
		c.SetVal(out)
	case *redis.StringSliceCmd:
		n, k := binary.Uvarint(p)
		if tag != tagArr || k <= 0 || n > uint64(len(p)) {
			return false
		}
		p = p[k:]
		out := make([]string, 0, n)
		for range n {
			s, rest, ok := readStr(p)
			if !ok {
				return false
			}
			out, p = append(out, s), rest
		}
		c.SetVal(out)
	case *redis.MapStringStringCmd:
		n, k := binary.Uvarint(p)
		if tag != tagMap || k <= 0 || n > uint64(len(p)) {
			return false
		}
		p = p[k:]
		out := make(map[string]string, n)
		for range n {
			key, rest, ok := readStr(p)
			if !ok {
				return false
			}
			val, rest, ok := readStr(rest)
			if !ok {
				return false
			}
			out[key], p = val, rest
		}
		c.SetVal(out)
	default:
		return false
	}
	cmd.SetErr(nil)
	return true
}

// clearResult gives cmd, of a type decode sets, its zero value and no
// error, as a command not yet run has.
func clearResult(cmd redis.Cmder) {
	switch c := cmd.(type) {
	case *redis.StringCmd:
		c.SetVal("")
	case *redis.IntCmd:
		c.SetVal(0)
	case *redis.BoolCmd:
		c.SetVal(false)
	case *redis.FloatCmd:
		c.SetVal(0)
	case *redis.SliceCmd:
		c.SetVal(nil)
	case *redis.StringSliceCmd:
		c.SetVal(nil)
	case *redis.MapStringStringCmd:
		c.SetVal(nil)
	default:
		return
	}
	cmd.SetErr(nil)
}

// stripedCounter is a counter that goroutines on different CPUs bump
// without sharing a cache line.
type stripedCounter struct {
	s [8]struct {
		n atomic.Uint64
		_ [120]byte
	}
}

func (c *stripedCounter) add() { c.s[rand.Uint32()%8].n.Add(1) }

func (c *stripedCounter) load() uint64 {
	var t uint64
	for i := range c.s {
		t += c.s[i].n.Load()
	}
	return t
}

// The drop-in is usable wherever go-redis's client interfaces are.
var (
	_ redis.UniversalClient = (*Client)(nil)
	_ redis.Cmdable         = (*Client)(nil)
)
