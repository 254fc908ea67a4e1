package cache

import (
	"strconv"
	"sync/atomic"
	"testing"
)

// In-process benchmarks of a pool's hot paths, one goroutine, 10,000 keys
// of 64-byte values (what `ubctl bench cache` measures across processes,
// against baselines).

func benchKeys(b *testing.B, p *Store, fill bool) [][]byte {
	keys := make([][]byte, 10000)
	for i := range keys {
		keys[i] = []byte("key:" + strconv.Itoa(i))
		if fill {
			if _, err := p.Set(ctx, keys[i], value(uint64(i), 56), SetOptions{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	return keys
}

func BenchmarkPoolGet(b *testing.B) {
	p, _ := newStore(b, Config{MaxBytes: 16 << 20})
	keys := benchKeys(b, p, true)
	buf := make([]byte, 0, 128)
	i := 0
	for b.Loop() {
		v, _, err := p.Get(ctx, keys[i%len(keys)], buf)
		if err != nil || len(v) != 64 {
			b.Fatalf("get: %d bytes, %v", len(v), err)
		}
		i++
	}
}

func BenchmarkPoolSet(b *testing.B) {
	p, _ := newStore(b, Config{MaxBytes: 16 << 20})
	keys := benchKeys(b, p, false)
	v := value(1, 56)
	i := 0
	for b.Loop() {
		if _, err := p.Set(ctx, keys[i%len(keys)], v, SetOptions{}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkPoolMixed: 4 goroutines per P (8 with GOMAXPROCS 2), 99% Get
// and 1% Set, the pool's part of redis-read-heavy.
func BenchmarkPoolMixed(b *testing.B) {
	p, _ := newStore(b, Config{MaxBytes: 16 << 20})
	keys := benchKeys(b, p, true)
	v := value(1, 56)
	var seed atomic.Uint64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seed.Add(7919))
		buf := make([]byte, 0, 128)
		for pb.Next() {
			k := keys[i%len(keys)]
			if i%100 == 0 {
				if _, err := p.Set(ctx, k, v, SetOptions{}); err != nil {
					b.Error(err)
					return
				}
			} else if _, _, err := p.Get(ctx, k, buf); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}
