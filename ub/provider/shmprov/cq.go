package shmprov

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

const defaultCQDepth = 4096

// ErrCQFull is returned by a post when its completion queue has no room:
// the request is not run, so no completion is ever lost.
var ErrCQFull = errors.New("shmprov: completion queue full")

// cq holds completions of local operations in memory, and drains receive
// completions that peers push into the shared rings of the jetties whose
// RecvCQ it is.
type cq struct {
	mu      sync.Mutex
	q       []ub.Completion
	head    int
	n       int
	rings   []*shm.MPMC
	buf     []byte
	closed  bool
	changed chan struct{}
}

// NewCQ makes a completion queue.
func (c *Context) NewCQ(cfg ub.CQConfig) (ub.CQ, error) {
	depth := cfg.Depth
	if depth <= 0 {
		depth = defaultCQDepth
	}
	q := &cq{q: make([]ub.Completion, depth), buf: make([]byte, complSlotSize), changed: make(chan struct{}, 1)}
	if err := c.track(q); err != nil {
		return nil, err
	}
	return q, nil
}

// reserve checks there is room for n more local completions.
func (q *cq) room() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.q) - q.n
}

func (q *cq) push(c ub.Completion) error {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	if q.n == len(q.q) {
		q.mu.Unlock()
		return ErrCQFull
	}
	q.q[(q.head+q.n)%len(q.q)] = c
	q.n++
	q.mu.Unlock()
	select {
	case q.changed <- struct{}{}:
	default:
	}
	return nil
}

func (q *cq) attach(r *shm.MPMC) {
	q.mu.Lock()
	q.rings = append(q.rings, r)
	q.mu.Unlock()
}

func (q *cq) detach(r *shm.MPMC) {
	q.mu.Lock()
	for i, x := range q.rings {
		if x == r {
			q.rings = append(q.rings[:i], q.rings[i+1:]...)
			break
		}
	}
	q.mu.Unlock()
}

// Poll returns local completions first, then receive completions from the
// shared rings, in each ring's order.
func (q *cq) Poll(out []ub.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, ErrClosed
	}
	n := 0
	for n < len(out) && q.n > 0 {
		out[n] = q.q[q.head]
		q.head = (q.head + 1) % len(q.q)
		q.n--
		n++
	}
	for _, r := range q.rings {
		for n < len(out) {
			m, err := r.TryPop(q.buf)
			if err == shm.ErrRingEmpty {
				break
			}
			if err != nil {
				// A peer scribbled over the ring: report it, do not crash.
				return n, err
			}
			c, err := decodeCompletion(q.buf[:m])
			if err != nil {
				return n, err
			}
			out[n] = c
			n++
		}
	}
	return n, nil
}

// ready reports whether Poll would return something, moving one shared
// completion into the local queue if need be.
func (q *cq) ready() (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, ErrClosed
	}
	if q.n > 0 {
		return true, nil
	}
	for _, r := range q.rings {
		m, err := r.TryPop(q.buf)
		if err == shm.ErrRingEmpty {
			continue
		}
		if err != nil {
			return false, err
		}
		c, err := decodeCompletion(q.buf[:m])
		if err != nil {
			return false, err
		}
		q.q[(q.head+q.n)%len(q.q)] = c
		q.n++
		return true, nil
	}
	return false, nil
}

// Wait blocks until Poll has something. Local completions wake it at once;
// completions pushed by other processes are polled for, spinning for 20 µs
// and then backing off from 10 µs to 1 ms between looks.
func (q *cq) Wait(ctx context.Context) error {
	start := time.Now()
	backoff := 10 * time.Microsecond
	for {
		ok, err := q.ready()
		if ok || err != nil {
			return err
		}
		if time.Since(start) < 20*time.Microsecond {
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-q.changed:
			t.Stop()
		case <-t.C:
			backoff = min(2*backoff, time.Millisecond)
		}
	}
}

func (q *cq) Close() error {
	q.mu.Lock()
	q.closed = true
	q.rings = nil
	q.mu.Unlock()
	return nil
}
