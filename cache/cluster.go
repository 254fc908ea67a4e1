package cache

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ubkit-io/ubkit/transport"
)

// ClusterConfig describes one node's member of a Cluster.
type ClusterConfig struct {
	// Endpoint is this node's transport endpoint: its node name and the
	// super node's topology. Required.
	Endpoint *transport.Endpoint
	// Store is this node's shard. Required.
	Store *Store
	// Pool is the old name of Store, used when Store is nil.
	//
	// Deprecated: use Store.
	Pool *Store
	// Service names the shard servers (default "ubkit-cache").
	Service string
	// Nodes are the members, each running a Cluster with the same
	// Service. Default: the compute nodes of the endpoint's topology.
	Nodes []string
	// VirtualNodes per member on the hash ring (default 64).
	VirtualNodes int
	// NearTTL, when positive, keeps a copy of values read from other
	// nodes in the local store for that long, so repeated reads stay on
	// this node; a copy may be that much older than its shard's value.
	// Sets and deletes through this node drop its copy. Default 0: off.
	NearTTL time.Duration
	// ConnsPerNode bounds the connections to each other node (default 4).
	ConnsPerNode int
	// Logger receives, at Warn, a near copy that could not be dropped (it
	// may be served, stale, for up to NearTTL), and at Debug, near copies
	// not kept and connections of other nodes that broke. Nil: nothing
	// is logged.
	Logger *slog.Logger
}

// Cluster is a Store sharded across the nodes of a super node by consistent
// hashing over the node list: each key lives on one node, reads and writes
// of other nodes' keys go there over transport (the ub path inside the
// super node), so capacity grows with the nodes.
type Cluster struct {
	cfg   ClusterConfig
	self  string
	ring  []vnode
	l     net.Listener
	peers map[string]*peer
	wg    sync.WaitGroup
	mu    sync.Mutex
	srvc  map[net.Conn]struct{}
	done  bool
	// stop ends the contexts of the shard server's requests: Close.
	stop context.CancelFunc
}

type vnode struct {
	h    uint64
	node string
}

// NewCluster starts this node's shard server and returns the cluster.
func NewCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Store == nil {
		cfg.Store = cfg.Pool
	}
	if cfg.Endpoint == nil || cfg.Store == nil {
		return nil, errors.New("cache: a cluster member needs an Endpoint and a Store")
	}
	if cfg.Service == "" {
		cfg.Service = "ubkit-cache"
	}
	if cfg.VirtualNodes <= 0 {
		cfg.VirtualNodes = 64
	}
	if cfg.ConnsPerNode <= 0 {
		cfg.ConnsPerNode = 4
	}
	if len(cfg.Nodes) == 0 {
		for _, n := range cfg.Endpoint.Topology().Nodes {
			if !n.IsSwitch() {
				cfg.Nodes = append(cfg.Nodes, n.Name)
			}
		}
	}
	self := cfg.Endpoint.Node()
	if !slices.Contains(cfg.Nodes, self) {
		return nil, fmt.Errorf("cache: node %s is not one of the cluster's nodes %v", self, cfg.Nodes)
	}
	cfg.Logger = orDiscard(cfg.Logger)
	c := &Cluster{cfg: cfg, self: self, peers: map[string]*peer{}, srvc: map[net.Conn]struct{}{}}
	for _, n := range cfg.Nodes {
		for i := range cfg.VirtualNodes {
			c.ring = append(c.ring, vnode{xxhash.Sum64String(n + "#" + strconv.Itoa(i)), n})
		}
		if n != self {
			c.peers[n] = &peer{c: c, node: n, idle: make(chan net.Conn, cfg.ConnsPerNode), slots: make(chan struct{}, cfg.ConnsPerNode)}
		}
	}
	slices.SortFunc(c.ring, func(a, b vnode) int { return cmp.Compare(a.h, b.h) })
	l, err := cfg.Endpoint.Listen(ctx, "ub:///"+cfg.Service)
	if err != nil {
		return nil, err
	}
	c.l = l
	serving, stop := context.WithCancel(context.Background())
	c.stop = stop
	c.wg.Add(1)
	go c.serve(serving)
	return c, nil
}

