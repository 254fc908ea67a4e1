package rediscache

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ClusterClient is a go-redis Redis Cluster client with a shared near
// cache: the cluster's counterpart of Client (see the package
// documentation, "Redis Cluster"). Its own commands and pipelines are
// served from the near cache; a Watch transaction reads from Redis.
//
// Hooks added with AddHook (the cluster's) or through OnNewNode (each
// node client's) see what misses the near cache.
type ClusterClient struct {
	*redis.ClusterClient
	nc *nearCache
}

// NewClusterClient returns a go-redis cluster client for opt whose
// cacheable reads go through the near cache in cfg.Store.
func NewClusterClient(opt *redis.ClusterOptions, cfg Config) *ClusterClient {
	rdb := redis.NewClusterClient(opt)
	nc := newNearCache(cfg, clusterNamespace(opt.Username), true)
	nc.nodes = map[string]*node{}
	// Every node client go-redis makes (masters and replicas, when it
	// loads the cluster's state or follows a redirection) gets a tracker
	// and the node hook, before it runs a command.
	rdb.OnNewNode(func(client *redis.Client) {
		client.AddHook(&nodeHook{nd: nc.addNode(client)})
	})
	rdb.AddHook(clusterHook{nc: nc})
	return &ClusterClient{ClusterClient: rdb, nc: nc}
}

// Close stops the tracking connections and closes the client.
func (c *ClusterClient) Close() error {
	c.nc.close()
	return c.ClusterClient.Close()
}

// Stats returns the counters, summed over the nodes, and each node's.
func (c *ClusterClient) Stats() Stats { return c.nc.stats() }

// FlushNearCache drops the near cache for every node of the cluster, for
// every process sharing the pool (one pool write a node).
func (c *ClusterClient) FlushNearCache() error { return c.nc.flushNearCache() }

