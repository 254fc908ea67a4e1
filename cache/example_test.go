package cache_test

import (
	"context"
	"fmt"
	"os"

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