// Owner returns the node that holds key.
func (c *Cluster) Owner(key []byte) string {
	h := xxhash.Sum64(key)
	i, _ := slices.BinarySearchFunc(c.ring, h, func(v vnode, h uint64) int { return cmp.Compare(v.h, h) })
	if i == len(c.ring) {
		i = 0
	}
	return c.ring[i].node
}

// Close stops the shard server and the connections to other nodes.
func (c *Cluster) Close() error {
	c.mu.Lock()
	c.done = true
	c.stop()
	for conn := range c.srvc {
		conn.Close()
	}
	c.mu.Unlock()
	err := c.l.Close()
	c.wg.Wait()
	for _, p := range c.peers {
		p.close()
	}
	return err
}

func nearKey(key []byte) []byte { return append([]byte("\x00near\x00"), key...) }

// Get returns key's value from its node (or this node's near copy).
func (c *Cluster) Get(ctx context.Context, key, dst []byte) ([]byte, Info, error) {
	owner := c.Owner(key)
	if owner == c.self {
		return c.cfg.Store.Get(ctx, key, dst)
	}
	if c.cfg.NearTTL > 0 {
		if v, in, err := c.cfg.Store.Get(ctx, nearKey(key), dst); err == nil {
			return v, in, nil
		}
	}
	r, err := c.peers[owner].call(ctx, request{op: opGet, key: key})
	if err != nil {
		return nil, Info{}, err
	}
	if r.err != nil {
		return nil, Info{}, r.err
	}
	if c.cfg.NearTTL > 0 {
		if _, err := c.cfg.Store.Set(ctx, nearKey(key), r.val, SetOptions{TTL: c.cfg.NearTTL, Flags: r.info.Flags}); err != nil {
			c.cfg.Logger.Debug("cache: near copy not kept", "owner", owner, "err", err)
		}
	}
	return append(dst[:0], r.val...), r.info, nil
}

// Set stores key's value on its node.
func (c *Cluster) Set(ctx context.Context, key, value []byte, o SetOptions) (uint64, error) {
	owner := c.Owner(key)
	if owner == c.self {
		return c.cfg.Store.Set(ctx, key, value, o)
	}
	if c.cfg.NearTTL > 0 {
		if err := c.dropNear(ctx, key); err != nil {
			return 0, err
		}
	}
	r, err := c.peers[owner].call(ctx, request{op: opSet, key: key, val: value, opts: o})
	if err != nil {
		return 0, err
	}
	return r.info.Version, r.err
}

// dropNear drops this node's near copy of key before a write to it. A
// copy it could not drop (ctx ended, or its bucket held by a stopped
// writer) fails the write, which is then not made: made, it would leave
// this node serving the old value for up to NearTTL.
func (c *Cluster) dropNear(ctx context.Context, key []byte) error {
	if _, err := c.cfg.Store.Delete(ctx, nearKey(key)); err != nil {
		return fmt.Errorf("cache: the near copy could not be dropped, so the write was not made: %w", err)
	}
	return nil
}

// Delete removes key from its node.
func (c *Cluster) Delete(ctx context.Context, key []byte) (bool, error) {
	owner := c.Owner(key)
	if owner == c.self {
		return c.cfg.Store.Delete(ctx, key)
	}
	if c.cfg.NearTTL > 0 {
		if err := c.dropNear(ctx, key); err != nil {
			return false, err
		}
	}
	r, err := c.peers[owner].call(ctx, request{op: opDelete, key: key})
	if err != nil {
		return false, err
	}
	if errors.Is(r.err, ErrNotFound) {
		return false, nil
	}
	return r.err == nil, r.err
}

