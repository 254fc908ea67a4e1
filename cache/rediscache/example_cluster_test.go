package rediscache_test

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/rediscache"
)

// A Redis Cluster client whose reads come from the host's shared near
// cache: one constructor changes.
func ExampleNewClusterClient() {
	addrs, err := rediscache.StartTestCluster() // a program has its cluster's addresses
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	store, err := cache.Open("example-cluster-near", cache.Config{MaxBytes: 16 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cache.Remove("example-cluster-near")
	defer store.Close()
	rdb := rediscache.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}, rediscache.Config{Store: store})
	defer rdb.Close()
	if err := rdb.WaitTracking(ctx); err != nil {
		fmt.Println(err)
		return
	}
	rdb.Set(ctx, "example:greeting", "hello from the cluster", 0) // writes go to the key's master
	for range 2 {
		fmt.Println(rdb.Get(ctx, "example:greeting").Val()) // from shared memory once cached
	}
	fmt.Println(len(rdb.Stats().Nodes), "nodes tracked")
	// Output:
	// hello from the cluster
	// hello from the cluster
	// 3 nodes tracked
}

// NewUniversalClient picks the drop-in go-redis's NewUniversalClient
// would: a ClusterClient for several addresses, a Client for one.
func ExampleNewUniversalClient() {
	addrs, err := rediscache.StartTestCluster()
	if err != nil {
		fmt.Println(err)
		return
	}
	store, err := cache.Open("example-universal-near", cache.Config{MaxBytes: 16 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cache.Remove("example-universal-near")
	defer store.Close()
	rdb, err := rediscache.NewUniversalClient(&redis.UniversalOptions{Addrs: addrs}, rediscache.Config{Store: store})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rdb.Close()
	fmt.Printf("%T\n", rdb)
	_, err = rediscache.NewUniversalClient(&redis.UniversalOptions{MasterName: "mymaster"}, rediscache.Config{Store: store})
	fmt.Println(err != nil)
	// Output:
	// *rediscache.ClusterClient
	// true
}
