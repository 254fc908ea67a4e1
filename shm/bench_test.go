//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"
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

// BenchmarkSegmentRoll measures what one 8 MiB segment costs a log that
// fills it and moves on (docs/PERFORMANCE.md, "log-100B-p99: the
// machine's floor"): its writer's first touch of every page (the kernel
// makes and zeroes each), a second mapping's first read of every page,
// the munmap of the reader's and of the writer's mapping, and the Close
// that frees the pages (the segment unlinked, nothing else holding it).
// Each phase is reported in µs per segment.
func BenchmarkSegmentRoll(b *testing.B) {
	const size = 8 << 20
	var write, read, unmapReader, unmapWriter, free time.Duration
	for i := 0; b.Loop(); i++ {
		name := fmt.Sprintf("%s-%d", testName(b), i)
		w, err := CreateSegment(name, size, &SegmentConfig{Keep: true})
		if err != nil {
			b.Fatal(err)
		}
		r, err := OpenSegment(name)
		if err != nil {
			b.Fatal(err)
		}
		last, err := OpenSegment(name) // removes it, and is the last to hold it
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		wd := w.Data()
		for j := 0; j < len(wd); j += 4096 {
			wd[j] = 1
		}
		t1 := time.Now()
		sum := 0
		rd := r.Data()
		for j := 0; j < len(rd); j += 4096 {
			sum += int(rd[j])
		}
		t2 := time.Now()
		r.Close()
		t3 := time.Now()
		w.Close() // Keep: the name and the pages stay
		t4 := time.Now()
		if err := last.Unlink(); err != nil {
			b.Fatal(err)
		}
		t5 := time.Now()
		last.Close() // its mapping untouched; the pages go with the file
		t6 := time.Now()
		if sum != len(rd)/4096 {
			b.Fatalf("read %d pages of 1s, want %d", sum, len(rd)/4096)
		}
		write += t1.Sub(t0)
		read += t2.Sub(t1)
		unmapReader += t3.Sub(t2)
		unmapWriter += t4.Sub(t3)
		free += t6.Sub(t5)
	}
	n := float64(b.N)
	b.ReportMetric(float64(write.Microseconds())/n, "µs-write-faults")
	b.ReportMetric(float64(read.Microseconds())/n, "µs-read-faults")
	b.ReportMetric(float64(unmapReader.Microseconds())/n, "µs-munmap-reader")
	b.ReportMetric(float64(unmapWriter.Microseconds())/n, "µs-munmap-writer")
	b.ReportMetric(float64(free.Microseconds())/n, "µs-free")
}
