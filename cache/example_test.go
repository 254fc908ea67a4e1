package cache_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/cache"
)

func ExampleStore_Repair() {
	name := fmt.Sprintf("example-repair-%d", os.Getpid())
	p, err := cache.Open(name, cache.Config{MaxBytes: 1 << 20})
	if err != nil {
		panic(err)
	}
	defer cache.Remove(name)
	defer p.Close()
	ctx := context.Background()
	p.Set(ctx, []byte("k"), []byte("v"), cache.SetOptions{})

	// What writers that died left behind is taken back as the store is
	// written to; Repair checks everything now, while others go on, and
	// says what it set right.
	rep, err := p.Repair(ctx)
	fmt.Printf("%+v %v\n", rep, err)
	// Output: {Buckets:0 Entries:0 Buffers:0 Items:0 Bytes:0} <nil>
}

func ExampleOpen() {
	name := fmt.Sprintf("example-open-%d", os.Getpid())
	store, err := cache.Open(name, cache.Config{MaxBytes: 1 << 20})
	if err != nil {
		panic(err)
	}
	defer cache.Remove(name) // a store's name lives until removed
	defer store.Close()

	// A context bounds a call's wait for a bucket another writer holds.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	store.Set(ctx, []byte("greeting"), []byte("world"), cache.SetOptions{})
	store.Prepend(ctx, []byte("greeting"), []byte("hello "))
	store.Append(ctx, []byte("greeting"), []byte("!"))
	v, _, err := store.Get(ctx, []byte("greeting"), nil)
	fmt.Printf("%s %v\n", v, err)

	store.Set(ctx, []byte("hits"), []byte("10"), cache.SetOptions{})
	n, _ := store.Incr(ctx, []byte("hits"), 5)
	fmt.Println(n)
	n, _ = store.Decr(ctx, []byte("hits"), 20) // stops at 0
	fmt.Println(n)
	// Output:
	// hello world! <nil>
	// 15
	// 0
}
