// Package shmsuite is the `ubctl bench shm` suite: ubkit's shm rings and pool
// against a unix socket, TCP loopback and shmipc-go, each between two
// processes, every payload byte written by the sender and read by the
// receiver.
package shmsuite

import (
	"encoding/json"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/shm"
)

// Batch is how many 64-byte messages a sender hands over at once, for ubkit
// (one Commit) and for the socket baselines (one Flush of a buffered writer).
const Batch = 64

const mib = 1 << 20

// Cases returns the suite's cases. shmipcBin is the path of the shmipc-go
// baseline program, or "" to leave shmipc-go out.
func Cases(shmipcBin string) []bench.Case {
	pp := func(name string, wait shm.WaitMode) bench.Case {
		c := bench.Case{Name: name, Unit: "ns/op", Better: "lower", Latency: true, Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return shmPingPong(d, wait) }},
			{Name: "uds", Run: func(d time.Duration) (bench.Measurement, error) { return sockPingPong(d, "unix") }},
			{Name: "tcp", Run: func(d time.Duration) (bench.Measurement, error) { return sockPingPong(d, "tcp") }},
		}}
		return withShmipc(c, shmipcBin, "pingpong-64B")
	}
	cases := []bench.Case{
		pp("pingpong-64B-spin", shm.WaitSpin),
		pp("pingpong-64B-block", shm.WaitBlock),
		withShmipc(bench.Case{Name: "stream-64B", Unit: "msg/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return shmStream(d, 64, false) }},
			{Name: "uds", Run: func(d time.Duration) (bench.Measurement, error) { return sockStream(d, "unix", 64) }},
			{Name: "tcp", Run: func(d time.Duration) (bench.Measurement, error) { return sockStream(d, "tcp", 64) }},
		}}, shmipcBin, "stream-64B"),
		withShmipc(bench.Case{Name: "stream-1MiB-zerocopy", Unit: "GB/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return shmZeroCopy(d) }},
			{Name: "uds", Run: func(d time.Duration) (bench.Measurement, error) { return sockStream(d, "unix", mib) }},
			{Name: "tcp", Run: func(d time.Duration) (bench.Measurement, error) { return sockStream(d, "tcp", mib) }},
		}}, shmipcBin, "stream-1MiB"),
		withShmipc(bench.Case{Name: "stream-1MiB-copy", Unit: "GB/s", Better: "higher", Contenders: []bench.Contender{
			{Name: "ubkit", Run: func(d time.Duration) (bench.Measurement, error) { return shmStream(d, mib, true) }},
			{Name: "uds", Run: func(d time.Duration) (bench.Measurement, error) { return sockStream(d, "unix", mib) }},
			{Name: "tcp", Run: func(d time.Duration) (bench.Measurement, error) { return sockStream(d, "tcp", mib) }},
		}}, shmipcBin, "stream-1MiB", "-copy"),
		onePCase(),
		{Name: "pool-alloc-free", Unit: "ns/op", Better: "lower", Contenders: []bench.Contender{
			{Name: "ubkit", Run: poolAllocFree},
			{Name: "sync.Pool", Run: syncPoolAllocFree},
			{Name: "make", Run: makeAllocFree},
		}},
	}
	return cases
}

// DemoCases is the short list `ubctl demo` shows.
func DemoCases() []bench.Case {
	all := Cases("")
	return []bench.Case{all[1], all[2]}
}

func withShmipc(c bench.Case, bin, shmipcCase string, flags ...string) bench.Case {
	if bin == "" {
		return c
	}
	c.Contenders = append(c.Contenders, bench.Contender{Name: "shmipc-go", Run: func(d time.Duration) (bench.Measurement, error) {
		return runShmipc(bin, shmipcCase, d, flags...)
	}})
	return c
}

// peerArgs tell a peer process what to do.
type peerArgs struct {
	Case    string        `json:"case"`
	Network string        `json:"network,omitempty"` // unix or tcp
	Addr    string        `json:"addr"`              // socket address or segment name
	Wait    shm.WaitMode  `json:"wait,omitempty"`
	Size    int           `json:"size,omitempty"`
	Extra   time.Duration `json:"extra,omitempty"`
}

func init() {
	bench.RegisterPeer("shm-socket", func(raw json.RawMessage) error {
		var a peerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return sockPeer(a)
	})
	bench.RegisterPeer("shm-ring", func(raw json.RawMessage) error {
		var a peerArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return ringPeer(a)
	})
}

// RingClaim is the stream case's loan path for payloads of size bytes:
// Batch records claimed and filled in the ring, published by one Commit,
// read in place and checksummed by a peer process: the baseline of a
// producer that loans Batch records at a time (mqsuite's log-100B).
func RingClaim(d time.Duration, size int) (bench.Measurement, error) {
	return shmStream(d, size, false)
}

// RingSend is the stream case's Send path for payloads of size bytes (each
// filled in private memory, copied into an SPSC ring, read in place and
// checksummed by a peer process): a baseline for other suites that stream
// small messages between two processes (mqsuite's log-100B).
func RingSend(d time.Duration, size int) (bench.Measurement, error) {
	return shmStream(d, size, true)
}
