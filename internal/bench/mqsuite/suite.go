// Package mqsuite is the `ubctl bench mq` suite: mq.Log between processes,
// every payload byte written by the producer and read by the consumer.
// log-100B streams small records from one process to another, loaned 64
// at a time (Log.LoanBatch), against ubkit's own SPSC ring (package shm)
// streaming the same messages claimed 64 at a time; log-100B-p99 offers 1M records a second and takes their latency,
// after a warm-up at the same rate whose records it counts but does not
// time; log-fanout-4 streams to four consumer processes. The cases of the
// Pulsar and RocketMQ drop-ins against their brokers are planned
// (docs/mq.md).
package mqsuite

import (
	"fmt"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/shmsuite"
)

// size is the payload of the log-100B case.
const size = 100

// Targets of issue 18.
const (
	targetRate  = 10e6 // log-100B, msg/s
	targetP99Ns = 5000 // log-100B-p99, ns
)

// Cases returns the suite's cases.
func Cases() []bench.Case {
	return []bench.Case{
		{Name: "log-100B", Unit: "msg/s", Better: "higher", Verdict: rateVerdict, Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return logStream(d, size, 1) }},
			// ubkit's own SPSC ring with the same batching opportunity
			// (64 records claimed, filled in place, one Commit): one
			// producer, no headers to claim, no checksum, a 4 MiB ring
			// reused in place.
			{Name: "shm-ring", Run: func(d time.Duration) (bench.Measurement, error) { return shmsuite.RingClaim(d, size) }},
		}},
		{Name: "log-100B-p99", Unit: "µs", Better: "lower", Verdict: p99Verdict, Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return logLatency(d, size, offered) }},
			{Name: "spin-floor", Role: bench.Reference, About: "two processes passing bare stamps through shared memory at the same rate: the machine's floor",
				Run: func(d time.Duration) (bench.Measurement, error) { return floorLatency(d, offered) }},
		}},
		{Name: "log-fanout-4", Unit: "msg/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return logStream(d, size, fanout) }},
		}},
	}
}

// fanout is the number of consumer processes of log-fanout-4.
const fanout = 4

func rateVerdict(r bench.Result) string {
	if r.Value >= targetRate {
		return fmt.Sprintf("met the target of %.0fM msg/s", targetRate/1e6)
	}
	return fmt.Sprintf("MISSED the target of %.0fM msg/s: %.1fM (%.2fx)", targetRate/1e6, r.Value/1e6, r.Value/targetRate)
}

func p99Verdict(r bench.Result) string {
	if r.Value*1e3 <= targetP99Ns {
		return fmt.Sprintf("met the target: p99 at most %.0f µs at %.0fM msg/s offered", targetP99Ns/1e3, offered/1e6)
	}
	floor := ""
	if f, ok := r.Detail["spin-floor"]; ok && f.Median > 0 && f.Error == "" {
		floor = fmt.Sprintf(" (the machine's floor, bare stamps between two spinning processes: p99 %.1f µs)", f.Median)
	}
	return fmt.Sprintf("MISSED the target: p99 %.1f µs, at most %.0f µs wanted at %.0fM msg/s offered%s", r.Value, targetP99Ns/1e3, offered/1e6, floor)
}

// peerArgs tell the consumer peer which log to read.
type peerArgs struct {
	Log string `json:"log"`
}

func init() {
	registerPeer("mq-log-consumer", func(a peerArgs) error { return readLog(a, tally{}) })
}

// DemoCases are ubctl demo's: one producer process streaming records the
// size of an inference service's results (1 KiB) to a consumer process
// through a one-partition log.
func DemoCases() []bench.Case {
	return []bench.Case{{Name: "log-1KiB", Unit: "msg/s", Better: "higher", Contenders: []bench.Contender{
		{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return logStream(d, DemoSize, 1) }},
	}}}
}

// DemoSize is the payload of DemoCases.
const DemoSize = 1 << 10
