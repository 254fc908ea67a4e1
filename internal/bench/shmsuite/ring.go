package shmsuite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/shm"
)

var segCounter atomic.Uint64

// ringSetup makes a segment holding two SPSC rings (and, for the zero-copy
// case, a pool) and starts the peer that serves them.
type ringSetup struct {
	seg      *shm.Segment
	a, b     *shm.SPSC // a: parent to peer, b: peer to parent
	pool     *shm.Pool
	peer     *bench.Peer
	capA     int
	capB     int
	waitMode shm.WaitMode
	p        *shm.Producer
	c        *shm.Consumer
	ctx      context.Context
	cancel   context.CancelFunc
}

var zeroCopyPool = shm.PoolConfig{Classes: []shm.PoolClass{{Size: 256, Count: 16}, {Size: mib, Count: zeroCopyBuffers}}}

// layout returns the offsets of ring a, ring b and the pool.
func layout(capA, capB int, withPool bool) (offA, offB, offPool, size int) {
	align := func(n int) int { return (n + 4095) &^ 4095 }
	offB = align(shm.SPSCSize(capA))
	size = offB + align(shm.SPSCSize(capB))
	if withPool {
		offPool = size
		ps, _ := shm.PoolSize(zeroCopyPool)
		size += ps
	}
	return offA, offB, offPool, size
}

// startRing makes the segment, starts the peer, attaches this process's
// ends and gives them a context that outlasts a run of d.
func startRing(caseName string, capA, capB int, withPool bool, wait shm.WaitMode, d time.Duration) (*ringSetup, error) {
	offA, offB, offPool, size := layout(capA, capB, withPool)
	name := fmt.Sprintf("bench-%d-%d", os.Getpid(), segCounter.Add(1))
	seg, err := shm.CreateSegment(name, size, &shm.SegmentConfig{Populate: true})
	if err != nil {
		return nil, err
	}
	s := &ringSetup{seg: seg, capA: capA, capB: capB, waitMode: wait}
	fail := func(err error) (*ringSetup, error) { seg.Close(); return nil, err }
	if s.a, err = shm.CreateSPSC(seg, offA, capA); err != nil {
		return fail(err)
	}
	if s.b, err = shm.CreateSPSC(seg, offB, capB); err != nil {
		return fail(err)
	}
	if withPool {
		if s.pool, err = shm.CreatePool(seg, offPool, zeroCopyPool); err != nil {
			return fail(err)
		}
	}
	s.peer, err = bench.StartPeer("shm-ring", peerArgs{Case: caseName, Addr: name, Wait: wait, Size: capA<<20 | capB, Extra: time.Duration(offPool)})
	if err != nil {
		return fail(err)
	}
	if s.p, s.c, err = s.ends(); err != nil {
		s.close()
		return nil, err
	}
	s.ctx, s.cancel = context.WithTimeout(context.Background(), d+10*time.Second)
	return s, nil
}

func (s *ringSetup) close() {
	if s.cancel != nil {
		s.cancel()
	}
	s.peer.Kill()
	s.seg.Close()
}

// ends attaches this process as producer of a and consumer of b.
func (s *ringSetup) ends() (*shm.Producer, *shm.Consumer, error) {
	w := waitFor(s.waitMode)
	p, err := s.a.Producer(w)
	if err != nil {
		return nil, nil, err
	}
	c, err := s.b.Consumer(w)
	return p, c, err
}

func shmPingPong(d time.Duration, wait shm.WaitMode) (bench.Measurement, error) {
	s, err := startRing("pingpong", 4096, 4096, false, wait, d)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	p, c, ctx := s.p, s.c, s.ctx
	samples := make([]float64, 0, 1<<20)
	start := time.Now()
	for i := uint64(0); ; i++ {
		t0 := time.Now()
		if t0.Sub(start) > d {
			break
		}
		out, err := p.ClaimWait(ctx, 64)
		if err != nil {
			return bench.Measurement{}, err
		}
		bench.Fill(out, i)
		want := bench.FillSum(64, i)
		p.Commit()
		in, err := c.NextWait(ctx)
		if err != nil {
			return bench.Measurement{}, err
		}
		if got := binary.LittleEndian.Uint64(in); got != want {
			return bench.Measurement{}, fmt.Errorf("reply checksum %x, want %x", got, want)
		}
		_ = bench.Sum(in)
		c.Release()
		samples = append(samples, float64(time.Since(t0)))
	}
	p.Close()
	if err := s.peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Samples: samples, Value: median(samples)}, nil
}

