package supernode

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
)

// stubDiscovery answers ServerResourcesForGroupVersion with answer,
// counting the calls; while block is not nil, each call first says so
// on entered and waits for block to be closed.
type stubDiscovery struct {
	discovery.DiscoveryInterface
	calls   atomic.Int32
	entered chan struct{}
	block   chan struct{}

	mu     sync.Mutex
	answer error // nil: HyperNode is served
}

func (d *stubDiscovery) ServerResourcesForGroupVersion(string) (*metav1.APIResourceList, error) {
	d.calls.Add(1)
	if d.block != nil {
		d.entered <- struct{}{}
		<-d.block
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.answer != nil {
		return nil, d.answer
	}
	return &metav1.APIResourceList{APIResources: []metav1.APIResource{{Name: "hypernodes", Kind: HyperNodeGVK.Kind}}}, nil
}

func (d *stubDiscovery) set(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.answer = err
}

// fakeClock is a time that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// A failure of discovery is remembered for hyperNodeFailRecheck, so that
// reconciles while it fails do not each ask again; an answer is
// remembered for recheck.
func TestHyperNodeProbeRemembersFailure(t *testing.T) {
	down := errors.New("the apiserver is unavailable")
	d := &stubDiscovery{}
	d.set(down)
	clock := &fakeClock{t: time.Now()}
	p := &hyperNodeProbe{disco: d, now: clock.now, recheck: hyperNodeRecheck}
	for i := range 8 {
		if _, err := p.Served(); !errors.Is(err, down) {
			t.Fatalf("call %d: %v, want discovery's error", i+1, err)
		}
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("8 calls while discovery fails: %d requests, want 1", n)
	}
	clock.advance(hyperNodeFailRecheck - time.Millisecond)
	if _, err := p.Served(); !errors.Is(err, down) || d.calls.Load() != 1 {
		t.Errorf("within %v of the failure: %v, %d requests; want the failure again, 1 request", hyperNodeFailRecheck, err, d.calls.Load())
	}
	d.set(nil)
	clock.advance(time.Millisecond)
	if served, err := p.Served(); !served || err != nil || d.calls.Load() != 2 {
		t.Errorf("%v after the failure: %v, %v, %d requests; want served, asked again", hyperNodeFailRecheck, served, err, d.calls.Load())
	}
	d.set(down)
	clock.advance(hyperNodeRecheck - time.Millisecond)
	if served, err := p.Served(); !served || err != nil || d.calls.Load() != 2 {
		t.Errorf("within %v of an answer: %v, %v, %d requests; want the answer, not asked again", hyperNodeRecheck, served, err, d.calls.Load())
	}
}

// While a request is in flight no lock is held: a caller with an answer
// to go on, though an old one, gets it at once; one without waits for
// that request's answer rather than making another.
func TestHyperNodeProbeInFlight(t *testing.T) {
	d := &stubDiscovery{entered: make(chan struct{}, 1), block: make(chan struct{})}
	clock := &fakeClock{t: time.Now()}
	p := &hyperNodeProbe{disco: d, now: clock.now, recheck: hyperNodeRecheck}

	type answer struct {
		served bool
		err    error
	}
	ask := func() <-chan answer {
		c := make(chan answer, 1)
		go func() {
			s, err := p.Served()
			c <- answer{s, err}
		}()
		return c
	}
	// The first request, and one more caller, before any answer.
	first := ask()
	<-d.entered
	second := ask()
	close(d.block)
	for _, c := range []<-chan answer{first, second} {
		if a := <-c; !a.served || a.err != nil {
			t.Errorf("answer %+v, want served", a)
		}
	}
	if n := d.calls.Load(); n != 1 {
		t.Errorf("%d requests, want 1", n)
	}

	// The answer old now: one caller asks again, and the others, while
	// that request waits, get the old answer.
	clock.advance(hyperNodeRecheck)
	d.block = make(chan struct{})
	d.set(errors.New("slow, then down"))
	asking := ask()
	<-d.entered
	for i := range 7 {
		select {
		case a := <-ask():
			if !a.served || a.err != nil {
				t.Errorf("caller %d while a request is in flight: %+v, want the last answer (served)", i+1, a)
			}
		case <-time.After(waitBound):
			t.Fatalf("caller %d waited on the request in flight though an answer was known", i+1)
		}
	}
	close(d.block)
	if a := <-asking; a.err == nil {
		t.Errorf("the request in flight: %+v, want its error", a)
	}
	if n := d.calls.Load(); n != 2 {
		t.Errorf("%d requests, want 2", n)
	}
}
