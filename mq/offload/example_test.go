package offload_test

import (
	"bytes"
	"context"
	"fmt"
	"os"

	"github.com/ubkit-io/ubkit/mq/offload"
)

func Example() {
	ctx := context.Background()
	name := fmt.Sprintf("example-offload-%d", os.Getpid())
	store, err := offload.OpenStore(name, offload.StoreConfig{SegmentSize: 4 << 20, Segments: 2})
	if err != nil {
		panic(err)
	}
	defer offload.Remove(name)
	defer store.Close()

	payload := bytes.Repeat([]byte("inference result "), 1<<14) // 272 KiB
	ref, err := store.Put(ctx, payload)
	if err != nil {
		panic(err)
	}
	wire, _ := ref.MarshalBinary() // what the broker carries

	r, err := offload.NewResolver(offload.ResolverConfig{})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	got, _ := offload.ParseRef(wire)
	b, err := r.Get(ctx, got)
	fmt.Println(len(wire) < 64, bytes.Equal(b, payload), err)
	// Output: true true <nil>
}