// The wire: a request is op u8, mode u8, flags u32, ttl i64 (ns), version
// u64, key length u32, value length u32, key, value; a response is status
// u8, flags u32, version u64, expires i64 (unix ns), value length u32,
// value.
const (
	opGet    = 1
	opSet    = 2
	opDelete = 3

	stOK       = 0
	stNotFound = 1
	stExists   = 2
	stTooLarge = 3
	stFull     = 4
	stError    = 5

	reqHeader  = 1 + 1 + 4 + 8 + 8 + 4 + 4
	respHeader = 1 + 4 + 8 + 8 + 4
	maxWire    = 1<<30 + 1<<20
)

type request struct {
	op   byte
	key  []byte
	val  []byte
	opts SetOptions
}

type response struct {
	err  error
	info Info
	val  []byte
}

func writeRequest(w *bufio.Writer, r request) error {
	var h [reqHeader]byte
	h[0], h[1] = r.op, byte(r.opts.Mode)
	binary.LittleEndian.PutUint32(h[2:], r.opts.Flags)
	binary.LittleEndian.PutUint64(h[6:], uint64(r.opts.TTL))
	binary.LittleEndian.PutUint64(h[14:], r.opts.Version)
	binary.LittleEndian.PutUint32(h[22:], uint32(len(r.key)))
	binary.LittleEndian.PutUint32(h[26:], uint32(len(r.val)))
	w.Write(h[:])
	w.Write(r.key)
	w.Write(r.val)
	return w.Flush()
}

func readRequest(r *bufio.Reader) (request, error) {
	var h [reqHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return request{}, err
	}
	kl, vl := binary.LittleEndian.Uint32(h[22:]), binary.LittleEndian.Uint32(h[26:])
	if h[0] < opGet || h[0] > opDelete || h[1] > byte(IfVersion) || kl > 1<<20 || uint64(kl)+uint64(vl) > maxWire {
		return request{}, fmt.Errorf("%w: a malformed cluster request", ErrCorrupt)
	}
	b, err := readN(r, int(kl)+int(vl))
	if err != nil {
		return request{}, err
	}
	return request{op: h[0], key: b[:kl], val: b[kl:], opts: SetOptions{Mode: Mode(h[1]),
		Flags: binary.LittleEndian.Uint32(h[2:]), TTL: time.Duration(binary.LittleEndian.Uint64(h[6:])),
		Version: binary.LittleEndian.Uint64(h[14:])}}, nil
}

func statusOf(err error) byte {
	switch {
	case err == nil:
		return stOK
	case errors.Is(err, ErrNotFound):
		return stNotFound
	case errors.Is(err, ErrExists):
		return stExists
	case errors.Is(err, ErrTooLarge):
		return stTooLarge
	case errors.Is(err, ErrFull):
		return stFull
	}
	return stError
}

func errorOf(st byte) error {
	switch st {
	case stOK:
		return nil
	case stNotFound:
		return ErrNotFound
	case stExists:
		return ErrExists
	case stTooLarge:
		return ErrTooLarge
	case stFull:
		return ErrFull
	}
	return errors.New("cache: the owning node failed the request")
}

func writeResponse(w *bufio.Writer, err error, in Info, val []byte) error {
	var h [respHeader]byte
	h[0] = statusOf(err)
	binary.LittleEndian.PutUint32(h[1:], in.Flags)
	binary.LittleEndian.PutUint64(h[5:], in.Version)
	if !in.Expires.IsZero() {
		binary.LittleEndian.PutUint64(h[13:], uint64(in.Expires.UnixNano()))
	}
	binary.LittleEndian.PutUint32(h[21:], uint32(len(val)))
	w.Write(h[:])
	w.Write(val)
	return w.Flush()
}

func readResponse(r *bufio.Reader) (response, error) {
	var h [respHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return response{}, err
	}
	vl := binary.LittleEndian.Uint32(h[21:])
	if vl > maxWire {
		return response{}, fmt.Errorf("%w: a malformed cluster response", ErrCorrupt)
	}
	res := response{err: errorOf(h[0]), info: Info{Flags: binary.LittleEndian.Uint32(h[1:]), Version: binary.LittleEndian.Uint64(h[5:])}}
	if e := int64(binary.LittleEndian.Uint64(h[13:])); e != 0 {
		res.info.Expires = time.Unix(0, e)
	}
	var err error
	if res.val, err = readN(r, int(vl)); err != nil {
		return response{}, err
	}
	return res, nil
}

