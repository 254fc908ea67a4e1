// Package verbs holds the pieces every ub provider needs the same way: the
// range checks of buffers, the reliable-connection binding rules, an
// in-memory completion queue and the set of a context's open objects. It
// is not for users: providers import it.
package verbs

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/ubkit-io/ubkit/ub"
)

// InRange reports whether [off, off+n) lies inside a buffer of size bytes,
// without overflowing.
func InRange(off, n, size int) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}

// Binding applies the reliable-connection rules to a jetty's target: only
// an RC jetty binds, once; an RC jetty sends only to its bound target; any
// jetty without a target falls back to the bound one. T is the provider's
// target type. Binding is not safe for concurrent use: its jetty's lock
// guards it.
type Binding[T comparable] struct {
	Mode  ub.Mode
	bound T
	set   bool
}

// Bind ties the jetty to t. provider prefixes the errors.
func (b *Binding[T]) Bind(provider string, t T) error {
	if b.Mode != ub.ReliableConnection {
		return fmt.Errorf("%s: %w: Bind is for reliable-connection jetties, this one is %v", provider, ub.ErrInvalidArgument, b.Mode)
	}
	if b.set {
		return fmt.Errorf("%s: %w: jetty already bound", provider, ub.ErrInvalidArgument)
	}
	b.bound, b.set = t, true
	return nil
}

// Bound returns the bound target, if any.
func (b *Binding[T]) Bound() (T, bool) { return b.bound, b.set }

// Resolve picks the target of a work request: t when given (refused on an
// RC jetty bound elsewhere), else the bound one. It returns
// StatusUnsupported when there is none.
func (b *Binding[T]) Resolve(t T, given bool) (T, ub.Status) {
	var zero T
	if !given {
		if !b.set {
			return zero, ub.StatusUnsupported
		}
		return b.bound, ub.StatusSuccess
	}
	if b.Mode == ub.ReliableConnection && b.set && t != b.bound {
		return zero, ub.StatusUnsupported
	}
	return t, ub.StatusSuccess
}

// Target resolves a work request's Target given as a ub.Target: nil means
// the bound one; a target of another provider (not a T) is unsupported.
func (b *Binding[T]) Target(t ub.Target) (T, ub.Status) {
	var zero T
	if t == nil {
		return b.Resolve(zero, false)
	}
	tg, ok := t.(T)
	if !ok {
		return zero, ub.StatusUnsupported
	}
	return b.Resolve(tg, true)
}

// Queue is a bounded in-memory completion queue. Posts reserve room for the
// completions they will produce, so a completion is never dropped for want
// of space. Safe for concurrent use.
type Queue struct {
	mu sync.Mutex
	// q is a ring of the completions held, grown as needed up to depth:
	// a connection's queues hold a few, and a 4096-deep ring made for each
	// cost every connection 230 KB up front.
	q        []ub.Completion
	depth    int
	head, n  int
	reserved int
	closed   bool
	onPush   atomic.Pointer[func()]
	intrs    atomic.Uint64
	bmu      sync.Mutex
	bcast    chan struct{} // closed at the next push, interrupt or close, if made
}

// OnPush sets a function every later Push, Interrupt and Close call: for a
// waiter that sleeps on something else as well.
func (q *Queue) OnPush(f func()) { q.onPush.Store(&f) }

// Interrupt makes the waits on the queue in progress return although
// nothing was pushed (ub.Interrupter). It counts the interrupt, closes
// Changed's channel and calls the OnPush function; a wait returns once
// Interrupts differs from what it was when its caller last looked.
func (q *Queue) Interrupt() {
	q.intrs.Add(1)
	q.pushed()
}

// Interrupts is how many times Interrupt was called.
func (q *Queue) Interrupts() uint64 { return q.intrs.Load() }

// Changed returns a channel closed at the next Push, Interrupt or Close, which
// wakes every wait that took it. Take it before looking at the queue.
func (q *Queue) Changed() <-chan struct{} {
	q.bmu.Lock()
	defer q.bmu.Unlock()
	if q.bcast == nil {
		q.bcast = make(chan struct{})
	}
	return q.bcast
}

