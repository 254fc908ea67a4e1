package shm_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// A record of two words that must change together: x and 2x. Writers lock,
// readers retry while a write intervenes, and the successor of a writer
// that died repairs the record.
func ExampleSeqLock() {
	seg, _ := shm.CreateMemfd("record", 4096, nil)
	defer seg.Close()
	lock, _ := shm.SeqLockAt(seg, 0)
	rec, _ := seg.Uint64s(shm.SeqLockSize, 2)

	write := func(x uint64) error {
		err := lock.Lock(time.Second)
		if errors.Is(err, shm.ErrOwnerDied) {
			// The write is open: make the record whole again.
			rec[1].Store(2 * rec[0].Load())
			lock.EndWrite()
		} else if err != nil {
			return err
		}
		lock.BeginWrite()
		rec[0].Store(x)
		rec[1].Store(2 * x)
		lock.EndWrite()
		lock.Unlock()
		return nil
	}
	read := func() (x, y uint64, err error) {
		for {
			seq, err := lock.Begin(time.Second)
			if err != nil {
				return 0, 0, err // ErrOwnerDied: write (Lock repairs), then read again
			}
			x, y = rec[0].Load(), rec[1].Load()
			if lock.Validate(seq) {
				return x, y, nil
			}
		}
	}

	write(21)
	fmt.Println(read())
	// Output: 21 42 <nil>
}

// A lock per bucket of a table, each beside the bucket it guards.
func ExampleNewSeqTable() {
	const buckets, bucketSize = 16, 256
	seg, _ := shm.CreateMemfd("table", buckets*bucketSize, nil)
	defer seg.Close()
	locks, _ := shm.NewSeqTable(seg, 0, buckets, bucketSize)
	l := locks.At(3)
	if err := l.Lock(time.Second); err != nil {
		panic(err)
	}
	l.BeginWrite()
	// ... change bucket 3 ...
	l.EndWrite()
	l.Unlock()
	fmt.Println(locks.Len(), l.Seq())
	// Output: 16 2
}

// A goroutine that waits for a flag another one raises, spinning on the
// ladder first and parking in a place of its own (here a channel) after.
func ExampleBackoff() {
	var flag atomic.Bool
	raised := make(chan struct{})
	go func() {
		flag.Store(true)
		close(raised)
	}()
	var b shm.Backoff
	for !flag.Load() {
		if !b.Pause() {
			<-raised // the spin is over: park
		}
	}
	fmt.Println("raised")
	// Output: raised
}

// Open waits for the process that creates a structure to say it is ready.
func ExampleWait_Until() {
	seg, _ := shm.CreateMemfd("ready", 4096, nil)
	defer seg.Close()
	ready, _ := seg.Uint32At(0)
	go func() {
		// ... the creator fills the structure in, then:
		ready.Store(1)
		shm.Wake(ready)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := (shm.Wait{}).Until(ctx, ready, func(v uint32) bool { return v == 1 })
	fmt.Println(err)
	// Output: <nil>
}
