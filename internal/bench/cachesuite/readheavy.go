package cachesuite

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/rediscache"
	"github.com/ubkit-io/ubkit/internal/bench"
)

// readHeavy: Goroutines goroutines, 99% GET / 1% SET, against redis-server
// over TCP, through rediscache with a fresh pool (ubkit) or plain
// go-redis; both GET every key once first.
func readHeavy(e *Env, kind string, d time.Duration) (bench.Measurement, error) {
	s, err := e.Redis()
	if err != nil {
		return bench.Measurement{}, err
	}
	opt := &redis.Options{Addr: s.Addr}
	var g *getter
	if kind == "ubkit" {
		name := poolName()
		pool, err := cache.Open(name, cache.Options{MaxBytes: poolBytes})
		if err != nil {
			return bench.Measurement{}, err
		}
		defer cache.Remove(name)
		defer pool.Close()
		rc := rediscache.NewClient(opt, rediscache.Config{Pool: pool})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = rc.WaitTracking(ctx)
		cancel()
		if err != nil {
			rc.Close()
			return bench.Measurement{}, err
		}
		g = redisGetter(rc)
	} else {
		g = redisGetter(redis.NewClient(opt))
	}
	defer g.close()
	if err := warmAll(g); err != nil {
		return bench.Measurement{}, err
	}
	v, err := mixedLoad(g, 2, 1, d)
	return bench.Measurement{Value: v}, err
}
