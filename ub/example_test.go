package ub_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ubkit-io/ubkit/ub"
	_ "github.com/ubkit-io/ubkit/ub/provider/shmprov"
)

// One process plays both sides here; normally the descriptor and token go
// to another process, which imports the segment and writes into it.
func Example() {
	c, err := ub.Open(context.Background(), "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	target, _ := c.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessWrite, Token: 42})
	local, _ := c.AllocSegment(4096, ub.SegmentConfig{})
	cq, _ := c.NewCQ(ub.CQConfig{})
	j, _ := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})

	remote, _ := c.ImportSegment(target.Desc(), 42)
	copy(local.Bytes(), "hello, bus")
	j.PostSend([]ub.WR{
		{Op: ub.OpWrite, UserCtx: 1, Local: ub.Local{Seg: local, Len: 10}, Remote: ub.Remote{Seg: remote, Offset: 100}},
		{Op: ub.OpWrite, UserCtx: 2, Local: ub.Local{Seg: local, Len: 10}, Remote: ub.Remote{Seg: remote, Offset: 4090}},
	})
	out := make([]ub.Completion, 2)
	n, _ := cq.Poll(out)
	for _, comp := range out[:n] {
		fmt.Println(comp.UserCtx, comp.Status)
	}
	fmt.Println(string(target.Bytes()[100:110]))
	// Output:
	// 1 success
	// 2 out of bounds
	// hello, bus
}

func ExampleOpen_unknownProvider() {
	_, err := ub.Open(context.Background(), "rdma", ub.Config{})
	fmt.Println(err != nil)
	// Output: true
}

// A waiter that sleeps on a CQ while something else may become due reads
// the interrupt count first: an Interrupt made after that, even before the
// wait begins, ends the wait.
func ExampleInterrupter() {
	c, err := ub.Open(context.Background(), "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	cq, _ := c.NewCQ(ub.CQConfig{})
	q, ok := cq.(ub.Interrupter)
	if !ok {
		return // Wait ends only at a completion, ctx's end or Close
	}
	since := q.Interrupts()
	done := make(chan error)
	go func() { done <- q.WaitInterrupt(context.Background(), since) }()
	q.Interrupt()
	fmt.Println("wait:", <-done)
	n, _ := cq.Poll(make([]ub.Completion, 1))
	fmt.Println("completions:", n)
	// Output:
	// wait: <nil>
	// completions: 0
}

// Calls that cannot be queued fail with errors that match ub's sentinels,
// whichever provider made them.
func Example_errors() {
	c, err := ub.Open(context.Background(), "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	seg, _ := c.AllocSegment(4096, ub.SegmentConfig{})
	cq, _ := c.NewCQ(ub.CQConfig{})
	j, _ := c.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq, RecvDepth: 2})
	recvs := make([]ub.RecvWR, 3)
	for i := range recvs {
		recvs[i] = ub.RecvWR{UserCtx: uint64(i), Buf: ub.Local{Seg: seg, Offset: 64 * i, Len: 64}}
	}
	n, err := j.PostRecv(recvs)
	fmt.Println(n, errors.Is(err, ub.ErrRecvQueueFull))
	j.Close()
	_, err = j.PostRecv(recvs)
	fmt.Println(errors.Is(err, ub.ErrClosed))
	// Output:
	// 2 true
	// true
}
