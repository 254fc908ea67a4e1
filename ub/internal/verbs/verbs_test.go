package verbs

import (
	"math"
	"testing"

	"github.com/ubkit-io/ubkit/ub"
)

func TestInRange(t *testing.T) {
	for _, c := range []struct {
		off, n, size int
		want         bool
	}{{0, 0, 0, true}, {0, 8, 8, true}, {1, 8, 8, false}, {-1, 1, 8, false}, {0, -1, 8, false}, {8, 0, 8, true}, {9, 0, 8, false}, {1, math.MaxInt, 8, false}} {
		if got := InRange(c.off, c.n, c.size); got != c.want {
			t.Errorf("InRange(%d, %d, %d) = %v", c.off, c.n, c.size, got)
		}
	}
}

func TestBinding(t *testing.T) {
	rm := Binding[*int]{Mode: ub.ReliableMessage}
	x, y := new(int), new(int)
	if err := rm.Bind("p", x); err == nil {
		t.Error("RM jetty bound")
	}
	if _, st := rm.Resolve(nil, false); st != ub.StatusUnsupported {
		t.Error("RM without a target resolved")
	}
	if got, st := rm.Resolve(y, true); got != y || st != ub.StatusSuccess {
		t.Error("RM with a target")
	}
	rc := Binding[*int]{Mode: ub.ReliableConnection}
	if err := rc.Bind("p", x); err != nil {
		t.Fatal(err)
	}
	if err := rc.Bind("p", y); err == nil {
		t.Error("bound twice")
	}
	if got, st := rc.Resolve(nil, false); got != x || st != ub.StatusSuccess {
		t.Error("RC default target")
	}
	if _, st := rc.Resolve(y, true); st != ub.StatusUnsupported {
		t.Error("RC sent elsewhere")
	}
}

func TestQueue(t *testing.T) {
	q := NewQueue(2)
	if !q.Reserve(2) || q.Reserve(1) {
		t.Fatal("reservations")
	}
	q.Push(ub.Completion{UserCtx: 1}, true)
	q.Push(ub.Completion{UserCtx: 2}, true)
	if q.Push(ub.Completion{UserCtx: 3}, false) {
		t.Error("pushed into a full queue")
	}
	out := make([]ub.Completion, 4)
	if n, _ := q.Pop(out); n != 2 || out[0].UserCtx != 1 || out[1].UserCtx != 2 {
		t.Errorf("pop %d %+v", n, out[:n])
	}
	q.Close()
	if _, err := q.Pop(out); err == nil {
		t.Error("pop after close")
	}
}

type fakeTarget struct{ ub.Target }

func TestBindingTarget(t *testing.T) {
	x := &fakeTarget{}
	rc := Binding[*fakeTarget]{Mode: ub.ReliableConnection}
	if _, st := rc.Target(nil); st != ub.StatusUnsupported {
		t.Error("unbound RC resolved a nil target")
	}
	rc.Bind("p", x)
	if got, st := rc.Target(nil); got != x || st != ub.StatusSuccess {
		t.Error("nil target did not resolve to the bound one")
	}
	var other ub.Target = struct{ ub.Target }{}
	if _, st := rc.Target(other); st != ub.StatusUnsupported {
		t.Error("a foreign target type was accepted")
	}
}

type closer struct{ n int }

func (*closer) Close() error { return nil }

// TestObjects: closed objects leave the set, and Drain returns the rest
// newest first.
func TestObjects(t *testing.T) {
	var s Objects
	a, b, c := &closer{1}, &closer{2}, &closer{3}
	for _, o := range []*closer{a, b, c} {
		s.Add(o)
	}
	s.Remove(b)
	s.Remove(&closer{4}) // never added
	if s.Len() != 2 {
		t.Fatalf("Len %d after removing one of three", s.Len())
	}
	got := s.Drain()
	if len(got) != 2 || got[0] != c || got[1] != a {
		t.Fatalf("Drain: %v, want c then a", got)
	}
	if s.Len() != 0 || s.Add(a) != 4 {
		t.Fatal("after Drain: not empty, or numbers reused")
	}
}

// TestQueueGrows: a deep queue starts small and grows as completions come,
// keeping their order across the ring's wrap, up to its depth and no
// further.
func TestQueueGrows(t *testing.T) {
	const depth = 100
	q := NewQueue(depth)
	if len(q.q) >= depth {
		t.Fatalf("a %d-deep queue starts with room for %d", depth, len(q.q))
	}
	out := make([]ub.Completion, depth)
	next, want := uint64(0), uint64(0)
	push := func(n int) {
		for range n {
			if !q.Push(ub.Completion{UserCtx: next}, false) {
				t.Fatalf("push %d refused with %d held", next, q.Len())
			}
			next++
		}
	}
	pop := func(n int) {
		k, _ := q.Pop(out[:n])
		for _, c := range out[:k] {
			if c.UserCtx != want {
				t.Fatalf("popped %d, want %d", c.UserCtx, want)
			}
			want++
		}
	}
	push(10)
	pop(7) // the ring's head moves on, and the next growth wraps
	push(depth - 3)
	if q.Push(ub.Completion{}, false) || q.Room() != 0 {
		t.Fatalf("a full %d-deep queue took more (room %d)", depth, q.Room())
	}
	pop(depth)
	if q.Len() != 0 || want != next {
		t.Fatalf("%d left, %d of %d popped", q.Len(), want, next)
	}
}