func shmStream(d time.Duration, size int, copyIn bool) (bench.Measurement, error) {
	// A ring of a few MiB streams fastest here: the producer then writes
	// lines the consumer's cache no longer holds (measured: 64 KiB to 1 MiB
	// rings run at a third of the rate; see docs/PERFORMANCE.md).
	capA := 4 * mib
	s, err := startRing("stream", capA, 4096, false, shm.WaitBlock, d)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	p, c, ctx := s.p, s.c, s.ctx
	var n, sum uint64
	start := time.Now()
	if copyIn {
		// The Send path: the payload is produced in private memory and
		// copied into the ring; the receiver reads it in place.
		payload := make([]byte, size)
		for time.Since(start) < d {
			bench.Fill(payload, n)
			sum += bench.FillSum(size, n)
			if err := p.Send(ctx, payload); err != nil {
				return bench.Measurement{}, err
			}
			n++
		}
	} else {
		for time.Since(start) < d {
			for range Batch {
				b, err := p.Claim(size)
				if err == shm.ErrRingFull {
					b, err = p.ClaimWait(ctx, size)
				}
				if err != nil {
					return bench.Measurement{}, err
				}
				bench.Fill(b, n)
				n++
			}
			sum += bench.FillSums(size, n-Batch, Batch)
			p.Commit()
		}
	}
	p.Close()
	res, err := c.NextWait(ctx)
	if err != nil {
		return bench.Measurement{}, fmt.Errorf("read result: %w", err)
	}
	elapsed := time.Since(start)
	if err := checkResult(res, n, sum, size); err != nil {
		return bench.Measurement{}, err
	}
	c.Release()
	return streamValue(n, size, elapsed), nil
}

// zeroCopyBuffers is how many 1 MiB pool buffers the sender rotates
// through. It reuses them oldest first: the buffer the receiver finished
// last is still in the receiver's cache, and writing it at once would pull
// every line back across cores.
const zeroCopyBuffers = 8

func shmZeroCopy(d time.Duration) (bench.Measurement, error) {
	s, err := startRing("zerocopy", 4096, 4096, true, shm.WaitBlock, d)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer s.close()
	p, c, ctx := s.p, s.c, s.ctx
	// Loan the buffers once; the receiver hands each back by handle when it
	// has read it, and the sender refills the oldest.
	var free []shm.Buffer
	for range zeroCopyBuffers {
		b, err := s.pool.Loan(mib)
		if err != nil {
			return bench.Measurement{}, err
		}
		free = append(free, b)
	}
	back := func(rec []byte) error {
		var h shm.Handle
		if err := h.UnmarshalBinary(rec); err != nil {
			return err
		}
		b, err := s.pool.Resolve(h)
		if err != nil {
			return err
		}
		free = append(free, b)
		return nil
	}
	var n, sum uint64
	var h [shm.HandleSize]byte
	start := time.Now()
	for time.Since(start) < d {
		for len(free) == 0 {
			rec, err := c.NextWait(ctx)
			if err != nil {
				return bench.Measurement{}, err
			}
			if err := back(rec); err != nil {
				return bench.Measurement{}, err
			}
			c.Release()
		}
		buf := free[0]
		free = free[1:]
		payload := buf.Bytes()[:mib]
		bench.Fill(payload, n)
		sum += bench.FillSum(mib, n)
		buf.Handle().AppendBinary(h[:0])
		if err := p.Send(ctx, h[:]); err != nil {
			return bench.Measurement{}, err
		}
		n++
	}
	p.Close()
	for {
		res, err := c.NextWait(ctx)
		if err != nil {
			return bench.Measurement{}, fmt.Errorf("read result: %w", err)
		}
		if len(res) != shm.HandleSize {
			elapsed := time.Since(start)
			if err := checkResult(res, n, sum, mib); err != nil {
				return bench.Measurement{}, err
			}
			c.Release()
			return streamValue(n, mib, elapsed), nil
		}
		if err := back(res); err != nil {
			return bench.Measurement{}, err
		}
		c.Release()
	}
}

