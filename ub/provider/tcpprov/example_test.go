package tcpprov_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov" // registers "tcp"
)

// Two contexts stand for two hosts: each listens on a TCP address (here
// loopback, on a port the kernel picks) that its descriptors carry. The
// user imports the owner's segment and writes into it, then reads it
// back; each one-sided operation is a request the owner's context checks
// (token, access, bounds) and answers.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	onLoopback := ub.Config{Options: map[string]string{"listen": "127.0.0.1:0"}}

	owner, err := ub.Open(ctx, "tcp", onLoopback)
	if err != nil {
		panic(err)
	}
	defer owner.Close()
	shared, err := owner.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessWrite, Token: 7})
	if err != nil {
		panic(err)
	}

	user, err := ub.Open(ctx, "tcp", onLoopback)
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
	remote, err := user.ImportSegment(shared.Desc(), 7)
	if err != nil {
		panic(err)
	}
	forged, err := user.ImportSegment(shared.Desc(), 8) // the wrong token
	if err != nil {
		panic(err)
	}

	msg := "sent over TCP, stored in the owner's segment"
	copy(local.Bytes(), msg)
	write := ub.WR{Op: ub.OpWrite, Local: ub.Local{Seg: local, Len: len(msg)}, Remote: ub.Remote{Seg: remote, Offset: 64}}
	if _, err := jetty.PostSend([]ub.WR{write}); err != nil {
		panic(err)
	}
	fmt.Println("write:", complete(ctx, cq).Status)
	fmt.Printf("owner sees: %s\n", shared.Bytes()[64:64+len(msg)])

	read := ub.WR{Op: ub.OpRead, Local: ub.Local{Seg: local, Offset: 2048, Len: len(msg)}, Remote: ub.Remote{Seg: remote, Offset: 64}}
	if _, err := jetty.PostSend([]ub.WR{read}); err != nil {
		panic(err)
	}
	fmt.Println("read:", complete(ctx, cq).Status)
	fmt.Printf("user reads back: %s\n", local.Bytes()[2048:2048+len(msg)])

	// The owner refuses a request with the wrong token: a completion
	// status, not an error from PostSend.
	write.Remote.Seg = forged
	if _, err := jetty.PostSend([]ub.WR{write}); err != nil {
		panic(err)
	}
	fmt.Println("write with the wrong token:", complete(ctx, cq).Status)
	// Output:
	// write: success
	// owner sees: sent over TCP, stored in the owner's segment
	// read: success
	// user reads back: sent over TCP, stored in the owner's segment
	// write with the wrong token: bad token
}

// complete waits for the next completion on cq: the tcp provider's
// arrives with the owner's answer.
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
