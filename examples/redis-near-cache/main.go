// Command redis-near-cache swaps go-redis's constructor for ubkit's: reads
// of cached commands are then served from a near cache in shared memory
// that every process on the host shares, kept coherent by Redis client
// tracking. It talks to REDIS_ADDR, or starts a throwaway redis-server.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/rediscache"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

// run is the whole change a go-redis user makes: open the shared pool and
// call rediscache.NewClient where redis.NewClient was.
func run(ctx context.Context, addr string) error {
	pool, err := cache.Open("example-near-cache", cache.Options{MaxBytes: 16 << 20})
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb := rediscache.NewClient(&redis.Options{Addr: addr}, rediscache.Config{Pool: pool})
	defer rdb.Close()
	if err := rdb.WaitTracking(ctx); err != nil {
		return err
	}
	rdb.Set(ctx, "greeting", "hello from Redis", 0) // writes go to Redis
	for range 3 {
		v, err := rdb.Get(ctx, "greeting").Result() // from shared memory once cached
		fmt.Println(v, err)
	}
	fmt.Printf("near cache: %+v\n", rdb.Stats())
	return nil
}

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		srv, err := testenv.StartRedis()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer srv.Close()
		addr = srv.Addr
	}
	err := run(ctx, addr)
	cache.Remove("example-near-cache")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
