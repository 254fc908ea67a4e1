package shmprov_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	_ "github.com/ubkit-io/ubkit/ub/provider/shmprov" // registers "shm"
)

// Two contexts stand for two processes on one host: the owner registers a
// segment and hands its descriptor and token to the user, which imports it
// and writes into it, then reads it back, with one-sided operations. The
// bytes move by loads and stores in shared memory; the owner's CPU takes
// no part.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	owner, err := ub.Open(ctx, "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	shared, err := owner.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessWrite, Token: 7})
	if err != nil {
		panic(err)
	}
	desc := shared.Desc() // plain data: send it to the peer any way you like

	user, err := ub.Open(ctx, "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer user.Close()
	local, err := user.AllocSegment(4096, ub.SegmentConfig{})
	if err != nil {
		panic(err)
	}
	cq, err := user.NewCQ(ub.CQConfig{})
	if err != nil {
		panic(err)
	}
	jetty, err := user.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		panic(err)
	}
	remote, err := user.ImportSegment(desc, 7)
	if err != nil {
		panic(err)
	}

	msg := "written by the user, stored in the owner's memory"
	copy(local.Bytes(), msg)
	if _, err := jetty.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: local, Len: len(msg)}, Remote: ub.Remote{Seg: remote, Offset: 128}}}); err != nil {
		panic(err)
	}
	fmt.Println("write:", complete(ctx, cq).Status)
	fmt.Printf("owner sees: %s\n", shared.Bytes()[128:128+len(msg)])

	// Read it back into another part of the user's own segment.
	if _, err := jetty.PostSend([]ub.WR{{Op: ub.OpRead, Local: ub.Local{Seg: local, Offset: 2048, Len: len(msg)}, Remote: ub.Remote{Seg: remote, Offset: 128}}}); err != nil {
		panic(err)
	}
	fmt.Println("read:", complete(ctx, cq).Status)
	fmt.Printf("user reads back: %s\n", local.Bytes()[2048:2048+len(msg)])
	// Output:
	// write: success
	// owner sees: written by the user, stored in the owner's memory
	// read: success
	// user reads back: written by the user, stored in the owner's memory
}

// complete waits for the next completion on cq. The shm provider runs an
// operation when it is posted, so the completion is already there; the
// loop is what works with every provider.
func complete(ctx context.Context, cq ub.CQ) ub.Completion {
	out := make([]ub.Completion, 1)
	for {
		if n, err := cq.Poll(out); err != nil {
			panic(err)
		} else if n == 1 {
			return out[0]
		}
		if err := cq.Wait(ctx); err != nil {
			panic(err)
		}
	}
}
