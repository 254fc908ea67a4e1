package transportsuite

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/transport"
)

// onePCase is echo-64B with both ends in this process and GOMAXPROCS=1,
// what a Go program gets in a pod with a 1-CPU limit: a reader that polls
// without handing the only P over starves the writer it waits for.
func onePCase() bench.Case {
	var cs []bench.Contender
	for _, k := range []string{"ubkit", "tcp", "uds"} {
		cs = append(cs, bench.Contender{Name: k, Run: func(d time.Duration) (bench.Measurement, error) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
			return echoInProcess(k, d)
		}})
	}
	return bench.Case{Name: "echo-64B-1P", Unit: "ns/op", Better: "lower", Latency: true, Contenders: cs}
}

var onePSeq atomic.Uint64

// listenHere listens over kind under a name of its own in this process.
func listenHere(kind string) (net.Listener, string, error) {
	n := onePSeq.Add(1)
	switch kind {
	case "ubkit":
		addr := fmt.Sprintf("ub:///bench-1p-%d-%d", os.Getpid(), n)
		l, err := transport.Listen(context.Background(), addr)
		return l, addr, err
	case "tcp":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, "", err
		}
		return l, l.Addr().String(), nil
	}
	if err := os.MkdirAll(transport.RuntimeDir(), 0o700); err != nil {
		return nil, "", err
	}
	l, err := net.Listen("unix", filepath.Join(transport.RuntimeDir(), fmt.Sprintf("bench-1p-%d-%d.sock", os.Getpid(), n)))
	if err != nil {
		return nil, "", err
	}
	return l, l.Addr().String(), nil
}

// echoInProcess times 64-byte round trips to an echoing goroutine.
func echoInProcess(kind string, d time.Duration) (bench.Measurement, error) {
	l, addr, err := listenHere(kind)
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
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(s, buf); err != nil {
				served <- nil
				return
			}
			if _, err := s.Write(buf); err != nil {
				served <- err
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, kind, addr)
	if err != nil {
		return bench.Measurement{}, err
	}
	out, in := make([]byte, 64), make([]byte, 64)
	var samples []float64
	start := time.Now()
	for i := uint64(0); time.Since(start) < d; i++ {
		t0 := time.Now()
		bench.Fill(out, i)
		if _, err = c.Write(out); err != nil {
			break
		}
		if _, err = io.ReadFull(c, in); err != nil {
			break
		}
		if bench.Sum(in) != bench.FillSum(64, i) {
			err = fmt.Errorf("echo mismatch")
			break
		}
		samples = append(samples, float64(time.Since(t0)))
	}
	c.Close()
	if serr := <-served; err == nil {
		err = serr
	}
	if err != nil {
		return bench.Measurement{}, err
	}
	return latency(samples), nil
}
