package gomemcache_test

import (
	"fmt"
	"net"
	"os"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/gomemcache"
	"github.com/ubkit-io/ubkit/cache/memcached"
)

// This host's memcached server serves a shared store (package
// cache/memcached); the drop-in client reads and writes that server's keys
// in the store directly, while other clients reach the same entries over
// the network. gomemcache's API is unchanged: only the constructor is
// ubkit's.
func Example() {
	name := fmt.Sprintf("example-memcache-%d", os.Getpid())
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
	addr := l.Addr().String()

	// The drop-in: addr is this host's server (it serves store), and the
	// only server here. Keys gomemcache would send to another server go
	// there over the network.
	mc, err := gomemcache.New(store, addr, addr)
	if err != nil {
		panic(err)
	}
	defer mc.Close()
	// A plain client, as another host would have.
	remote := memcache.New(addr)
	defer remote.Close()

	if err := remote.Set(&memcache.Item{Key: "session:42", Value: []byte("alice")}); err != nil {
		panic(err)
	}
	it, err := mc.Get("session:42") // from shared memory, no round trip
	if err != nil {
		panic(err)
	}
	fmt.Printf("drop-in reads what the network client set: %s\n", it.Value)

	// CAS tokens are the store's versions, the same on both paths.
	it.Value = []byte("bob")
	fmt.Println("drop-in compare-and-swap:", mc.CompareAndSwap(it))
	got, err := remote.Get("session:42")
	if err != nil {
		panic(err)
	}
	fmt.Printf("network client reads: %s\n", got.Value)
	stale := &memcache.Item{Key: "session:42", Value: []byte("carol"), CasID: it.CasID} // the token before the swap
	fmt.Println("network compare-and-swap with a stale token:", remote.CompareAndSwap(stale))

	// With the server stopped, the drop-in still reads the store.
	srv.Close()
	_, err = remote.Get("session:42")
	fmt.Println("network client, server stopped: fails:", err != nil)
	it, err = mc.Get("session:42")
	if err != nil {
		panic(err)
	}
	fmt.Printf("drop-in, server stopped: %s\n", it.Value)
	// Output:
	// drop-in reads what the network client set: alice
	// drop-in compare-and-swap: <nil>
	// network client reads: bob
	// network compare-and-swap with a stale token: memcache: compare-and-swap conflict
	// network client, server stopped: fails: true
	// drop-in, server stopped: bob
}
