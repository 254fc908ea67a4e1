package rediscache

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// trackingName is the client name of tracking connections (CLIENT LIST).
const trackingName = "ubkit-nearcache-tracking"

// How the tracking connection proves it is alive and up to date: a PING
// every MaxStaleness/5, one at a time. Its answer comes after every
// invalidation Redis queued before it, so once it is in, every write that
// completed before the PING was sent has been applied to the pool. The
// near cache serves only while the latest answered PING was sent less
// than MaxStaleness ago; a PING unanswered for deadAfter ends the
// connection (and a new one is dialled).
const (
	defaultMaxStaleness = 500 * time.Millisecond
	minDeadAfter        = 2 * time.Second
)

// tracker keeps one BCAST tracking connection to a node and applies its
// invalidations to the pool. On a cluster node it also reads, with every
// PING, which slots the node serves.
type tracker struct {
	opt *redis.Options
	nd  *node

	up    atomic.Bool   // tracking is on: the cache may fill, and serve while fresh
	epoch atomic.Uint64 // bumped whenever tracking goes down or up
	// certified is when (nanoseconds since base) the latest answered PING
	// was sent; every write completed before it has been invalidated.
	certified atomic.Int64
	base      time.Time
	kick      chan struct{} // asks for a PING now (Sync)
	certMu    sync.Mutex
	certCh    chan struct{} // closed at each certification
	maxStale  time.Duration

	invalidations, flushes atomic.Uint64

	mu     sync.Mutex
	conn   net.Conn
	closed bool
	done   chan struct{}
	quit   chan struct{}
	// stopDial cancels a dial in progress when the client closes.
	stopCtx  context.Context
	stopDial context.CancelFunc

	// slotsDesc is the node's own line of the latest CLUSTER NODES, less
	// what changes without meaning a change of slots (run's goroutine).
	slotsDesc string
}

func newTracker(opt *redis.Options, nd *node) *tracker {
	stopCtx, stopDial := context.WithCancel(context.Background())
	return &tracker{opt: opt, nd: nd, done: make(chan struct{}), quit: make(chan struct{}),
		stopCtx: stopCtx, stopDial: stopDial, kick: make(chan struct{}, 1), certCh: make(chan struct{}),
		base: time.Now(), maxStale: nd.nc.maxStale}
}

func (t *tracker) stop() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.quit)
	t.stopDial()
	if t.conn != nil {
		t.conn.Close()
	}
	t.mu.Unlock()
	<-t.done
}

// down marks tracking lost: stop serving, and drop the near cache for
// this node, since invalidations may have been missed. A cluster node
// serves no slot until its next session has read CLUSTER NODES again.
func (t *tracker) down() {
	if t.up.Swap(false) {
		t.epoch.Add(1)
		_ = t.nd.flush()
		t.flushes.Add(1)
	}
	t.nd.setSlots(nil, "")
}

// since is the monotonic time since the tracker started.
func (t *tracker) since() int64 { return int64(time.Since(t.base)) }

// fresh says whether an entry may be served now: tracking is up and has
// proved, less than MaxStaleness ago, that it had heard every write.
func (t *tracker) fresh() bool {
	c := t.certified.Load()
	return t.up.Load() && c > 0 && t.since()-c <= int64(t.maxStale)
}

func (t *tracker) run() {
	defer close(t.done)
	backoff := 10 * time.Millisecond
	for {
		err := t.session()
		t.down()
		if t.nd.nc.cluster && t.gone() {
			return
		}
		select {
		case <-t.quit:
			return
		case <-time.After(backoff):
		}
		if err != nil {
			backoff = min(2*backoff, time.Second)
		} else {
			backoff = 10 * time.Millisecond
		}
	}
}

func (t *tracker) dial(ctx context.Context) (net.Conn, error) {
	if t.opt.Dialer != nil {
		return t.opt.Dialer(ctx, t.network(), t.addr())
	}
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if t.opt.TLSConfig != nil {
		td := tls.Dialer{NetDialer: &d, Config: t.opt.TLSConfig}
		return td.DialContext(ctx, t.network(), t.addr())
	}
	return d.DialContext(ctx, t.network(), t.addr())
}

func (t *tracker) network() string {
	if t.opt.Network != "" {
		return t.opt.Network
	}
	return "tcp"
}

func (t *tracker) addr() string {
	if t.opt.Addr != "" {
		return t.opt.Addr
	}
	return "localhost:6379"
}

