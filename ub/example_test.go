package ub_test

import (
	"context"
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
