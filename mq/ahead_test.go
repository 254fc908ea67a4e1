package mq

import (
	"sync"
	"testing"
	"time"
)

// TestProducerAwaitsAhead: a producer that reaches the segment this
// handle's goroutine is still making ahead waits for it and writes
// through the goroutine's mapping (whose pages a spare's zeroing faulted
// in) instead of mapping the segment itself once it exists; and the next
// segment is made ahead again. Without the wait the producer took the
// segment over after a second (its maker was held here) and wrote into
// a segment of its own.
func TestProducerAwaitsAhead(t *testing.T) {
	for _, recycle := range []bool{false, true} {
		const size = 4096
		l := newLog(t, Config{SegmentSize: size, Segments: 3, Recycle: recycle})
		pt := l.parts[0]
		ctx := timeout(t, 20*time.Second)
		const held = 5 // enough rolls first for spares under Recycle
		claimed, release := make(chan struct{}), make(chan struct{})
		var releaseOnce sync.Once
		free := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(free) // before Close, which waits for the held maker
		waiting := make(chan struct{}, 1)
		var mu sync.Mutex
		var made *mapped
		var reusedMade uint64 // pt.reused when held was made
		claim := func(hl *Log, p int, k uint64) {
			if hl == l && k == held {
				close(claimed)
				<-release
			}
		}
		await := func(ap *partition, k uint64) {
			if ap == pt && k == held {
				select {
				case waiting <- struct{}{}:
				default:
				}
			}
		}
		madeAhead := func(m *mapped) {
			if m.index == held && pt.segs[held] == m {
				mu.Lock()
				made = m
				reusedMade = pt.reused.Load()
				mu.Unlock()
			}
		}
		testSegClaimed.Store(&claim)
		testAwaitAhead.Store(&await)
		testMadeAhead.Store(&madeAhead)
		t.Cleanup(resetAheadHooks)
		b := make([]byte, 1000)
		send := func() error {
			_, err := l.Send(ctx, 0, b)
			return err
		}
		// Into segment held-1, whose producer starts making held ahead;
		// the goroutines unmapping and making segments finish at each
		// segment before (segments still mapped here are not reused).
		for in := uint64(0); pt.tail.Load() < (held-1)*size+1; {
			if now := pt.tail.Load() / size; now != in {
				l.unmapping.Wait()
				in = now
			}
			if err := send(); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-claimed:
		case <-time.After(5 * time.Second): // as below
			t.Fatalf("recycle %v: in segment %d, segment %d not made ahead", recycle, held-1, held)
		}
		done := make(chan error, 1)
		go func() {
			for pt.tail.Load() < held*size+1 {
				if err := send(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		select {
		case <-waiting:
		case err := <-done:
			free() // the maker's, for Close
			t.Fatalf("recycle %v: the producer entered segment %d while it was being made: %v", recycle, held, err)
		case <-time.After(5 * time.Second): // not a wait for the answer: without the fix it never comes
		}
		reused := pt.reused.Load()
		free()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		resetAheadHooks()
		l.unmapping.Wait()
		mu.Lock()
		m := made
		mu.Unlock()
		if cur := pt.cur.Load(); m == nil || cur != m {
			t.Fatalf("recycle %v: the producer writes into segment %d through %p, the maker's mapping is %p", recycle, held, cur, m)
		}
		if got := pt.made.Load(); got != held+2 {
			t.Fatalf("recycle %v: in segment %d, %d segments made, want %d (the next one ahead)", recycle, held, got, held+2)
		}
		mu.Lock()
		after := reusedMade
		mu.Unlock()
		if recycle && after != reused+1 {
			t.Fatalf("recycle: segment %d not made of a spare (%d segments reused before it, %d after)", held, reused, after)
		}
	}
}

func resetAheadHooks() {
	testSegClaimed.Store(nil)
	testAwaitAhead.Store(nil)
	testMadeAhead.Store(nil)
}
