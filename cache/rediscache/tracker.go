package rediscache

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// trackingName is the client name of tracking connections (CLIENT LIST).
const trackingName = "ubkit-nearcache-tracking"

// How the tracking connection checks that it is alive: a PING when it has
// been quiet for pingEvery, and a dead connection after pingTimeout more.
const (
	pingEvery   = time.Second
	pingTimeout = 2 * time.Second
)

// tracker keeps one BCAST tracking connection and applies its
// invalidations to the pool.
type tracker struct {
	opt *redis.Options
	n   *nearCache

	up    atomic.Bool   // tracking is on: the cache may serve and fill
	epoch atomic.Uint64 // bumped whenever tracking goes down or up

	invalidations, flushes atomic.Uint64

	mu     sync.Mutex
	conn   net.Conn
	closed bool
	done   chan struct{}
	quit   chan struct{}
}

func startTracker(opt *redis.Options, n *nearCache) *tracker {
	t := &tracker{opt: opt, n: n, done: make(chan struct{}), quit: make(chan struct{})}
	go t.run()
	return t
}

func (t *tracker) stop() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.quit)
	if t.conn != nil {
		t.conn.Close()
	}
	t.mu.Unlock()
	<-t.done
}

// down marks tracking lost: stop serving, and drop the near cache for
// this server, since invalidations may have been missed.
func (t *tracker) down() {
	if t.up.Swap(false) {
		t.epoch.Add(1)
		t.n.flush()
		t.flushes.Add(1)
	}
}

func (t *tracker) run() {
	defer close(t.done)
	backoff := 10 * time.Millisecond
	for {
		err := t.session()
		t.down()
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
	for _, p := range t.n.prefixes {
		track = append(track, "PREFIX", p)
	}
	if _, err := call(track...); err != nil {
		return fmt.Errorf("rediscache: CLIENT TRACKING ON BCAST: %w", err)
	}
	// From here every write is heard. What was cached before may have
	// missed some: drop it, then serve.
	t.n.flush()
	t.flushes.Add(1)
	t.epoch.Add(1)
	t.up.Store(true)

	pingSent := time.Time{}
	for {
		c.SetReadDeadline(time.Now().Add(pingEvery))
		v, err := readValue(r, 0)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if !pingSent.IsZero() && time.Since(pingSent) > pingTimeout {
				return errors.New("rediscache: tracking connection stopped answering")
			}
			if pingSent.IsZero() {
				c.SetWriteDeadline(time.Now().Add(pingTimeout))
				if err := writeCommand(w, "PING"); err != nil {
					return err
				}
				pingSent = time.Now()
			}
			continue
		}
		if err != nil {
			return err
		}
		if v.kind == '>' {
			t.push(v)
			continue
		}
		pingSent = time.Time{} // the PING's answer
		if err := v.err(); err != nil {
			return err
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
		t.n.flush()
		t.flushes.Add(1)
		return
	}
	for _, k := range keys.items {
		t.n.bump(t.n.genKey(k.str))
		t.invalidations.Add(1)
	}
}