// readN reads n bytes, growing its buffer as they arrive: a length a peer
// claims costs nothing until the bytes come.
func readN(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, 0, min(n, 64<<10))
	for len(b) < n {
		k := min(n-len(b), max(len(b), 64<<10))
		b = slices.Grow(b, k)
		m, err := io.ReadFull(r, b[len(b):len(b)+k])
		b = b[:len(b)+m]
		if err != nil {
			return nil, err
		}
	}
	return b, nil
}

// serve answers other nodes' requests from this node's shard. Close ends
// ctx, and with it the requests' waits for a bucket's lock.
func (c *Cluster) serve(ctx context.Context) {
	defer c.wg.Done()
	for {
		conn, err := c.l.Accept()
		if err != nil {
			c.mu.Lock()
			closed := c.done
			c.mu.Unlock()
			if !closed {
				c.cfg.Logger.Warn("cache: the shard server stopped accepting", "node", c.self, "err", err)
			}
			return
		}
		c.mu.Lock()
		if c.done {
			c.mu.Unlock()
			conn.Close()
			return
		}
		c.srvc[conn] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go func() {
			defer c.wg.Done()
			defer func() {
				c.mu.Lock()
				delete(c.srvc, conn)
				c.mu.Unlock()
				conn.Close()
			}()
			r, w := bufio.NewReaderSize(conn, 64<<10), bufio.NewWriterSize(conn, 64<<10)
			var buf []byte
			for {
				req, err := readRequest(r)
				if err != nil {
					// A broken or hostile peer loses its connection.
					if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
						c.cfg.Logger.Debug("cache: a connection from another node broke", "node", c.self, "err", err)
					}
					return
				}
				var in Info
				var val []byte
				switch req.op {
				case opGet:
					val, in, err = c.cfg.Store.Get(ctx, req.key, buf)
					buf = val
				case opSet:
					in.Version, err = c.cfg.Store.Set(ctx, req.key, req.val, req.opts)
				case opDelete:
					var found bool
					found, err = c.cfg.Store.Delete(ctx, req.key)
					if err == nil && !found {
						err = ErrNotFound
					}
				}
				if writeResponse(w, err, in, val) != nil {
					return
				}
			}
		}()
	}
}

// peer is the connections to another node.
type peer struct {
	c     *Cluster
	node  string
	idle  chan net.Conn
	slots chan struct{}
}

type peerConn struct {
	net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func (p *peer) get(ctx context.Context) (*peerConn, error) {
	select {
	case c := <-p.idle:
		return c.(*peerConn), nil
	default:
	}
	select {
	case c := <-p.idle:
		return c.(*peerConn), nil
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	conn, err := p.c.cfg.Endpoint.Dial(ctx, "ub://"+p.node+"/"+p.c.cfg.Service)
	if err != nil {
		<-p.slots
		return nil, fmt.Errorf("cache: node %s: %w", p.node, err)
	}
	return &peerConn{Conn: conn, r: bufio.NewReaderSize(conn, 64<<10), w: bufio.NewWriterSize(conn, 64<<10)}, nil
}

func (p *peer) put(c *peerConn, broken bool) {
	if broken {
		c.Close()
		<-p.slots
		return
	}
	p.idle <- c
}

func (p *peer) call(ctx context.Context, req request) (response, error) {
	c, err := p.get(ctx)
	if err != nil {
		return response{}, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Time{})
	}
	if err := writeRequest(c.w, req); err != nil {
		p.put(c, true)
		return response{}, fmt.Errorf("cache: node %s: %w", p.node, err)
	}
	res, err := readResponse(c.r)
	if err != nil {
		p.put(c, true)
		return response{}, fmt.Errorf("cache: node %s: %w", p.node, err)
	}
	p.put(c, false)
	return res, nil
}

func (p *peer) close() {
	for {
		select {
		case c := <-p.idle:
			c.Close()
		default:
			return
		}
	}
}
