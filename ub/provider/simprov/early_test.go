package simprov_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
)

// pathFloor is the earliest an operation of size bytes from n0 to n1 may
// arrive after it was posted: dev4's direct link, latency plus size over
// bandwidth, worked out as the simulator does (slow is the link's slow
// factor).
func pathFloor(t *testing.T, c ub.Context, size int, slow float64) time.Duration {
	t.Helper()
	cost, err := c.(*simprov.Context).Topology().PathCost("n0", "n1", int64(size))
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(float64(cost.Latency)*slow) + time.Duration(float64(size)/(cost.Bandwidth/slow)*1e9)
}

// TestNeverEarly: nothing the simulator delivers is seen before the
// simulated path allows, whoever posts the operations to the provider
// underneath (a Wait on the send queue, a Poll of it, or the jetty's
// scheduler while nobody looks), with several in flight on the link, over
// either provider underneath: every completion of n0's, and every receive
// of n1's, comes at least latency plus size over bandwidth after its post.
// A lower bound, which is correctness; how close the simulator comes to it
// is `ubctl bench ub`'s to say.
func TestNeverEarly(t *testing.T) {
	for _, over := range []string{"shm", "tcp"} {
		t.Run(over, func(t *testing.T) {
			n0, n1 := openNodeOver(t, "n0", over), openNodeOver(t, "n1", over)
			remote := importSeg(t, n0, n1)
			tgt, err := n0.c.ImportJetty(n1.j.Desc(), 1)
			if err != nil {
				t.Fatal(err)
			}
			// n1 receives into 32 slots of 4 KiB from 512 KiB on, and
			// reports each batch's receives; the writes go below.
			const slots, slotSize, recvBase = 32, 4096, 512 << 10
			post := func(slot int) {
				if _, err := n1.j.PostRecv([]ub.RecvWR{{UserCtx: uint64(slot), Buf: ub.Local{Seg: n1.seg, Offset: recvBase + slot*slotSize, Len: slotSize}}}); err != nil {
					t.Error(err)
				}
			}
			for i := range slots {
				post(i)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()

			// floors[i] is when operation i may arrive at the earliest; the
			// receiver reads it after the batch is posted (received on
			// batches), so no lock is needed. A batch of n operations
			// brings recvs receives.
			var floors []time.Time
			type batch struct{ first, n, recvs int }
			batches := make(chan batch)
			received := make(chan error)
			go func() {
				out := make([]ub.Completion, 8)
				for b := range batches {
					got := 0
					for got < b.recvs {
						if err := n1.cq.Wait(ctx); err != nil {
							received <- err
							return
						}
						k, err := n1.cq.Poll(out)
						seen := time.Now()
						if err != nil {
							received <- err
							return
						}
						for _, c := range out[:k] {
							if c.Status != ub.StatusSuccess || !c.HasImm {
								t.Errorf("receive: %v, immediate %v", c.Status, c.HasImm)
							} else if i := int(c.Imm); i < b.first || i >= b.first+b.n {
								t.Errorf("receive of operation %d in the batch of %d..%d", i, b.first, b.first+b.n-1)
							} else if seen.Before(floors[i]) {
								t.Errorf("%v of operation %d received %v before the path allows", c.Op, i, floors[i].Sub(seen))
							}
							post(int(c.UserCtx)) // a write-imm takes a receive too
							got++
						}
					}
					received <- nil
				}
			}()
			defer close(batches)

			// Each batch: one PostSend of eight requests of every kind, so
			// they queue behind each other on the link.
			makeBatch := func(first int, t0 time.Time) []ub.WR {
				sizes := []int{64, 96 << 10, 8, 8, 64, 64, 1024, slotSize} // the second is heavy: the scheduler posts it
				wrs := []ub.WR{
					{Op: ub.OpWrite, Local: ub.Local{Seg: n0.seg, Len: sizes[0]}, Remote: ub.Remote{Seg: remote}},
					{Op: ub.OpWrite, Local: ub.Local{Seg: n0.seg, Len: sizes[1]}, Remote: ub.Remote{Seg: remote, Offset: 4096}},
					{Op: ub.OpCAS, Local: ub.Local{Seg: n0.seg, Offset: 256 << 10, Len: 8}, Remote: ub.Remote{Seg: remote, Offset: 128 << 10}, Compare: 0, Swap: 0},
					{Op: ub.OpFetchAdd, Local: ub.Local{Seg: n0.seg, Offset: 256<<10 + 8, Len: 8}, Remote: ub.Remote{Seg: remote, Offset: 128<<10 + 8}, Add: 1},
					{Op: ub.OpRead, Local: ub.Local{Seg: n0.seg, Offset: 300 << 10, Len: sizes[4]}, Remote: ub.Remote{Seg: remote, Offset: 200 << 10}},
					{Op: ub.OpSendImm, Local: ub.Local{Seg: n0.seg, Len: sizes[5]}, Target: tgt},
					{Op: ub.OpWriteImm, Local: ub.Local{Seg: n0.seg, Len: sizes[6]}, Remote: ub.Remote{Seg: remote, Offset: 400 << 10}, Target: tgt},
					{Op: ub.OpSendImm, Local: ub.Local{Seg: n0.seg, Len: sizes[7]}, Target: tgt},
				}
				for k := range wrs {
					i := first + k
					wrs[k].UserCtx = uint64(i)
					wrs[k].Imm = uint64(i)
					floors = append(floors, t0.Add(pathFloor(t, n0.c, sizes[k], 1)))
				}
				return wrs
			}
			reap := func(n int, wait bool) {
				out := make([]ub.Completion, 8)
				for got := 0; got < n; {
					if wait {
						if err := n0.cq.Wait(ctx); err != nil {
							t.Fatal(err)
						}
					} else if ctx.Err() != nil {
						t.Fatalf("polled for %d completions in vain: %v", n-got, ctx.Err())
					}
					k, err := n0.cq.Poll(out)
					seen := time.Now()
					if err != nil {
						t.Fatal(err)
					}
					for _, c := range out[:k] {
						i := int(c.UserCtx)
						if c.Status != ub.StatusSuccess {
							t.Fatalf("%v of operation %d: %v", c.Op, i, c.Status)
						}
						if seen.Before(floors[i]) {
							t.Errorf("%v of operation %d completed %v before the path allows", c.Op, i, floors[i].Sub(seen))
						}
					}
					got += k
					if !wait && k == 0 {
						runtime.Gosched()
					}
				}
			}
			for _, mode := range []string{"wait", "poll", "scheduler"} {
				for range 12 {
					first := len(floors)
					t0 := time.Now()
					wrs := makeBatch(first, t0)
					if n, err := n0.j.PostSend(wrs); err != nil || n != len(wrs) {
						t.Fatalf("PostSend: %d of %d, %v", n, len(wrs), err)
					}
					batches <- batch{first, len(wrs), 3} // the two sends and the write-imm
					switch mode {
					case "wait":
						reap(len(wrs), true)
					case "poll":
						reap(len(wrs), false)
					case "scheduler":
						// Nobody looks at n0's queue until n1 has
						// everything: the scheduler alone posts.
					}
					if err := <-received; err != nil {
						t.Fatalf("%s batch from operation %d: %v", mode, first, err)
					}
					if mode == "scheduler" {
						reap(len(wrs), true)
					}
				}
			}
			for name, l := range map[string]simprov.Lateness{"posts": n0.c.(*simprov.Context).Stats().Posts, "completions": n0.c.(*simprov.Context).Stats().Completions} {
				if l.Early != 0 {
					t.Errorf("the simulator counted %d of its %s early", l.Early, name)
				}
			}
		})
	}
}

// TestStatsCountDelayedOperations: the context's Stats count each
// operation across a simulated link once when it is posted underneath, and
// its completion once when a Wait waited for it, none of them early;
// operations within the node are not counted. The link is slowed 5000
// times (to 100 ms), so every Wait starts before its completion is due
// and sleeps on a timer for most of the way.
func TestStatsCountDelayedOperations(t *testing.T) {
	n0, n1 := openNode(t, "n0"), openNode(t, "n1")
	to1, toSelf := importSeg(t, n0, n1), importSeg(t, n0, n0)
	f := n0.c.(*simprov.Context).Fabric()
	t.Cleanup(func() { f.SetLinkSlow("n0", "n1", 1) })
	const slow = 5000
	if err := f.SetLinkSlow("n0", "n1", slow); err != nil {
		t.Fatal(err)
	}
	floor := pathFloor(t, n0.c, 64, slow)
	const n = 3
	for range n {
		if c, took := n0.write(t, to1, 64); c.Status != ub.StatusSuccess || took < floor {
			t.Fatalf("write over a slowed link: %v after %v, the path allows %v", c.Status, took, floor)
		}
		if c, _ := n0.write(t, toSelf, 64); c.Status != ub.StatusSuccess {
			t.Fatalf("write within the node: %v", c.Status)
		}
	}
	st := n0.c.(*simprov.Context).Stats()
	if st.Posts.Count != n || st.Completions.Count != n || st.Posts.Early+st.Completions.Early != 0 {
		t.Fatalf("after %d writes across the link (and %d within the node): %+v", n, n, st)
	}
	if st.Completions.Max < st.Completions.P99 || st.Completions.P99 < st.Completions.P50 {
		t.Fatalf("completion lateness out of order: %+v", st.Completions)
	}
}
