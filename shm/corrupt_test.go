//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scribble writes random bytes at random places of mem until stop closes.
func scribble(mem []byte, stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	rng := rand.New(rand.NewPCG(1, 2))
	for {
		select {
		case <-stop:
			return
		default:
		}
		i := rng.IntN(len(mem))
		n := min(1+rng.IntN(16), len(mem)-i)
		for j := range n {
			mem[i+j] = byte(rng.Uint32())
		}
		time.Sleep(20 * time.Microsecond) // a pace, not a synchronisation
	}
}

// callReturns fails the test if f does not return: a call that hangs on
// corrupt memory is a bug, an error is fine.
func callReturns(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return on corrupt memory", what)
	}
}

// TestSPSCCorruptWhileRunning scribbles over the ring's header lines and
// records while a producer and a consumer run. Both must keep returning
// (records or errors) and never panic or hang.
func TestSPSCCorruptWhileRunning(t *testing.T) {
	for round := range 4 {
		_, r := newRing(t, 4096)
		p, _ := r.Producer(Wait{})
		c, _ := r.Consumer(Wait{})
		// Scribble over the header lines in even rounds, everything in odd.
		target := r.mem[:spscHeaderSize]
		if round%2 == 1 {
			target = r.mem
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go scribble(target, stop, &wg)
		var corrupt, records atomic.Int64
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
				b, err := p.ClaimWait(ctx, i%200)
				cancel()
				if err == nil {
					clear(b)
					p.Commit()
				}
			}
		}()
		// The consumer goes on until it has made 200 calls and seen the
		// scribbling corrupt the ring at least once: a fixed amount of work
		// and an outcome, not a period (300 ms were too few for round 0 on
		// a loaded machine). Only a ring the scribbling could never corrupt
		// reaches the hang guard.
		guard := time.Now().Add(60 * time.Second)
		for calls := 0; calls < 200 || corrupt.Load() == 0; calls++ {
			if time.Now().After(guard) {
				t.Fatalf("round %d: %d calls, and scribbling never produced an ErrCorrupt", round, calls)
			}
			callReturns(t, "NextWait", func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				defer cancel()
				b, err := c.NextWait(ctx)
				switch {
				case err == nil:
					records.Add(1)
					_ = len(b)
					c.Release()
				case errors.Is(err, ErrCorrupt):
					corrupt.Add(1)
				}
			})
		}
		close(stop)
		wg.Wait()
		t.Logf("round %d: %d records, %d corruption errors", round, records.Load(), corrupt.Load())
	}
}

// TestSPSCCorruptCases puts specific impossible values in a ring and checks
// each gives ErrCorrupt.
func TestSPSCCorruptCases(t *testing.T) {
	cases := map[string]func(r *SPSC){
		"tail beyond capacity": func(r *SPSC) { r.tail.Store(uint64(r.capacity) * 4) },
		"tail misaligned":      func(r *SPSC) { r.tail.Store(13) },
		"record too long": func(r *SPSC) {
			binary.LittleEndian.PutUint64(r.data, 1<<40)
			r.tail.Store(64)
		},
		"record past tail": func(r *SPSC) {
			binary.LittleEndian.PutUint64(r.data, 100)
			r.tail.Store(64)
		},
		"padding at start": func(r *SPSC) {
			binary.LittleEndian.PutUint32(r.data, padMarker)
			r.tail.Store(64)
		},
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			_, r := newRing(t, 256)
			c, _ := r.Consumer(Wait{})
			corrupt(r)
			if _, err := c.Next(); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Next: %v, want ErrCorrupt", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if _, err := c.NextWait(ctx); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("NextWait: %v, want ErrCorrupt", err)
			}
		})
	}
	t.Run("head beyond tail", func(t *testing.T) {
		_, r := newRing(t, 256)
		p, _ := r.Producer(Wait{})
		for {
			if _, err := p.Claim(8); err != nil {
				break
			}
		}
		r.head.Store(1 << 20)
		if _, err := p.Claim(8); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Claim: %v, want ErrCorrupt", err)
		}
	})
	t.Run("bad header on open", func(t *testing.T) {
		seg, r := newRing(t, 256)
		binary.LittleEndian.PutUint64(r.mem[spscOffCap:], 1<<50)
		if _, err := OpenSPSC(seg, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("OpenSPSC: %v", err)
		}
		binary.LittleEndian.PutUint64(r.mem[spscOffCap:], 1<<20)
		if _, err := OpenSPSC(seg, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("OpenSPSC with a capacity past the segment: %v", err)
		}
		r.mem[0] ^= 0xff
		if _, err := OpenSPSC(seg, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("OpenSPSC with bad magic: %v", err)
		}
	})
}
