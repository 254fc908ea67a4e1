package shmprov

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/internal/verbs"
)

const defaultCQDepth = 4096

// errCQFull is returned by a post when its completion queue has no room:
// the request is not run, so no completion is ever lost.
var errCQFull = fmt.Errorf("shmprov: %w", ub.ErrCQFull)

// cq holds completions of local operations in memory, and drains receive
// completions that peers push into the shared rings of the jetties whose
// RecvCQ it is.
type cq struct {
	c     *Context
	local *verbs.Queue
	mu    sync.Mutex // guards rings and buf
	rings []*shm.MPMC
	buf   []byte

	// nsleep counts the waits asleep on sleepRing (all on the CQ's one
	// ring): a local completion or an Interrupt kicks it, which ends the
	// sleeps.
	// A wait holds the context's read lock, so the ring stays mapped while
	// it is set.
	kmu       sync.Mutex
	nsleep    int
	sleepRing *shm.MPMC
	nrings    atomic.Int32 // len(rings)
}

// NewCQ makes a completion queue.
func (c *Context) NewCQ(cfg ub.CQConfig) (ub.CQ, error) {
	depth := cfg.Depth
	if depth <= 0 {
		depth = defaultCQDepth
	}
	q := &cq{c: c, local: verbs.NewQueue(depth), buf: make([]byte, complSlotSize)}
	q.local.OnPush(q.kickSleep)
	if err := c.track(q); err != nil {
		return nil, err
	}
	return q, nil
}

// attach adds a jetty's completion ring. A wait asleep on the CQ's one
// ring must now watch two: the count changes, and the sleep is kicked.
func (q *cq) attach(r *shm.MPMC) {
	q.mu.Lock()
	q.rings = append(q.rings, r)
	q.nrings.Store(int32(len(q.rings)))
	q.mu.Unlock()
	q.kickSleep()
}

func (q *cq) detach(r *shm.MPMC) {
	q.mu.Lock()
	for i, x := range q.rings {
		if x == r {
			q.rings = append(q.rings[:i], q.rings[i+1:]...)
			q.nrings.Store(int32(len(q.rings)))
			break
		}
	}
	q.mu.Unlock()
}

// Poll returns local completions first, then receive completions from the
// shared rings, in each ring's order.
func (q *cq) Poll(out []ub.Completion) (int, error) {
	q.c.ops.RLock()
	defer q.c.ops.RUnlock()
	n, err := q.local.Pop(out)
	if err != nil {
		return n, errClosed
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range q.rings {
		for n < len(out) {
			c, ok, err := q.popRing(r)
			if err != nil || !ok {
				if err != nil {
					// A peer scribbled over the ring: report it, do not crash.
					return n, err
				}
				break
			}
			out[n] = c
			n++
		}
	}
	return n, nil
}

func (q *cq) popRing(r *shm.MPMC) (ub.Completion, bool, error) {
	m, err := r.TryPop(q.buf)
	if err == shm.ErrRingEmpty {
		return ub.Completion{}, false, nil
	}
	if err != nil {
		return ub.Completion{}, false, err
	}
	c, err := decodeCompletion(q.buf[:m])
	return c, err == nil, err
}

// ready reports whether Poll would return something, moving one shared
// completion into the local queue if need be.
func (q *cq) ready() (bool, error) {
	q.c.ops.RLock()
	defer q.c.ops.RUnlock()
	if q.local.Closed() {
		return false, errClosed
	}
	if q.local.Len() > 0 {
		return true, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range q.rings {
		c, ok, err := q.popRing(r)
		if err != nil {
			return false, err
		}
		if ok {
			q.local.Push(c, false)
			return true, nil
		}
	}
	return false, nil
}

// Interrupt makes the waits in progress return although Poll may have
// nothing (ub.Interrupter): simprov's own completions end its waits this
// way.
func (q *cq) Interrupt() { q.local.Interrupt() }

// Interrupts is how many times Interrupt was called.
func (q *cq) Interrupts() uint64 { return q.local.Interrupts() }

func (q *cq) Wait(ctx context.Context) error { return q.WaitInterrupt(ctx, q.local.Interrupts()) }

// WaitInterrupt blocks until Poll has something, or Interrupt was called
// since Interrupts returned since. Local completions wake it at once.
// For completions other contexts push (other processes, or other nodes of a
// simulation), when they can come from one ring only, the wait sleeps on
// that ring's bell in Go's netpoller (or its futex, without a bell), which
// a push rings; with several rings it backs off from 10 µs to 1 ms between
// looks. It does not poll first: a polling goroutine keeps Go's netpoller
// from running on its processor (see simprov's Wait).
func (q *cq) WaitInterrupt(ctx context.Context, since uint64) error {
	backoff := 10 * time.Microsecond
	for {
		changed := q.local.Changed() // before the look: a later push closes it
		ok, err := q.ready()
		if ok || err != nil {
			return err
		}
		if q.local.Interrupts() != since {
			return nil
		}
		if q.waitRing(ctx, since) {
			if err := ctx.Err(); err != nil {
				return err
			}
			// The deadline's timer may not have fired yet: without this
			// look at the clock, every wait until it does returns at once.
			if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
				return context.DeadlineExceeded
			}
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
			t.Stop()
		case <-t.C:
			backoff = min(2*backoff, time.Millisecond)
		}
	}
}

// waitRing sleeps on the CQ's one ring (its bell, or its futex) until a
// push to the ring, a local completion, an Interrupt since since, or a Close
// that wants the context's lock; it reports false if the CQ has several
// rings. The context's read lock is held meanwhile, so the ring is not
// unmapped under the wait.
func (q *cq) waitRing(ctx context.Context, since uint64) bool {
	q.c.ops.RLock()
	defer q.c.ops.RUnlock()
	if q.local.Closed() {
		return false
	}
	q.mu.Lock()
	var only *shm.MPMC
	if len(q.rings) == 1 {
		only = q.rings[0]
	}
	q.mu.Unlock()
	if only == nil {
		return false
	}
	// Announce the sleep before the wait's looks at the local queue: a
	// push after a look kicks the ring.
	q.kmu.Lock()
	if q.nsleep++; q.nsleep == 1 {
		q.sleepRing = only
		q.c.smu.Lock()
		q.c.sleeping[q] = struct{}{}
		q.c.smu.Unlock()
	}
	q.kmu.Unlock()
	// A Close waiting for the lock we hold ends the sleep too.
	only.WaitNotEmptyOr(ctx, func() bool {
		return q.local.Len() > 0 || q.local.Interrupts() != since || q.c.opsWanted.Load() > 0 || q.nrings.Load() != 1
	})
	q.kmu.Lock()
	if q.nsleep--; q.nsleep == 0 {
		q.sleepRing = nil
		q.c.smu.Lock()
		delete(q.c.sleeping, q)
		q.c.smu.Unlock()
	}
	q.kmu.Unlock()
	return true
}

// kickSleep ends the sleeps on the CQ's ring, if any.
func (q *cq) kickSleep() {
	q.kmu.Lock()
	if q.sleepRing != nil {
		q.sleepRing.Kick()
	}
	q.kmu.Unlock()
}

func (q *cq) Close() error {
	q.c.lockOps()
	defer q.c.ops.Unlock()
	q.mu.Lock()
	q.rings = nil
	q.mu.Unlock()
	q.c.untrack(q)
	return q.local.Close()
}
