package shmsuite

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// listen opens a listener for the socket baselines and starts the peer that
// connects to it.
func sockSetup(network, caseName string, size int) (net.Conn, *bench.Peer, func(), error) {
	var l net.Listener
	var err error
	var dir string
	if network == "unix" {
		dir, err = os.MkdirTemp("", "ubkit-bench-")
		if err != nil {
			return nil, nil, nil, err
		}
		l, err = net.Listen("unix", filepath.Join(dir, "s"))
	} else {
		l, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		return nil, nil, nil, err
	}
	defer l.Close()
	peer, err := bench.StartPeer("shm-socket", peerArgs{Case: caseName, Network: network, Addr: l.Addr().String(), Size: size})
	if err != nil {
		return nil, nil, nil, err
	}
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := l.Accept(); ch <- res{c, err} }()
	var r res
	select {
	case r = <-ch:
	case <-peer.Done():
		return nil, nil, nil, fmt.Errorf("peer exited before connecting: %v", peer.Err())
	case <-time.After(10 * time.Second):
		peer.Kill()
		return nil, nil, nil, errors.New("peer did not connect within 10s")
	}
	if r.err != nil {
		peer.Kill()
		return nil, nil, nil, r.err
	}
	cleanup := func() {
		r.c.Close()
		peer.Kill()
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	return r.c, peer, cleanup, nil
}

func sockPingPong(d time.Duration, network string) (bench.Measurement, error) {
	conn, peer, cleanup, err := sockSetup(network, "pingpong", 64)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer cleanup()
	out, in := make([]byte, 64), make([]byte, 64)
	samples := make([]float64, 0, 1<<16)
	start := time.Now()
	for i := uint64(0); ; i++ {
		t0 := time.Now()
		if t0.Sub(start) > d {
			break
		}
		bench.Fill(out, i)
		if _, err := conn.Write(out); err != nil {
			return bench.Measurement{}, err
		}
		if _, err := io.ReadFull(conn, in); err != nil {
			return bench.Measurement{}, err
		}
		if got, want := binary.LittleEndian.Uint64(in), bench.FillSum(64, i); got != want {
			return bench.Measurement{}, fmt.Errorf("reply checksum %x, want %x", got, want)
		}
		_ = bench.Sum(in)
		samples = append(samples, float64(time.Since(t0)))
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	if err := peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Samples: samples, Value: median(samples)}, nil
}

func sockStream(d time.Duration, network string, size int) (bench.Measurement, error) {
	conn, peer, cleanup, err := sockSetup(network, "stream", size)
	if err != nil {
		return bench.Measurement{}, err
	}
	defer cleanup()
	var sum, n uint64
	start := time.Now()
	if size < 4096 {
		// Same batching as ubkit: one flush per Batch messages.
		w := bufio.NewWriterSize(conn, Batch*size)
		for time.Since(start) < d {
			for range Batch {
				b := w.AvailableBuffer()[:size]
				bench.Fill(b, n)
				w.Write(b)
				n++
			}
			sum += bench.FillSums(size, n-Batch, Batch)
			if err := w.Flush(); err != nil {
				return bench.Measurement{}, err
			}
		}
	} else {
		payload := make([]byte, size)
		for time.Since(start) < d {
			bench.Fill(payload, n)
			sum += bench.FillSum(size, n)
			if _, err := conn.Write(payload); err != nil {
				return bench.Measurement{}, err
			}
			n++
		}
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	var res [16]byte
	if _, err := io.ReadFull(conn, res[:]); err != nil {
		return bench.Measurement{}, fmt.Errorf("read result: %w", err)
	}
	elapsed := time.Since(start)
	if err := checkResult(res[:], n, sum, size); err != nil {
		return bench.Measurement{}, err
	}
	if err := peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	return streamValue(n, size, elapsed), nil
}

// checkResult compares the receiver's count and checksum (the Sum of every
// byte it read) with what the sender wrote (FillSum of every message).
func checkResult(res []byte, n, sum uint64, size int) error {
	gotN, gotSum := binary.LittleEndian.Uint64(res), binary.LittleEndian.Uint64(res[8:])
	if gotN != n || gotSum != sum {
		return fmt.Errorf("receiver got %d messages with checksum %x, sender sent %d with %x", gotN, gotSum, n, sum)
	}
	return nil
}

func streamValue(n uint64, size int, elapsed time.Duration) bench.Measurement {
	if size >= 4096 {
		return bench.Measurement{Value: float64(n) * float64(size) / elapsed.Seconds() / 1e9}
	}
	return bench.Measurement{Value: float64(n) / elapsed.Seconds()}
}

func sockPeer(a peerArgs) error {
	conn, err := net.Dial(a.Network, a.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	switch a.Case {
	case "pingpong":
		in, out := make([]byte, 64), make([]byte, 64)
		for {
			if _, err := io.ReadFull(conn, in); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
			bench.Fill(out, bench.Sum(in))
			binary.LittleEndian.PutUint64(out, bench.Sum(in))
			if _, err := conn.Write(out); err != nil {
				return err
			}
		}
	case "stream":
		r := bufio.NewReaderSize(conn, max(64<<10, 0))
		msg := make([]byte, a.Size)
		var n, sum uint64
		for {
			if _, err := io.ReadFull(r, msg); err != nil {
				if err == io.EOF {
					break
				}
				return err
			}
			sum += bench.Sum(msg)
			n++
		}
		var res [16]byte
		binary.LittleEndian.PutUint64(res[:], n)
		binary.LittleEndian.PutUint64(res[8:], sum)
		_, err := conn.Write(res[:])
		return err
	}
	return fmt.Errorf("unknown case %q", a.Case)
}

func median(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return c[len(c)/2]
}
