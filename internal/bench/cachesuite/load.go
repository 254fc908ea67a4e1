package cachesuite

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// checkEvery is how many operations a load goroutine runs between looks
// at the clock.
const checkEvery = 64

// warmAll GETs every key once through g, from Goroutines goroutines, and
// checks every value: connections are open and a near cache is filled
// before a throughput run is timed.
func warmAll(g *getter) error {
	var wg sync.WaitGroup
	errs := make([]error, Goroutines)
	for w := range Goroutines {
		wg.Go(func() {
			var dst []byte
			for k := w; k < Keys; k += Goroutines {
				v, err := g.getChecked(k, dst)
				if err != nil {
					errs[w] = err
					return
				}
				dst = v[:0]
			}
		})
	}
	wg.Wait()
	return firstError(errs)
}

// mixedLoad runs Goroutines goroutines for d, each drawing its own fixed
// sequence of operations from seed: a SET of a new value to a random key
// of its own (key k belongs to goroutine k%Goroutines) with probability
// setPercent/100, followed at once by a GET of that key, which must give
// the value just written (read-your-writes); else a GET of a random key
// whose value is checked. It returns operations per second, every GET and
// SET counted.
func mixedLoad(g *getter, seed uint64, setPercent int, d time.Duration) (float64, error) {
	var wg sync.WaitGroup
	var total atomic.Uint64
	errs := make([]error, Goroutines)
	start := time.Now()
	for w := range Goroutines {
		wg.Go(func() {
			r := rng(seed, uint64(w))
			val := make([]byte, ValueSize)
			var dst []byte
			var n uint64
			defer func() { total.Add(n) }()
			for time.Since(start) < d {
				for range checkEvery {
					k := r.IntN(Keys)
					if r.IntN(100) < setPercent {
						k = ownKey(k, w)
						ver := uint32(w)<<24 | uint32(n&0xffffff) + 1
						fillValue(val, k, ver)
						if err := g.set(k, val); err != nil {
							errs[w] = err
							return
						}
						v, err := g.getChecked(k, dst)
						if err == nil && binary.LittleEndian.Uint64(v) != seedFor(k, ver) {
							err = fmt.Errorf("%w: key %d read version %#x right after writing %#x",
								errStale, k, uint32(binary.LittleEndian.Uint64(v)), ver)
						}
						if err != nil {
							errs[w] = err
							return
						}
						dst = v[:0]
						n++
					} else {
						v, err := g.getChecked(k, dst)
						if err != nil {
							errs[w] = err
							return
						}
						dst = v[:0]
					}
					n++
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if err := firstError(errs); err != nil {
		return 0, err
	}
	return float64(total.Load()) / el.Seconds(), nil
}

// errStale: a client did not read its own write.
var errStale = errors.New("read-your-writes violated")

// ownKey is the key nearest k that goroutine w writes.
func ownKey(k, w int) int {
	k = k - k%Goroutines + w
	if k >= Keys {
		k -= Goroutines
	}
	return k
}

func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