// session runs one tracking connection until it fails.
func (t *tracker) session() error {
	ctx, cancel := context.WithTimeout(t.stopCtx, 5*time.Second)
	c, err := t.dial(ctx)
	cancel()
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return net.ErrClosed
	}
	t.conn = c
	t.mu.Unlock()
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	w := bufio.NewWriter(c)
	call := func(args ...string) (value, error) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := writeCommand(w, args...); err != nil {
			return value{}, err
		}
		for {
			v, err := readValue(r, 0)
			if err != nil {
				return value{}, err
			}
			if v.kind == '>' {
				t.push(v) // an invalidation ahead of the reply
				continue
			}
			return v, v.err()
		}
	}
	hello := []string{"HELLO", "3"}
	if t.opt.Password != "" {
		user := t.opt.Username
		if user == "" {
			user = "default"
		}
		hello = append(hello, "AUTH", user, t.opt.Password)
	}
	if _, err := call(hello...); err != nil {
		return fmt.Errorf("rediscache: tracking connection: HELLO 3 (Redis 6 or newer is needed): %w", err)
	}
	if _, err := call("CLIENT", "SETNAME", trackingName); err != nil {
		return err
	}
	track := []string{"CLIENT", "TRACKING", "ON", "BCAST"}
	for _, p := range t.nd.nc.prefixes {
		track = append(track, "PREFIX", p)
	}
	if _, err := call(track...); err != nil {
		return fmt.Errorf("rediscache: CLIENT TRACKING ON BCAST: %w", err)
	}
	// The command table tells the near cache which keys a write
	// through this process touches. Without it every write flushes.
	if v, err := call("COMMAND"); err == nil {
		tbl := parseCommandTable(v)
		t.nd.nc.cmds.Store(&tbl)
	} else if t.nd.nc.cmds.Load() == nil {
		t.nd.nc.log.Warn("rediscache: COMMAND refused: every write will flush the near cache", "err", err)
	}
	if t.nd.nc.cluster {
		v, err := call("CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("rediscache: tracking connection: CLUSTER NODES on %s: %w", t.addr(), err)
		}
		if err := t.nd.applyClusterNodes(v); err != nil {
			return err
		}
	}
	// From here every write is heard. What was cached before may have
	// missed some: drop it, then serve.
	certified := t.since()
	_ = t.nd.flush()
	t.flushes.Add(1)
	t.epoch.Add(1)
	t.up.Store(true)
	t.certify(certified)
	return t.listen(c, r, w)
}

// listen applies pushes and keeps proving the connection current until it
// fails. One goroutine reads (so no read deadline ever cuts a reply in
// half) and applies invalidations in order; this one writes PINGs, on a
// cluster node each after a CLUSTER NODES.
func (t *tracker) listen(c net.Conn, r *bufio.Reader, w *bufio.Writer) error {
	probe := []string{"PING"}
	if t.nd.nc.cluster {
		probe = []string{"CLUSTER NODES", "PING"}
	}
	replies := make(chan value, len(probe))
	failed := make(chan error, 1)
	readerDone := make(chan struct{})
	defer func() { c.Close(); <-readerDone }()
	c.SetDeadline(time.Time{})
	go func() {
		defer close(readerDone)
		for {
			v, err := readValue(r, 0)
			if err != nil {
				failed <- err
				return
			}
			if v.kind == '>' {
				t.push(v)
				continue
			}
			select {
			case replies <- v:
			default: // an answer nobody asked for
				failed <- fmt.Errorf("%w: an unexpected reply", errProtocol)
				return
			}
		}
	}()
	interval := max(t.maxStale/5, time.Millisecond)
	deadAfter := max(4*t.maxStale, minDeadAfter)
	timer := time.NewTimer(0)
	defer timer.Stop()
	var sent int64 = -1 // when the outstanding PING was sent
	answered := 0       // replies to it (and its CLUSTER NODES) read so far
	nextPing := t.since()
	for {
		select {
		case <-t.quit:
			return net.ErrClosed
		case err := <-failed:
			return err
		case v := <-replies:
			if err := v.err(); err != nil {
				return err
			}
			if sent < 0 {
				return fmt.Errorf("%w: an unexpected reply", errProtocol)
			}
			if answered++; answered < len(probe) {
				if err := t.nd.applyClusterNodes(v); err != nil {
					return err
				}
				continue
			}
			t.certify(sent)
			sent, answered = -1, 0
		case <-t.kick:
			nextPing = 0
		case <-timer.C:
		}
		now := t.since()
		if sent >= 0 && now-sent > int64(deadAfter) {
			return fmt.Errorf("rediscache: the tracking connection did not answer a PING for %v", deadAfter)
		}
		if sent < 0 && now >= nextPing {
			c.SetWriteDeadline(time.Now().Add(deadAfter))
			if err := writeCommands(w, probe...); err != nil {
				return err
			}
			sent, nextPing = now, now+int64(interval)
		}
		wait := time.Duration(nextPing - now)
		if sent >= 0 {
			wait = time.Duration(sent + int64(deadAfter) - now)
		}
		timer.Reset(max(wait, 0)) // Go 1.23 timers: no stale tick survives a Reset
	}
}

// certify records that every write completed before at has been applied.
func (t *tracker) certify(at int64) {
	t.certified.Store(at)
	t.certMu.Lock()
	close(t.certCh)
	t.certCh = make(chan struct{})
	t.certMu.Unlock()
}

// sync waits until every write completed before it was called has been
// applied to the pool.
func (t *tracker) sync(ctx context.Context) error {
	since := t.since()
	for {
		t.certMu.Lock()
		ch := t.certCh
		t.certMu.Unlock()
		if t.certified.Load() > since && t.up.Load() {
			return nil
		}
		select {
		case t.kick <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.quit:
			return net.ErrClosed
		}
	}
}

// push applies an "invalidate" push: its keys get new generations; a null
// key list (FLUSHDB, FLUSHALL) drops the whole near cache.
func (t *tracker) push(v value) {
	if len(v.items) < 2 || v.items[0].str != "invalidate" {
		return
	}
	keys := v.items[1]
	if keys.isNull() {
		_ = t.nd.flush()
		t.flushes.Add(1)
		return
	}
	for _, k := range keys.items {
		t.nd.nc.forget(k.str)
		t.invalidations.Add(1)
	}
}

// gone says, after a session ended, whether the tracker should end
// because go-redis closed the node's client (a node that left the
// cluster's state): the node is then dropped from the near cache, and a
// client go-redis makes for its address later gets a new one. A node
// that left the cluster but still runs keeps its tracker until Close.
func (t *tracker) gone() bool {
	rdb := t.nd.clientClosed(t.stopCtx)
	if rdb == nil || !t.nd.nc.removeNode(t.nd, rdb) {
		return false
	}
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.stopDial()
	return true
}
