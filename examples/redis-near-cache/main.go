// Command redis-near-cache swaps go-redis's constructor for ubkit's: reads
// of cached commands are then served from a near cache in shared memory
// that every process on the host shares, kept coherent by Redis client
// tracking. It talks to the Redis at $REDIS_ADDR (host:port, Redis 6 or
// newer), or, if that is not set, starts a throwaway redis-server from
// PATH on a free loopback port.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/rediscache"
)

// storeName is the shared near cache: every process on the host that opens
// it shares its entries.
const storeName = "example-near-cache"

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		var stop func()
		var err error
		addr, stop, err = startRedis()
		if err != nil {
			fmt.Fprintln(os.Stderr, "redis-near-cache:", err)
			os.Exit(1)
		}
		defer stop()
	}
	err := run(ctx, addr)
	cache.Remove(storeName) // a store's name lives until removed; this one was only for the example
	if err != nil {
		fmt.Fprintln(os.Stderr, "redis-near-cache:", err)
		os.Exit(1)
	}
}

// run is the whole change a go-redis user makes: open the shared store and
// call rediscache.NewClient where redis.NewClient was.
func run(ctx context.Context, addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return fmt.Errorf("cannot reach Redis at %s (REDIS_ADDR names a Redis 6 or newer): %w", addr, err)
	}
	c.Close()
	store, err := cache.Open(storeName, cache.Config{MaxBytes: 16 << 20})
	if err != nil {
		return err
	}
	defer store.Close()
	rdb := rediscache.NewClient(&redis.Options{Addr: addr}, rediscache.Config{Store: store})
	defer rdb.Close()
	if err := rdb.WaitTracking(ctx); err != nil {
		return err
	}

	get := func() error {
		before := rdb.Stats().Hits
		start := time.Now()
		v, err := rdb.Get(ctx, "greeting").Result()
		took := time.Since(start)
		if err != nil {
			return err
		}
		from := "Redis"
		if rdb.Stats().Hits > before {
			from = "the near cache"
		}
		fmt.Printf("GET greeting = %q from %s in %v\n", v, from, took.Round(100*time.Nanosecond))
		return nil
	}

	// Writes go to Redis; the near cache forgets what they touch before
	// they return, so this process (and every other one sharing the
	// store) reads its own writes.
	if err := rdb.Set(ctx, "greeting", "hello from Redis", 0).Err(); err != nil {
		return err
	}
	for range 3 {
		if err := get(); err != nil {
			return err
		}
	}

	// A client that does not share the store (another host's, a plain
	// go-redis client) writes: Redis tells the near cache, by client
	// tracking, within Config.MaxStaleness (500 ms by default; in practice
	// a round trip). Sync waits for that, to make the next read certain.
	other := redis.NewClient(&redis.Options{Addr: addr})
	defer other.Close()
	if err := other.Set(ctx, "greeting", "hello again, written by another client", 0).Err(); err != nil {
		return err
	}
	if err := rdb.Sync(ctx); err != nil {
		return err
	}
	for range 2 {
		if err := get(); err != nil {
			return err
		}
	}
	s := rdb.Stats()
	fmt.Printf("near cache: %d hits, %d misses, %d invalidations from Redis\n", s.Hits, s.Misses, s.Invalidations)
	return nil
}

// startRedis starts redis-server from PATH on a free loopback port, with
// no persistence, and returns its address and a function that stops it.
func startRedis() (addr string, stop func(), err error) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		return "", nil, errors.New("set REDIS_ADDR to a Redis server's host:port, or install redis-server (Debian: apt-get install redis-server) for this example to start one")
	}
	for range 3 { // the free port may be taken before redis-server binds it
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		var out bytes.Buffer // what it says if it fails to start
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			return "", nil, fmt.Errorf("start %s: %w", path, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		stop = func() { cmd.Process.Kill(); <-exited }
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if err = waitRedis(addr, exited); err == nil {
			return addr, stop, nil
		}
		stop()
		err = fmt.Errorf("%s: %w: %s", path, err, bytes.TrimSpace(out.Bytes()))
		if !bytes.Contains(out.Bytes(), []byte("in use")) {
			return "", nil, err
		}
	}
	return "", nil, errors.New("redis-server found no free port in 3 tries")
}

// waitRedis waits until Redis at addr answers a PING, or exited is closed.
func waitRedis(addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return errors.New("exited at start")
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("did not answer within 10 s")
}
