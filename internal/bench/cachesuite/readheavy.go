package cachesuite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/rediscache"
	"github.com/ubkit-io/ubkit/internal/bench"
)

// readHeavy: Goroutines goroutines, 99% GET / 1% SET, against redis-server
// over TCP, through rediscache with a fresh pool (ubkit) or plain
// go-redis; both GET every key once first. After the timed load, untimed,
// the same client runs the read-your-writes check (a SET read back at
// once, rywChecks per goroutine) and the lost-update check: a run whose
// answers were wrong reports an error, not a rate.
func readHeavy(e *Env, kind string, d time.Duration) (bench.Measurement, error) {
	s, err := e.Redis()
	if err != nil {
		return bench.Measurement{}, err
	}
	opt := &redis.Options{Addr: s.Addr}
	var g *getter
	var w watcher
	if kind == "ubkit" {
		name := poolName()
		pool, err := cache.Open(name, cache.Config{MaxBytes: poolBytes})
		if err != nil {
			return bench.Measurement{}, err
		}
		defer cache.Remove(name)
		defer pool.Close()
		rc := rediscache.NewClient(opt, rediscache.Config{Store: pool})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = rc.WaitTracking(ctx)
		cancel()
		if err != nil {
			rc.Close()
			return bench.Measurement{}, err
		}
		g, w = redisGetter(rc), rc
	} else {
		rc := redis.NewClient(opt)
		g, w = redisGetter(rc), rc
	}
	defer g.close()
	if err := warmAll(g); err != nil {
		return bench.Measurement{}, err
	}
	v, err := mixedLoad(g, 2, 1, d)
	if err != nil {
		return bench.Measurement{}, err
	}
	if err := readYourWrites(g, 2, rywChecks); err != nil {
		return bench.Measurement{}, err
	}
	if err := lostUpdates(w); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: v}, nil
}

// watcher is what a plain and a near-cached go-redis client share for
// optimistic transactions.
type watcher interface {
	Watch(ctx context.Context, fn func(*redis.Tx) error, keys ...string) error
}

// Lost-update check: lostUpdateIncrs increments by each of Goroutines
// goroutines, each a WATCH, GET, MULTI SET EXEC retried on conflict, as
// the go-redis documentation's example does. A read under WATCH that does
// not come from Redis loses increments.
const lostUpdateIncrs = 50

// rywChecks is how many SET-then-GET pairs each goroutine runs after a
// timed run.
const rywChecks = 200

var counterSeq atomic.Uint64

func lostUpdates(c watcher) error {
	key := fmt.Sprintf("bench:counter:%d:%d", os.Getpid(), counterSeq.Add(1))
	var wg sync.WaitGroup
	errs := make([]error, Goroutines)
	for w := range Goroutines {
		wg.Go(func() {
			for range lostUpdateIncrs {
				for {
					err := c.Watch(bg, func(tx *redis.Tx) error {
						n, err := tx.Get(bg, key).Int()
						if err != nil && !errors.Is(err, redis.Nil) {
							return err
						}
						_, err = tx.TxPipelined(bg, func(p redis.Pipeliner) error {
							p.Set(bg, key, n+1, time.Minute)
							return nil
						})
						return err
					}, key)
					if errors.Is(err, redis.TxFailedErr) {
						continue
					}
					if err != nil {
						errs[w] = err
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return err
	}
	var got int
	err := c.Watch(bg, func(tx *redis.Tx) error {
		var err error
		got, err = tx.Get(bg, key).Int()
		return err
	})
	if err != nil {
		return err
	}
	if want := Goroutines * lostUpdateIncrs; got != want {
		return fmt.Errorf("lost updates: %d WATCH/MULTI increments left the counter at %d", want, got)
	}
	return nil
}
