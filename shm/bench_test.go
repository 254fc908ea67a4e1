//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"os"
	"testing"
)

// In-process benchmarks of the hot paths, producer and consumer on two
// goroutines (two cores). `ubctl bench shm` measures the same paths between
// two processes against baselines.

func BenchmarkSPSCStream64(b *testing.B) {
	_, r := newRing(b, 4<<20)
	p, _ := r.Producer(Wait{})
	c, _ := r.Consumer(Wait{})
	b.SetBytes(64)
	done := make(chan uint64)
	go func() {
		var sum uint64
		for i := 0; ; i++ {
			rec, err := c.NextWait(context.Background())
			if err != nil {
				done <- sum
				return
			}
			sum += binary.LittleEndian.Uint64(rec)
			if i&63 == 63 {
				c.Release()
			}
		}
	}()
	ctx := context.Background()
	i := 0
	for b.Loop() {
		rec, err := p.Claim(64)
		if err == ErrRingFull {
			rec, err = p.ClaimWait(ctx, 64)
		}
		if err != nil {
			b.Fatal(err)
		}
		binary.LittleEndian.PutUint64(rec, uint64(i))
		i++
		if i&63 == 0 {
			p.Commit()
		}
	}
	p.Close()
	<-done
}

func BenchmarkSPSCPingPong(b *testing.B) {
	for _, mode := range []struct {
		name string
		w    WaitMode
	}{{"spin", WaitSpin}, {"block", WaitBlock}} {
		b.Run(mode.name, func(b *testing.B) {
			seg := newSegment(b, 2*SPSCSize(4096))
			req, _ := CreateSPSC(seg, 0, 4096)
			resp, _ := CreateSPSC(seg, SPSCSize(4096), 4096)
			w := Wait{Mode: mode.w}
			reqP, _ := req.Producer(w)
			reqC, _ := req.Consumer(w)
			respP, _ := resp.Producer(w)
			respC, _ := resp.Consumer(w)
			ctx := context.Background()
			// The echo ends before the cleanup unmaps the segment it reads.
			echoed := make(chan struct{})
			defer func() { <-echoed }()
			go func() {
				defer close(echoed)
				for {
					in, err := reqC.NextWait(ctx)
					if err != nil {
						return
					}
					out, _ := respP.ClaimWait(ctx, 64)
					copy(out, in)
					respP.Commit()
					reqC.Release()
				}
			}()
			msg := make([]byte, 64)
			for b.Loop() {
				reqP.Send(ctx, msg)
				if _, err := respC.NextWait(ctx); err != nil {
					b.Fatal(err)
				}
				respC.Release()
			}
			reqP.Close()
		})
	}
}

func BenchmarkPoolLoanReturn(b *testing.B) {
	_, p := newPool(b, testPoolConfig)
	for b.Loop() {
		buf, err := p.Loan(4096)
		if err != nil {
			b.Fatal(err)
		}
		buf.Return()
	}
}

func BenchmarkMPMCPushPop(b *testing.B) {
	_, r := newMPMC(b, 1024, 64)
	msg := make([]byte, 64)
	buf := make([]byte, 64)
	for b.Loop() {
		r.TryPush(msg)
		r.TryPop(buf)
	}
}

// BenchmarkAlive is the liveness check the data path makes of a peer's
// process (every few milliseconds per peer): a peer in this process
// answers without /proc, another one reads /proc/<pid>/stat.
func BenchmarkAlive(b *testing.B) {
	parent, err := LookupProcess(os.Getppid())
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		p    Process
	}{{"self", Self()}, {"other", parent}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if !c.p.Alive() {
					b.Fatal("not alive")
				}
			}
		})
	}
}
