package shmsuite

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/shm"
)

var allocPool = shm.PoolConfig{Classes: []shm.PoolClass{{Size: 256, Count: 64}, {Size: 4096, Count: 256}}}

// poolAllocFree measures Loan+Return of a 4 KiB buffer while a second
// process does the same on the same pool, so the free lists are shared.
func poolAllocFree(d time.Duration) (bench.Measurement, error) {
	size, _ := shm.PoolSize(allocPool)
	total := size
	name := fmt.Sprintf("bench-%d-%d", os.Getpid(), segCounter.Add(1))
	seg, err := shm.CreateSegment(name, total, nil)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer seg.Close()
	pool, err := shm.CreatePool(seg, 0, allocPool)
	if err != nil {
		return bench.Measurement{}, err
	}
	peer, err := bench.StartPeer("shm-pool", peerArgs{Addr: name, Extra: d})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer peer.Kill()
	// Wait until the peer has the pool open and loans.
	for pool.Stats()[1].InUse == 0 {
		select {
		case <-peer.Done():
			return bench.Measurement{}, fmt.Errorf("pool peer exited: %v", peer.Err())
		default:
			time.Sleep(100 * time.Microsecond)
		}
	}
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 256 {
			b, err := pool.Loan(4096)
			if err != nil {
				return bench.Measurement{}, err
			}
			b.Bytes()[0] = 1
			if err := b.Return(); err != nil {
				return bench.Measurement{}, err
			}
		}
		n += 256
	}
	return bench.Measurement{Value: float64(time.Since(start).Nanoseconds()) / float64(n)}, nil
}

func init() {
	bench.RegisterPeer("shm-pool", func(raw json.RawMessage) error {
		var a peerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		seg, err := shm.OpenSegment(a.Addr)
		if err != nil {
			return err
		}
		defer seg.Close()
		pool, err := shm.OpenPool(seg, 0)
		if err != nil {
			return err
		}
		// Hold one buffer to tell the parent we are running, then loan and
		// return until killed.
		if _, err := pool.Loan(4096); err != nil {
			return err
		}
		for {
			b, err := pool.Loan(4096)
			if err != nil {
				return err
			}
			b.Bytes()[0] = 2
			if err := b.Return(); err != nil {
				return err
			}
		}
	})
}

var syncPool = sync.Pool{New: func() any { b := make([]byte, 4096); return &b }}

func syncPoolAllocFree(d time.Duration) (bench.Measurement, error) {
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 256 {
			b := syncPool.Get().(*[]byte)
			(*b)[0] = 1
			syncPool.Put(b)
		}
		n += 256
	}
	return bench.Measurement{Value: float64(time.Since(start).Nanoseconds()) / float64(n)}, nil
}

var sink []byte

func makeAllocFree(d time.Duration) (bench.Measurement, error) {
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		for range 256 {
			b := make([]byte, 4096)
			b[0] = 1
			sink = b
		}
		n += 256
	}
	elapsed := time.Since(start)
	if len(sink) != 4096 || sink[0] != 1 {
		return bench.Measurement{}, fmt.Errorf("allocation lost")
	}
	return bench.Measurement{Value: float64(elapsed.Nanoseconds()) / float64(n)}, nil
}
