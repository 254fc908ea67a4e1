package mq_test

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/ubkit-io/ubkit/mq"
)

// A producer loans space, fills it in place and commits; a reader reads
// the records in place from the start.
func Example() {
	name := "example-" + strconv.Itoa(os.Getpid())
	log, err := mq.Create(name, mq.Config{SegmentSize: 1 << 20, Segments: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mq.Remove(name)
	defer log.Close()
	ctx := context.Background()

	res, err := log.Loan(ctx, 0, 5)
	if err != nil {
		fmt.Println(err)
		return
	}
	copy(res.Bytes(), "hello")
	res.Commit()
	log.Send(ctx, 0, []byte("world"))

	r, err := log.NewReader(0, mq.Oldest)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	for range 2 {
		rec, err := r.Next(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%d: %s\n", rec.Offset, rec.Payload)
	}
	// Output:
	// 0: hello
	// 24: world
}
