package shmsuite

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/shm"
)

// The one-P cases run both sides as goroutines of this process with
// GOMAXPROCS=1, what a Go program gets in a pod with a 1-CPU limit: the
// two share the only P, so a waiter that spins instead of handing it over
// starves the very peer it waits for (each exchange then waits for the
// scheduler's 10 ms preemption).

// onePCase is pingpong-64B between two goroutines on one P.
func onePCase() bench.Case {
	return bench.Case{Name: "pingpong-64B-1P", Unit: "ns/op", Better: "lower", Latency: true, Contenders: []bench.Contender{
		{Name: "ubkit", Run: oneP(func(d time.Duration) (bench.Measurement, error) { return inprocPingPong(d, shm.WaitBlock) })},
		{Name: "ubkit-spin", Run: oneP(func(d time.Duration) (bench.Measurement, error) { return inprocPingPong(d, shm.WaitSpin) })},
		{Name: "chan", Run: oneP(chanPingPong)},
		{Name: "uds", Run: oneP(udsPingPong)},
	}}
}

// oneP runs run with GOMAXPROCS=1, then puts it back.
func oneP(run func(time.Duration) (bench.Measurement, error)) func(time.Duration) (bench.Measurement, error) {
	return func(d time.Duration) (bench.Measurement, error) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
		return run(d)
	}
}

// pingPongLoop times exchanges of 64 bytes for d: send writes the request,
// recv reads the reply into in.
func pingPongLoop(d time.Duration, send func(out []byte) error, recv func() ([]byte, error), done func()) (bench.Measurement, error) {
	out := make([]byte, 64)
	samples := make([]float64, 0, 1<<16)
	start := time.Now()
	for i := uint64(0); ; i++ {
		t0 := time.Now()
		if t0.Sub(start) > d {
			break
		}
		bench.Fill(out, i)
		if err := send(out); err != nil {
			return bench.Measurement{}, err
		}
		in, err := recv()
		if err != nil {
			return bench.Measurement{}, err
		}
		if got, want := binary.LittleEndian.Uint64(in), bench.FillSum(64, i); got != want {
			return bench.Measurement{}, fmt.Errorf("reply checksum %x, want %x", got, want)
		}
		done()
		samples = append(samples, float64(time.Since(t0)))
	}
	return bench.Measurement{Samples: samples, Value: median(samples)}, nil
}

// echo answers each 64-byte request with its sum, as the peers do.
func echo(in []byte, out []byte) {
	s := bench.Sum(in)
	bench.Fill(out, s)
	binary.LittleEndian.PutUint64(out, s)
}

// inprocPingPong is ubkit's rings in one memfd segment, a goroutine at
// each end.
func inprocPingPong(d time.Duration, mode shm.WaitMode) (bench.Measurement, error) {
	offA, offB, _, size := layout(4096, 4096, false)
	seg, err := shm.CreateMemfd("bench-1p", size, nil)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer seg.Close()
	a, err := shm.CreateSPSC(seg, offA, 4096)
	if err != nil {
		return bench.Measurement{}, err
	}
	b, err := shm.CreateSPSC(seg, offB, 4096)
	if err != nil {
		return bench.Measurement{}, err
	}
	w := waitFor(mode)
	p, err := a.Producer(w)
	if err != nil {
		return bench.Measurement{}, err
	}
	c, err := b.Consumer(w)
	if err != nil {
		return bench.Measurement{}, err
	}
	pc, err := a.Consumer(w)
	if err != nil {
		return bench.Measurement{}, err
	}
	pp, err := b.Producer(w)
	if err != nil {
		return bench.Measurement{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+10*time.Second)
	defer cancel()
	served := make(chan error, 1)
	go func() {
		for {
			in, err := pc.NextWait(ctx)
			if errors.Is(err, shm.ErrClosed) {
				served <- nil
				return
			}
			if err != nil {
				served <- err
				return
			}
			out, err := pp.ClaimWait(ctx, 64)
			if err != nil {
				served <- err
				return
			}
			echo(in, out)
			pp.Commit()
			pc.Release()
		}
	}()
	m, err := pingPongLoop(d, func(out []byte) error {
		buf, err := p.ClaimWait(ctx, 64)
		if err == nil {
			copy(buf, out)
			p.Commit()
		}
		return err
	}, func() ([]byte, error) { return c.NextWait(ctx) }, c.Release)
	p.Close()
	if serr := <-served; err == nil {
		err = serr
	}
	return m, err
}

// chanPingPong is Go channels between two goroutines: the scheduler's own
// hand-over, the floor for any in-process exchange.
func chanPingPong(d time.Duration) (bench.Measurement, error) {
	req, rep := make(chan []byte), make(chan []byte)
	go func() {
		out := make([]byte, 64)
		for in := range req {
			echo(in, out)
			rep <- out
		}
	}()
	defer close(req)
	return pingPongLoop(d, func(out []byte) error { req <- out; return nil },
		func() ([]byte, error) { return <-rep, nil }, func() {})
}

// udsPingPong is a unix socket pair between two goroutines.
func udsPingPong(d time.Duration) (bench.Measurement, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@ubkit-bench-1p-" + fmt.Sprint(segCounter.Add(1)), Net: "unix"})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer l.Close()
	served := make(chan error, 1)
	go func() {
		s, err := l.Accept()
		if err != nil {
			served <- err
			return
		}
		defer s.Close()
		in, out := make([]byte, 64), make([]byte, 64)
		for {
			if _, err := io.ReadFull(s, in); err != nil {
				served <- nil
				return
			}
			echo(in, out)
			if _, err := s.Write(out); err != nil {
				served <- err
				return
			}
		}
	}()
	conn, err := net.Dial("unix", l.Addr().String())
	if err != nil {
		return bench.Measurement{}, err
	}
	in := make([]byte, 64)
	m, err := pingPongLoop(d, func(out []byte) error { _, err := conn.Write(out); return err },
		func() ([]byte, error) { _, err := io.ReadFull(conn, in); return in, err }, func() {})
	conn.Close()
	if serr := <-served; err == nil {
		err = serr
	}
	return m, err
}
