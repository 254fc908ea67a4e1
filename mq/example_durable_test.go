package mq_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/ubkit-io/ubkit/mq"
)

// A file-backed log: records go to memory-mapped files in a directory,
// each on disk before its Send returns (FlushEverySend), and segments
// older than a day go. OpenDir opens it again, from its files if its
// meta segment is gone (after a reboot).
func ExampleOpenDir() {
	dir, err := os.MkdirTemp("", "mq-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	name := "example-dir-" + strconv.Itoa(os.Getpid())
	log, err := mq.Create(name, mq.Config{SegmentSize: 1 << 20, Dir: dir, Flush: mq.FlushEverySend, MaxAge: 24 * time.Hour})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mq.Remove(name)
	ctx := context.Background()
	off, err := log.Send(ctx, 0, []byte("result 1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("on disk at offset", off)
	log.Close()

	log, err = mq.OpenDir(name, dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer log.Close()
	r, err := log.NewReader(0, mq.Oldest)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	rec, err := r.Next(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d: %s\n", rec.Offset, rec.Payload)
	// Output:
	// on disk at offset 0
	// 0: result 1
}