func (q *Queue) pushed() {
	q.bmu.Lock()
	if q.bcast != nil {
		close(q.bcast)
		q.bcast = nil
	}
	q.bmu.Unlock()
	if f := q.onPush.Load(); f != nil {
		(*f)()
	}
}

// NewQueue makes a queue holding up to depth completions.
func NewQueue(depth int) *Queue {
	return &Queue{q: make([]ub.Completion, min(depth, minRing)), depth: depth}
}

// minRing is the ring a queue starts with.
const minRing = 16

// Reserve sets room aside for n completions; it reports false if there is
// not that much room.
func (q *Queue) Reserve(n int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n+q.reserved+n > q.depth {
		return false
	}
	q.reserved += n
	return true
}

// Push adds a completion, using one reservation if reserved. It reports
// false when the queue is closed, or (unreserved) has no room that is not
// promised to a reservation.
func (q *Queue) Push(c ub.Completion, reserved bool) bool {
	q.mu.Lock()
	if reserved && q.reserved > 0 {
		q.reserved--
	} else if q.n+q.reserved >= q.depth {
		// Room promised to requests in flight is theirs.
		q.mu.Unlock()
		return false
	}
	if q.closed || q.n == q.depth {
		q.mu.Unlock()
		return false
	}
	if q.n == len(q.q) {
		q.grow()
	}
	q.q[(q.head+q.n)%len(q.q)] = c
	q.n++
	q.mu.Unlock()
	q.pushed()
	return true
}

// grow doubles the ring (at most to depth), oldest first (mu held).
func (q *Queue) grow() {
	ring := make([]ub.Completion, min(2*len(q.q), q.depth))
	k := copy(ring, q.q[q.head:])
	copy(ring[k:], q.q[:q.head])
	q.q, q.head = ring, 0
}

// Pop moves up to len(out) completions into out, oldest first. A closed
// queue returns ub.ErrClosed.
func (q *Queue) Pop(out []ub.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return 0, ub.ErrClosed
	}
	n := 0
	for n < len(out) && q.n > 0 {
		out[n] = q.q[q.head]
		q.head = (q.head + 1) % len(q.q)
		q.n--
		n++
	}
	return n, nil
}

// Len returns how many completions are waiting.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// Close makes later calls fail and wakes a waiter.
func (q *Queue) Close() error {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.pushed()
	return nil
}

// Closed reports whether Close was called.
func (q *Queue) Closed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// Room reports how many more unreserved completions fit.
func (q *Queue) Room() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.depth - q.n - q.reserved
}

// Objects is the set of objects a context made and that are still open,
// for the context's Close to close. An object leaves it when it is closed
// on its own, so a long-lived context holds only what is open: a set that
// only grew kept every closed connection's objects, and what they
// reference, for the context's lifetime. Objects is not safe for
// concurrent use: its context's lock guards it.
type Objects struct {
	seq uint64
	m   map[io.Closer]uint64 // object -> when it was made
}

// Add adds o and returns a number, unique in the set's lifetime, that
// orders it after every object added before.
func (s *Objects) Add(o io.Closer) uint64 {
	if s.m == nil {
		s.m = map[io.Closer]uint64{}
	}
	s.seq++
	s.m[o] = s.seq
	return s.seq
}

// Remove takes o out (it was closed); removing an object not in the set
// does nothing.
func (s *Objects) Remove(o io.Closer) { delete(s.m, o) }

// Len is how many objects are in the set.
func (s *Objects) Len() int { return len(s.m) }

// Drain empties the set and returns its objects newest first, the order to
// close them in (a jetty before the queues it uses).
func (s *Objects) Drain() []io.Closer {
	objs := make([]io.Closer, 0, len(s.m))
	for o := range s.m {
		objs = append(objs, o)
	}
	slices.SortFunc(objs, func(a, b io.Closer) int { return cmp.Compare(s.m[b], s.m[a]) })
	s.m = nil
	return objs
}
