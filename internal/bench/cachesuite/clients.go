package cachesuite

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
)

// getter is one contender's client: get returns key k's value (dst may be
// reused for it), set stores val as key k's value.
type getter struct {
	get   func(k int, dst []byte) ([]byte, error)
	set   func(k int, val []byte) error
	close func()
}

// getChecked gets key k's value and checks its checksum; it returns the
// value for reuse as the next dst.
func (g *getter) getChecked(k int, dst []byte) ([]byte, error) {
	v, err := g.get(k, dst)
	if err != nil {
		return nil, err
	}
	return v, check(v, k)
}

var bg = context.Background()

// newGetter connects a client of kind to addr (a pool name for ubkit).
func newGetter(kind, addr string) (*getter, error) {
	switch kind {
	case "ubkit":
		p, err := cache.Open(addr, cache.Config{MaxBytes: poolBytes})
		if err != nil {
			return nil, err
		}
		return &getter{
			get: func(k int, dst []byte) ([]byte, error) {
				v, _, err := p.Get(bg, keyBytes[k], dst)
				return v, err
			},
			set: func(k int, val []byte) error {
				_, err := p.Set(bg, keyBytes[k], val, cache.SetOptions{})
				return err
			},
			close: func() { p.Close() },
		}, nil
	case "redis-tcp", "redis-unix", "go-redis":
		o := &redis.Options{Addr: addr}
		if kind == "redis-unix" {
			o.Network = "unix"
		}
		return redisGetter(redis.NewClient(o)), nil
	case "memcached":
		return mcGetter(newMemcache(addr, 1)), nil
	}
	return nil, fmt.Errorf("unknown client kind %q", kind)
}

// redisCmds is what a plain and a near-cached go-redis client share.
type redisCmds interface {
	Get(ctx context.Context, key string) *redis.StringCmd
	Set(ctx context.Context, key string, value any, exp time.Duration) *redis.StatusCmd
	Close() error
}

func redisGetter(c redisCmds) *getter {
	return &getter{
		get:   func(k int, _ []byte) ([]byte, error) { return c.Get(bg, keyStrs[k]).Bytes() },
		set:   func(k int, val []byte) error { return c.Set(bg, keyStrs[k], val, 0).Err() },
		close: func() { c.Close() },
	}
}

// newMemcache is a gomemcache client that keeps a connection per
// goroutine (its default keeps 2 idle and would reconnect the rest) and
// tolerates a busy machine.
func newMemcache(addr string, goroutines int) *memcache.Client {
	mc := memcache.New(addr)
	mc.MaxIdleConns = max(goroutines, memcache.DefaultMaxIdleConns)
	mc.Timeout = 5 * time.Second
	return mc
}

func mcGetter(mc *memcache.Client) *getter {
	return &getter{
		get: func(k int, _ []byte) ([]byte, error) {
			it, err := mc.Get(keyStrs[k])
			if err != nil {
				return nil, err
			}
			return it.Value, nil
		},
		set:   func(k int, val []byte) error { return mc.Set(&memcache.Item{Key: keyStrs[k], Value: val}) },
		close: func() { mc.Close() },
	}
}

// fillAll stores every key's initial value through g, from n goroutines.
func fillAll(g *getter, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for w := range n {
		wg.Go(func() {
			v := make([]byte, ValueSize)
			for k := w; k < Keys; k += n {
				fillValue(v, k, 0)
				if err := g.set(k, v); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func fillRedis(addr string) error {
	g, err := newGetter("redis-tcp", addr)
	if err != nil {
		return err
	}
	defer g.close()
	return fillAll(g, Goroutines)
}

func fillMemcached(addr string) error {
	g := mcGetter(newMemcache(addr, Goroutines))
	defer g.close()
	return fillAll(g, Goroutines)
}
