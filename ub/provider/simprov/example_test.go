package simprov_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov" // registers "sim"
)

// Two contexts play nodes n0 and n1 of the shipped dev4 super node, whose
// links cost 20 µs and 5 GB/s: n1 imports n0's segment, writes into it and
// reads it back, and each operation completes no earlier than the link
// allows. Then the link is taken down, and the next write says so in its
// completion.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The fabric is the simulation's shared link state and faults; a name
	// of its own keeps this one's fault off other simulations of dev4.
	fabric := fmt.Sprintf("example-%d", os.Getpid())
	node := func(name string) ub.Context {
		c, err := ub.Open(ctx, simprov.Name, ub.Config{Options: map[string]string{
			simprov.OptTopology: "dev4", simprov.OptNode: name, simprov.OptFabric: fabric}})
		if err != nil {
			panic(err)
		}
		return c
	}
	n0, n1 := node("n0"), node("n1")
	defer n0.Close()
	defer n1.Close()
	// The fabric outlives the processes of a simulation by design; remove
	// it once the simulation is over (here, when the example returns).
	defer n1.(*simprov.Context).Fabric().Remove()

	shared, err := n0.AllocSegment(4096, ub.SegmentConfig{Access: ub.AccessWrite, Token: 7})
	if err != nil {
		panic(err)
	}
	local, err := n1.AllocSegment(4096, ub.SegmentConfig{})
	if err != nil {
		panic(err)
	}
	cq, err := n1.NewCQ(ub.CQConfig{})
	if err != nil {
		panic(err)
	}
	jetty, err := n1.NewJetty(ub.JettyConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		panic(err)
	}
	remote, err := n1.ImportSegment(shared.Desc(), 7)
	if err != nil {
		panic(err)
	}

	msg := "from n1 to n0 across a simulated link"
	copy(local.Bytes(), msg)
	write := ub.WR{Op: ub.OpWrite, Local: ub.Local{Seg: local, Len: len(msg)}, Remote: ub.Remote{Seg: remote}}
	start := time.Now()
	if _, err := jetty.PostSend([]ub.WR{write}); err != nil {
		panic(err)
	}
	status := complete(ctx, cq).Status
	fmt.Println("write:", status, "after the link's 20µs at least:", time.Since(start) >= 20*time.Microsecond)
	fmt.Printf("n0 sees: %s\n", shared.Bytes()[:len(msg)])

	read := ub.WR{Op: ub.OpRead, Local: ub.Local{Seg: local, Offset: 2048, Len: len(msg)}, Remote: ub.Remote{Seg: remote}}
	if _, err := jetty.PostSend([]ub.WR{read}); err != nil {
		panic(err)
	}
	fmt.Println("read:", complete(ctx, cq).Status)
	fmt.Printf("n1 reads back: %s\n", local.Bytes()[2048:2048+len(msg)])

	// A fault touches only the operations whose path crosses it.
	f := n1.(*simprov.Context).Fabric()
	if err := f.SetLinkDown("n0", "n1", true); err != nil {
		panic(err)
	}
	fmt.Println("link n0-n1:", f.LinkState("n0", "n1"))
	if _, err := jetty.PostSend([]ub.WR{write}); err != nil {
		panic(err)
	}
	fmt.Println("write:", complete(ctx, cq).Status)
	// Output:
	// write: success after the link's 20µs at least: true
	// n0 sees: from n1 to n0 across a simulated link
	// read: success
	// n1 reads back: from n1 to n0 across a simulated link
	// link n0-n1: down
	// write: link down
}

// complete waits for the next completion on cq: the simulation holds it
// until the operation's simulated arrival.
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
