package rediscache_test

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

// The drop-in in front of a real Redis: a second GET is served from the
// near cache in shared memory, and a write by a client that does not share
// the store (another host's, say) reaches the near cache by Redis client
// tracking. The example starts its own redis-server from PATH.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, stop := startRedis()
	defer stop()

	name := fmt.Sprintf("example-rediscache-%d", os.Getpid())
	store, err := cache.Open(name, cache.Config{MaxBytes: 8 << 20})
	if err != nil {
		panic(err)
	}
	defer cache.Remove(name) // a store's name lives until removed
	defer store.Close()

	// The one change from go-redis: this constructor. MaxStaleness bounds
	// how late another client's write may be seen (default 500 ms).
	rdb := rediscache.NewClient(&redis.Options{Addr: addr}, rediscache.Config{Store: store, MaxStaleness: 2 * time.Second})
	defer rdb.Close()
	if err := rdb.WaitTracking(ctx); err != nil {
		panic(err)
	}
	other := redis.NewClient(&redis.Options{Addr: addr}) // a plain client, not sharing the store
	defer other.Close()

	get := func() {
		before := rdb.Stats().Hits
		v, err := rdb.Get(ctx, "user:42").Result()
		if err != nil {
			panic(err)
		}
		from := "Redis"
		if rdb.Stats().Hits > before {
			from = "the near cache"
		}
		fmt.Printf("GET user:42 = %s, from %s\n", v, from)
	}

	if err := other.Set(ctx, "user:42", "alice", 0).Err(); err != nil {
		panic(err)
	}
	// Sync waits until the near cache has heard of every write completed
	// so far, by anyone. A program rarely needs it; it makes this output
	// certain.
	if err := rdb.Sync(ctx); err != nil {
		panic(err)
	}
	get()
	get()

	if err := other.Set(ctx, "user:42", "bob", 0).Err(); err != nil {
		panic(err)
	}
	if err := rdb.Sync(ctx); err != nil {
		panic(err)
	}
	fmt.Println("invalidations heard:", rdb.Stats().Invalidations)
	get()
	get()

	// A write through the drop-in is forgotten by the near cache before it
	// returns: no Sync needed to read it.
	if err := rdb.Set(ctx, "user:42", "carol", 0).Err(); err != nil {
		panic(err)
	}
	v, err := rdb.Get(ctx, "user:42").Result()
	fmt.Println("after its own write:", v, err)
	// Output:
	// GET user:42 = alice, from Redis
	// GET user:42 = alice, from the near cache
	// invalidations heard: 2
	// GET user:42 = bob, from Redis
	// GET user:42 = bob, from the near cache
	// after its own write: carol <nil>
}

// startRedis starts a throwaway redis-server from PATH on a free loopback
// port, with no persistence, and returns its address and a function that
// stops it.
func startRedis() (addr string, stop func()) {
	path, err := exec.LookPath("redis-server")
	if err != nil {
		panic("redis-server is not in PATH: install it (Debian: apt-get install redis-server)")
	}
	var lastErr error
	for range 3 { // the free port may be taken before redis-server binds it
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		var out bytes.Buffer // what it says if it fails to start
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			panic(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		stop = func() { cmd.Process.Kill(); <-exited }
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if lastErr = waitRedis(addr, exited); lastErr == nil {
			return addr, stop
		}
		stop()
		lastErr = fmt.Errorf("%w: %s", lastErr, bytes.TrimSpace(out.Bytes()))
	}
	panic(lastErr)
}

// waitRedis waits until Redis at addr answers a PING, or exited is closed.
func waitRedis(addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return errors.New("redis-server exited at start")
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
	return errors.New("redis-server did not answer within 10 s")
}
