package memcached_test

import (
	"fmt"
	"net"
	"os"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/gomemcache"
	"github.com/ubkit-io/ubkit/cache/memcached"
)

// A memcached server on a shared store, on a free loopback port, and an
// ordinary memcached client (gomemcache) talking to it over TCP.
func Example() {
	name := fmt.Sprintf("example-memcached-%d", os.Getpid())
	store, err := cache.Open(name, cache.Config{MaxBytes: 8 << 20})
	if err != nil {
		panic(err)
	}
	defer cache.Remove(name) // a store's name lives until removed
	defer store.Close()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := memcached.NewServer(store)
	go srv.Serve(l)
	defer srv.Close()

	mc := memcache.New(l.Addr().String())
	defer mc.Close()
	if err := mc.Set(&memcache.Item{Key: "greeting", Value: []byte("hello"), Flags: 42}); err != nil {
		panic(err)
	}
	it, err := mc.Get("greeting")
	if err != nil {
		panic(err)
	}
	fmt.Printf("over TCP: %s (flags %d)\n", it.Value, it.Flags)
	_, err = mc.Get("nobody")
	fmt.Println("a missing key:", err)

	// The entry lives in the store, where every process on the host that
	// opens it can read it: ubkit's gomemcache client does so for the keys
	// of this host's server, with no round trip.
	local, err := gomemcache.New(store, l.Addr().String(), l.Addr().String())
	if err != nil {
		panic(err)
	}
	defer local.Close()
	it, err = local.Get("greeting")
	if err != nil {
		panic(err)
	}
	fmt.Printf("from the store: %s (flags %d)\n", it.Value, it.Flags)
	// Output:
	// over TCP: hello (flags 42)
	// a missing key: memcache: cache miss
	// from the store: hello (flags 42)
}
