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
// setPercent/100, else a GET of a random key whose value is checked; a
// GET of one of its own keys that it wrote must give exactly the last
// value it wrote there. It returns operations per second.
func mixedLoad(g *getter, seed uint64, setPercent int, d time.Duration) (float64, error) {
	var wg sync.WaitGroup
	var total atomic.Uint64
	errs := make([]error, Goroutines)
	start := time.Now()
	for w := range Goroutines {
		wg.Go(func() {
			r := rng(seed, uint64(w))
			val := make([]byte, ValueSize)
			wrote := make(map[int]uint32) // own key -> last version written
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
						wrote[k] = ver
					} else {
						v, err := g.getChecked(k, dst)
						if err == nil {
							err = checkOwn(v, k, wrote)
						}
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

// checkOwn: a value read for a key this goroutine wrote must be the last
// one it wrote.
func checkOwn(v []byte, k int, wrote map[int]uint32) error {
	ver, ok := wrote[k]
	if !ok {
		return nil
	}
	if got := uint32(binary.LittleEndian.Uint64(v)); got != ver {
		return fmt.Errorf("%w: key %d read version %#x after writing %#x", errStale, k, got, ver)
	}
	return nil
}

// readYourWrites is the untimed check after a run: each goroutine writes
// ryw keys of its own and reads each back at once; every read must give
// the value just written.
func readYourWrites(g *getter, seed uint64, ryw int) error {
	var wg sync.WaitGroup
	errs := make([]error, Goroutines)
	for w := range Goroutines {
		wg.Go(func() {
			r := rng(seed, uint64(w)+1000)
			val := make([]byte, ValueSize)
			var dst []byte
			for i := range ryw {
				k := ownKey(r.IntN(Keys), w)
				ver := uint32(w)<<24 | 0xff0000 | uint32(i)
				fillValue(val, k, ver)
				if err := g.set(k, val); err != nil {
					errs[w] = err
					return
				}
				v, err := g.getChecked(k, dst)
				if err == nil {
					err = checkOwn(v, k, map[int]uint32{k: ver})
				}
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