// Sync waits until the near cache has applied every invalidation for
// writes that completed before Sync was called, by anyone, or ctx ends:
// each node whose tracking is up has answered a PING sent after the
// call. (A node whose tracking is down has nothing served until it is
// back and has flushed.) It costs a round trip on each tracking
// connection, all at once.
func (c *ClusterClient) Sync(ctx context.Context) error {
	nodes := c.nc.allNodes(false)
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, nd := range nodes {
		if !nd.t.up.Load() {
			continue
		}
		wg.Go(func() { errs[i] = nd.t.sync(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// WaitTracking loads the cluster's state (go-redis then makes a client
// for every node, and the near cache a tracker) and waits until every
// node's tracking is up and current, or ctx ends.
func (c *ClusterClient) WaitTracking(ctx context.Context) error {
	if err := c.ForEachShard(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
		return fmt.Errorf("rediscache: load the cluster's state: %w", err)
	}
	return c.nc.waitTracking(ctx)
}

// UniversalClient is what NewUniversalClient returns: a go-redis
// UniversalClient with the near cache's methods. *Client and
// *ClusterClient are UniversalClients.
type UniversalClient interface {
	redis.UniversalClient
	Stats() Stats
	FlushNearCache() error
	Sync(ctx context.Context) error
	WaitTracking(ctx context.Context) error
}

// NewUniversalClient is go-redis's NewUniversalClient with the near
// cache: a ClusterClient for several addresses or IsClusterMode, a Client
// for one. Sentinel (MasterName) is refused: go-redis's failover client
// moves to another server behind the near cache's back.
func NewUniversalClient(opt *redis.UniversalOptions, cfg Config) (UniversalClient, error) {
	switch {
	case opt == nil:
		return nil, errors.New("rediscache: NewUniversalClient needs options")
	case cfg.Store == nil && cfg.Pool == nil:
		return nil, errors.New("rediscache: Config.Store is required: open one with cache.Open")
	case opt.MasterName != "":
		return nil, fmt.Errorf("rediscache: Redis Sentinel (MasterName %q) is not supported: use NewClient on the master's address, or plain go-redis", opt.MasterName)
	case len(opt.Addrs) > 1 || opt.IsClusterMode:
		return NewClusterClient(opt.Cluster(), cfg), nil
	}
	return NewClient(opt.Simple(), cfg), nil
}

// clusterCall marks the context of the ClusterClient's own calls, for the
// node hooks below them (see nodeHook).
type clusterCall struct{}

// clusterHook is the near cache's hook on the ClusterClient: hits are
// served before go-redis routes anything, and what misses goes on marked
// as the client's own, to be fetched and filled by the hook of the node
// that answers.
type clusterHook struct{ nc *nearCache }

func (h clusterHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h clusterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Err() == nil && h.nc.lookupAny(ctx, cmd) {
			h.nc.hits.add()
			return cmd.Err()
		}
		return next(context.WithValue(ctx, clusterCall{}, true), cmd)
	}
}

// ProcessPipelineHook serves a pipeline made only of cached reads from
// the near cache where it can and sends the rest on together; anything
// else (writes, MULTI ... EXEC) goes on whole, in order.
func (h clusterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		marked := context.WithValue(ctx, clusterCall{}, true)
		if ctx.Err() != nil || !h.nc.allCachedReads(cmds) {
			return next(marked, cmds)
		}
		var missed []redis.Cmder
		for _, c := range cmds {
			if h.nc.lookupAny(ctx, c) {
				h.nc.hits.add()
			} else {
				missed = append(missed, c)
			}
		}
		if len(missed) > 0 {
			var re redis.Error
			if err := next(marked, missed); err != nil && !errors.As(err, &re) {
				return err // the cluster or a connection failed
			}
		}
		return firstErr(cmds)
	}
}

// allCachedReads says whether every command is a cached read of tracked
// keys.
func (n *nearCache) allCachedReads(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		name, keys, ok := cacheable(c)
		if !ok || !n.tracked(keys) {
			return false
		}
		if name != "get" {
			if _, ok := entryKey(n.ns, c); !ok {
				return false
			}
		}
	}
	return true
}

// addNode returns the node of a node client go-redis made, starting its
// tracker if the address is new. A client made again for an address
// (go-redis closes the clients of nodes that leave its state) takes over
// the node and its tracker.
func (n *nearCache) addNode(client *redis.Client) *node {
	opt := client.Options()
	n.nodesMu.Lock()
	defer n.nodesMu.Unlock()
	if nd := n.nodes[opt.Addr]; nd != nil {
		nd.rdb.Store(client)
		return nd
	}
	nd := n.newNode(opt.Addr, []byte(n.ns+"n\x00"+opt.Addr), client)
	n.nodes[opt.Addr] = nd
	nd.start(opt)
	return nd
}

// removeNode drops a node whose client go-redis closed, unless a new
// client took it over meanwhile.
func (n *nearCache) removeNode(nd *node, closed *redis.Client) bool {
	n.nodesMu.Lock()
	defer n.nodesMu.Unlock()
	if n.nodes[nd.addr] != nd || nd.rdb.Load() != closed {
		return false
	}
	delete(n.nodes, nd.addr)
	nd.slots.Store(nil)
	n.rebuildOwnersLocked()
	return true
}

// clientClosed returns the node's client if go-redis has closed it.
func (nd *node) clientClosed(ctx context.Context) *redis.Client {
	rdb := nd.rdb.Load()
	if errors.Is(rdb.Ping(ctx).Err(), redis.ErrClosed) {
		return rdb
	}
	return nil
}

// Slots.

const numSlots = 16384

// slotSet is a set of hash slots.
type slotSet [numSlots / 64]uint64

func (s *slotSet) add(slot int)      { s[slot/64] |= 1 << (slot % 64) }
func (s *slotSet) remove(slot int)   { s[slot/64] &^= 1 << (slot % 64) }
func (s *slotSet) has(slot int) bool { return s[slot/64]&(1<<(slot%64)) != 0 }
func (s *slotSet) subsetOf(t *slotSet) bool {
	for i := range s {
		if s[i]&^t[i] != 0 {
			return false
		}
	}
	return true
}

// count is the set's size (0 for nil).
func (s *slotSet) count() int {
	if s == nil {
		return 0
	}
	c := 0
	for _, w := range s {
		c += bits.OnesCount64(w)
	}
	return c
}

// slotOwners names, for each slot, the one node that serves it, or nil.
type slotOwners [numSlots]*node

// applyClusterNodes takes the slots the node serves from a CLUSTER NODES
// reply. A node that stops serving a slot (it is migrating it away, or it
// moved) drops its entries first: they may miss writes the slot's new
// owner takes, and the node may serve the slot again later.
func (nd *node) applyClusterNodes(v value) error {
	text := v.str
	if v.kind == '=' { // a RESP3 verbatim string: its format, a colon, the text
		if len(text) < 4 || text[3] != ':' {
			return fmt.Errorf("%w: CLUSTER NODES: a verbatim string without its format", errProtocol)
		}
		text = text[4:]
	} else if v.kind != '$' && v.kind != '+' {
		return fmt.Errorf("%w: CLUSTER NODES answered with type %q", errProtocol, v.kind)
	}
	desc, set, err := parseMyself(text)
	if err != nil {
		return err
	}
	if desc == nd.t.slotsDesc {
		return nil
	}
	if old := nd.slots.Load(); old != nil && !old.subsetOf(set) {
		_ = nd.flush()
		nd.t.flushes.Add(1)
	}
	nd.setSlots(set, desc)
	return nil
}

// setSlots records the slots the node serves (nil: unknown, none).
func (nd *node) setSlots(set *slotSet, desc string) {
	if !nd.nc.cluster {
		return
	}
	nd.t.slotsDesc = desc
	if set == nil && nd.slots.Load() == nil {
		return
	}
	nd.slots.Store(set)
	nd.nc.rebuildOwners()
}

func (n *nearCache) rebuildOwners() {
	n.nodesMu.Lock()
	defer n.nodesMu.Unlock()
	n.rebuildOwnersLocked()
}

// rebuildOwnersLocked gives each slot the node that serves it, and none
// to a slot two nodes claim (one of them has not seen a move yet).
func (n *nearCache) rebuildOwnersLocked() {
	o := new(slotOwners)
	var claimed, twice slotSet
	for _, nd := range n.nodes {
		set := nd.slots.Load()
		if set == nil {
			continue
		}
		for i, w := range set {
			for w != 0 {
				slot := i*64 + bits.TrailingZeros64(w)
				w &= w - 1
				if claimed.has(slot) {
					twice.add(slot)
					continue
				}
				claimed.add(slot)
				o[slot] = nd
			}
		}
	}
	for i, w := range twice {
		for w != 0 {
			o[i*64+bits.TrailingZeros64(w)] = nil
			w &= w - 1
		}
	}
	n.owners.Store(o)
}

// parseMyself reads the node's own line of CLUSTER NODES ("<id>
// <addr> myself,master - <ping> <pong> <epoch> connected 0-5460 [42->-<id>]
// ...") into the slots it serves: its own, less those it is migrating
// away ([slot->-id]); a slot it imports ([slot-<-id]) is not its own yet.
// A replica serves none. desc is the line less what changes on its own
// (pings, the epoch).
func parseMyself(text string) (desc string, set *slotSet, err error) {
	for line := range strings.SplitSeq(text, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !hasFlag(f[2], "myself") {
			continue
		}
		set := new(slotSet)
		desc := f[2] + " " + strings.Join(f[8:], " ")
		if !hasFlag(f[2], "master") {
			return desc, set, nil
		}
		var migrating []int
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				if i := strings.Index(s, "->-"); i > 0 {
					slot, err := parseSlot(s[1:i])
					if err != nil {
						return "", nil, err
					}
					migrating = append(migrating, slot)
				} else if !strings.Contains(s, "-<-") {
					return "", nil, fmt.Errorf("%w: CLUSTER NODES: slot state %q", errProtocol, s)
				}
				continue
			}
			lo, hi, found := strings.Cut(s, "-")
			if !found {
				hi = lo
			}
			a, err := parseSlot(lo)
			if err != nil {
				return "", nil, err
			}
			b, err := parseSlot(hi)
			if err != nil || b < a {
				return "", nil, fmt.Errorf("%w: CLUSTER NODES: slot range %q", errProtocol, s)
			}
			for slot := a; slot <= b; slot++ {
				set.add(slot)
			}
		}
		for _, slot := range migrating {
			set.remove(slot)
		}
		return desc, set, nil
	}
	return "", nil, fmt.Errorf("%w: CLUSTER NODES has no line for the node itself", errProtocol)
}

func hasFlag(flags, flag string) bool {
	for f := range strings.SplitSeq(flags, ",") {
		if f == flag {
			return true
		}
	}
	return false
}

func parseSlot(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= numSlots {
		return 0, fmt.Errorf("%w: CLUSTER NODES: slot %q", errProtocol, s)
	}
	return n, nil
}

// keySlot is the hash slot of a key, as Redis Cluster computes it: CRC16
// (XMODEM) of the key, or of its hash tag (what lies between the first
// '{' and the next '}', if not empty), modulo 16384.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return int(crc) % numSlots
}

// crc16Table is CRC16-CCITT's (polynomial 0x1021) table, one entry per
// leading byte.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// The drop-ins are usable wherever go-redis's client interfaces are.
var (
	_ UniversalClient = (*Client)(nil)
	_ UniversalClient = (*ClusterClient)(nil)
)
