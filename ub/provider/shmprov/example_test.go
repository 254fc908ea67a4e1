package shmprov_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/shm"
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

// Memory the owner already has, in a named shm segment (a log's partition,
// say), registered so that a peer writes into it one-sided. Deregistering
// leaves the memory to the owner.
func ExampleContext_RegisterSegment() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	part, err := shm.CreateSegment(fmt.Sprintf("example-partition-%d", os.Getpid()), 4096, nil)
	if err != nil {
		panic(err)
	}
	defer part.Close()

	owner, err := ub.Open(ctx, "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	reg, err := owner.RegisterSegment(part.Data()[1024:2048], ub.SegmentConfig{Access: ub.AccessWrite, Token: 7})
	if err != nil {
		panic(err)
	}

	user, err := ub.Open(ctx, "shm", ub.Config{})
	if err != nil {
		panic(err)
	}
	defer user.Close()
	local, _ := user.AllocSegment(64, ub.SegmentConfig{})
	cq, _ := user.NewCQ(ub.CQConfig{})
	jetty, _ := user.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	remote, err := user.ImportSegment(reg.Desc(), 7)
	if err != nil {
		panic(err)
	}
	copy(local.Bytes(), "entry 1")
	if _, err := jetty.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: local, Len: 7}, Remote: ub.Remote{Seg: remote}}}); err != nil {
		panic(err)
	}
	fmt.Println("write:", complete(ctx, cq).Status)
	fmt.Printf("the partition holds: %s\n", part.Data()[1024:1031])

	reg.Close() // deregister: the peer's next write is refused
	if _, err := jetty.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: local, Len: 7}, Remote: ub.Remote{Seg: remote}}}); err != nil {
		panic(err)
	}
	fmt.Println("write after Close:", complete(ctx, cq).Status)
	copy(part.Data()[1024:], "entry 2") // still the owner's memory
	fmt.Printf("the partition holds: %s\n", part.Data()[1024:1031])
	// Output:
	// write: success
	// the partition holds: entry 1
	// write after Close: no permission
	// the partition holds: entry 2
}
