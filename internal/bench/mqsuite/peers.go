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
	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/shm"
)

// registerPeer registers role as a peer whose arguments are the JSON of
// an A.
func registerPeer[A any](role string, run func(A) error) {
	bench.RegisterPeer(role, func(raw json.RawMessage) error {
		var a A
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return run(a)
	})
}

// result is what every consumer peer reports: records (or messages) read
// and the sum of their payloads' bytes. The cases' own reports embed it.
type result struct {
	N   uint64 `json:"n"`
	Sum uint64 `json:"sum"`
}

// counted is the count and sum of a report that embeds result.
func (r result) counted() result { return r }

// consumerPeer is a consumer process seen from the producer: its standard
// output carries its handshake, a line at a time ("subscribed", "ready"),
// then its report as JSON.
type consumerPeer struct {
	*bench.Peer
	name string // for errors
	out  *bufio.Reader
}

// startConsumer starts a consumer peer of role with args, called name in
// errors. The caller kills it when done.
func startConsumer(name, role string, args any) (*consumerPeer, error) {
	p, err := bench.StartPeerPipe(role, args)
	if err != nil {
		return nil, err
	}
	return &consumerPeer{Peer: p, name: name, out: bufio.NewReader(p.Stdout())}, nil
}

// expect reads the consumer's next line and fails unless it is want.
func (c *consumerPeer) expect(want string) error {
	if line, err := c.out.ReadString('\n'); err != nil || line != want+"\n" {
		return fmt.Errorf("%s: %q, %v (%v)", c.name, line, err, c.Err())
	}
	return nil
}

// warmUp is the payload of the message each broker case's run starts
// with, before it measures: the consumer says ready once it has it, so
// the time measured holds no subscription or queue assignment.
var warmUp = []byte("warm-up")

// warmUp waits until a broker consumer has subscribed, sends the warm-up
// message with send and waits until the consumer has it.
func (c *consumerPeer) warmUp(ctx context.Context, send func(ctx context.Context, payload []byte) error) error {
	if err := c.expect("subscribed"); err != nil {
		return err
	}
	if err := send(ctx, warmUp); err != nil {
		return err
	}
	return c.expect("ready")
}

// report decodes the consumer's report into v and checks its count and
// sum against the n records, summing to sum, that were sent.
func (c *consumerPeer) report(v interface{ counted() result }, n, sum uint64) error {
	if err := json.NewDecoder(c.out).Decode(v); err != nil {
		return fmt.Errorf("%s's result: %w (%v)", c.name, err, c.Err())
	}
	if got := v.counted(); got.N != n || got.Sum != sum {
		return fmt.Errorf("%s read %d (sum %x), %d sent (sum %x)", c.name, got.N, got.Sum, n, sum)
	}
	return nil
}

var logCounter atomic.Uint64

// newLog creates a fresh one-partition log for one run, of the default
// shape, reusing the segments retention drops (mq.Config.Recycle: fresh
// pages for every 8 MiB segment held log-100B to 7.7M msg/s, against
// 11.8-12.2M with it; docs/PERFORMANCE.md); remove closes and deletes
// it.
func newLog() (l *mq.Log, remove func(), err error) {
	name := fmt.Sprintf("bench-%d-%d", os.Getpid(), logCounter.Add(1))
	if l, err = mq.Create(name, mq.Config{Recycle: true}); err != nil {
		return nil, nil, err
	}
	return l, func() { l.Close(); mq.Remove(name) }, nil
}

// tally is what a consumer peer does besides counting and summing what
// it reads. The zero tally does nothing more and reports the count and
// sum.
type tally struct {
	// add, if not nil, takes each payload before it is counted.
	add func(payload []byte) error
	// report, if not nil, makes what the peer prints from the count and
	// sum.
	report func(result) any
	// spin makes the reader wait for records without ever sleeping
	// (mq.Reader.SetWait, shm.WaitYield), as the floor's consumer waits.
	spin bool
}

// print writes the peer's report of res on standard output.
func (t tally) print(res result) error {
	var v any = res
	if t.report != nil {
		v = t.report(res)
	}
	return json.NewEncoder(os.Stdout).Encode(v)
}

// readLog is a log consumer peer's body: it opens log a.Log, registers a
// reader at offset 0 and says ready, then reads records in place until
// the empty one that ends the stream, counting and summing each, and
// prints its report (before it closes the reader: the producer's clock
// runs until it has every report).
func readLog(a peerArgs, t tally) error {
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
	if t.spin {
		r.SetWait(shm.Wait{Mode: shm.WaitYield})
	}
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
			// The stream's end: write the profile now (`ubctl bench
			// -cpuprofile`), as the producer may kill this process as
			// soon as it has the report.
			bench.PeerFinished()
			return t.print(res)
		}
		if t.add != nil {
			if err := t.add(rec.Payload); err != nil {
				return err
			}
		}
		res.N++
		res.Sum += bench.Sum(rec.Payload)
	}
}
