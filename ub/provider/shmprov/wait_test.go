package shmprov_test

import (
	"context"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// A wait asleep on a CQ's ring holds the context's read lock; closing
// objects of the context (which takes it for writing) must end that sleep
// rather than hang behind it, and the wait then carries on.
func TestCloseDuringWait(t *testing.T) {
	c, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q, Token: 1})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.AllocSegment(4096, ub.SegmentConfig{Token: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- q.Wait(ctx) }()
	time.Sleep(20 * time.Millisecond) // let it fall asleep on the ring
	closed := make(chan error, 1)
	go func() { closed <- other.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("closing a segment hung behind a sleeping wait")
	}
	select {
	case err := <-waited:
		t.Fatalf("the wait returned (%v) with nothing to poll", err)
	case <-time.After(20 * time.Millisecond):
	}
	// Closing the jetty flushes its receives (none) and detaches the ring;
	// cancelling ends the wait.
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-waited; err != context.Canceled {
		t.Fatalf("the cancelled wait returned %v", err)
	}
}
