// Package mqsuite is the `ubctl bench mq` suite: mq.Log between processes,
// every payload byte written by the producer and read by the consumer.
// Only the log-100B case of issue 18 exists yet, against ubkit's own SPSC
// ring (package shm) streaming the same messages with Send; the other cases (p99 at
// an offered rate, fan-out, the Pulsar and RocketMQ drop-ins against their
// brokers) are planned (docs/mq.md).
package mqsuite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/shmsuite"
	"github.com/ubkit-io/ubkit/mq"
)

// size is the payload of the log-100B case.
const size = 100

// Cases returns the suite's cases.
func Cases() []bench.Case {
	return []bench.Case{
		{Name: "log-100B", Unit: "msg/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return logStream(d, size) }},
			// ubkit's own SPSC ring, Send path: one producer, no headers
			// to claim, no checksum, a 4 MiB ring reused in place.
			{Name: "shm-ring", Run: func(d time.Duration) (bench.Measurement, error) { return shmsuite.RingSend(d, size) }},
		}},
	}
}

// peerArgs tell the consumer peer which log to read.
type peerArgs struct {
	Log string `json:"log"`
}

// result is what the consumer reports: records read and the sum of their
// payloads' bytes.
type result struct {
	N   uint64 `json:"n"`
	Sum uint64 `json:"sum"`
}

func init() {
	bench.RegisterPeer("mq-log-consumer", func(raw json.RawMessage) error {
		var a peerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return consumer(a)
	})
}

var logCounter atomic.Uint64

// DemoCases are ubctl demo's: one producer process streaming records the
// size of an inference service's results (1 KiB) to a consumer process
// through a one-partition log.
func DemoCases() []bench.Case {
	return []bench.Case{{Name: "log-1KiB", Unit: "msg/s", Better: "higher", Contenders: []bench.Contender{
		{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return logStream(d, DemoSize) }},
	}}}
}

// DemoSize is the payload of DemoCases.
const DemoSize = 1 << 10

// logStream produces records of size bytes into a one-partition log for d
// (loaned, filled in place, committed), then an empty record that ends
// the stream; the consumer process reads each in place and checksums it.
// The time runs until the consumer has reported.
func logStream(d time.Duration, size int) (bench.Measurement, error) {
	name := fmt.Sprintf("bench-%d-%d", os.Getpid(), logCounter.Add(1))
	l, err := mq.Create(name, mq.Config{})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer mq.Remove(name)
	defer l.Close()
	peer, err := bench.StartPeerPipe("mq-log-consumer", peerArgs{Log: name})
	if err != nil {
		return bench.Measurement{}, err
	}
	defer peer.Kill()
	out := bufio.NewReader(peer.Stdout())
	// The consumer registers its reader at offset 0 before saying ready,
	// so the producer, under FullBlock, never drops what it has not read.
	if line, err := out.ReadString('\n'); err != nil || line != "ready\n" {
		return bench.Measurement{}, fmt.Errorf("mq consumer: %q, %v (%v)", line, err, peer.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	var n, sum uint64
	start := time.Now()
	for time.Since(start) < d {
		for range 64 {
			r, err := l.Loan(ctx, 0, size)
			if err != nil {
				return bench.Measurement{}, err
			}
			bench.Fill(r.Bytes(), n)
			if err := r.Commit(); err != nil {
				return bench.Measurement{}, err
			}
			n++
		}
		sum += bench.FillSums(size, n-64, 64)
	}
	if _, err := l.Send(ctx, 0, nil); err != nil {
		return bench.Measurement{}, err
	}
	var res result
	if err := json.NewDecoder(out).Decode(&res); err != nil {
		return bench.Measurement{}, fmt.Errorf("mq consumer's result: %w", err)
	}
	elapsed := time.Since(start)
	if res.N != n || res.Sum != sum {
		return bench.Measurement{}, fmt.Errorf("mq consumer read %d records (sum %x), %d sent (sum %x)", res.N, res.Sum, n, sum)
	}
	if err := peer.Wait(); err != nil {
		return bench.Measurement{}, err
	}
	if st, err := l.Stats(0); err != nil || st.Aborted != 0 {
		return bench.Measurement{}, fmt.Errorf("mq: stats %+v, %v", st, err)
	}
	return bench.Measurement{Value: float64(n) / elapsed.Seconds()}, nil
}

// consumer reads the log from offset 0 until an empty record, then
// reports what it read on standard output.
func consumer(a peerArgs) error {
	l, err := mq.Open(a.Log)
	if err != nil {
		return err
	}
	defer l.Close()
	r, err := l.NewReader(0, 0)
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Println("ready")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var res result
	for {
		rec, err := r.Next(ctx)
		if err != nil {
			return err
		}
		if len(rec.Payload) == 0 {
			break
		}
		res.N++
		res.Sum += bench.Sum(rec.Payload)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