// waitFor is the wait strategy both ends use. Blocking waits spin for
// BlockSpin first: producing or consuming a 1 MiB payload takes about 50 µs
// here, and a futex wake-up across vCPUs costs more than that
// (../shared/BENCHMARKS.md), so a shorter spin puts a wake-up on the
// critical path of every message.
func waitFor(m shm.WaitMode) shm.Wait {
	if m == shm.WaitBlock {
		return shm.Wait{Mode: m, Spin: BlockSpin}
	}
	return shm.Wait{Mode: m}
}

// BlockSpin is how long WaitBlock spins before sleeping in this suite.
const BlockSpin = 200 * time.Microsecond

// ringPeer is the other process of every ring case.
func ringPeer(a peerArgs) error {
	seg, err := shm.OpenSegment(a.Addr)
	if err != nil {
		return err
	}
	defer seg.Close()
	capA, capB := a.Size>>20, a.Size&(1<<20-1)
	offA, offB, _, _ := layout(capA, capB, false)
	ra, err := shm.OpenSPSC(seg, offA)
	if err != nil {
		return err
	}
	rb, err := shm.OpenSPSC(seg, offB)
	if err != nil {
		return err
	}
	w := waitFor(a.Wait)
	c, err := ra.Consumer(w)
	if err != nil {
		return err
	}
	p, err := rb.Producer(w)
	if err != nil {
		return err
	}
	ctx := context.Background()
	switch a.Case {
	case "pingpong":
		for {
			in, err := c.NextWait(ctx)
			if errors.Is(err, shm.ErrClosed) {
				return nil
			}
			if err != nil {
				return err
			}
			s := bench.Sum(in)
			out, err := p.ClaimWait(ctx, 64)
			if err != nil {
				return err
			}
			bench.Fill(out, s)
			binary.LittleEndian.PutUint64(out, s)
			p.Commit()
			c.Release()
		}
	case "stream":
		var n, sum uint64
		recs := make([][]byte, 0, Batch)
		for {
			recs, err = c.NextBatch(recs)
			if err == shm.ErrRingEmpty {
				var in []byte
				in, err = c.NextWait(ctx)
				recs = append(recs[:0], in)
			}
			if errors.Is(err, shm.ErrClosed) {
				break
			}
			if err != nil {
				return err
			}
			for _, in := range recs {
				sum += bench.Sum(in)
			}
			n += uint64(len(recs))
			c.Release()
		}
		return sendResult(ctx, p, n, sum)
	case "zerocopy":
		pool, err := shm.OpenPool(seg, int(a.Extra))
		if err != nil {
			return err
		}
		var n, sum uint64
		for {
			in, err := c.NextWait(ctx)
			if errors.Is(err, shm.ErrClosed) {
				break
			}
			if err != nil {
				return err
			}
			var h shm.Handle
			if err := h.UnmarshalBinary(in); err != nil {
				return err
			}
			buf, err := pool.Resolve(h)
			if err != nil {
				return err
			}
			sum += bench.Sum(buf.Bytes()[:mib])
			n++
			// Hand the buffer back to the sender, by handle.
			if err := p.Send(ctx, in); err != nil {
				return err
			}
			c.Release()
		}
		return sendResult(ctx, p, n, sum, 'R')
	}
	return fmt.Errorf("unknown case %q", a.Case)
}

// sendResult sends the count and checksum, with tag bytes appended (the
// zero-copy case tags it so it differs from a 16-byte handle).
func sendResult(ctx context.Context, p *shm.Producer, n, sum uint64, tag ...byte) error {
	bench.PeerFinished()
	res := binary.LittleEndian.AppendUint64(nil, n)
	res = binary.LittleEndian.AppendUint64(res, sum)
	if err := p.Send(ctx, append(res, tag...)); err != nil {
		return err
	}
	// Wait until the parent has read the result (it then kills us), so the
	// ring's consumer sees a live producer until the end.
	time.Sleep(time.Hour)
	return nil
}
