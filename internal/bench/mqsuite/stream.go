package mqsuite

import (
	"context"
	"fmt"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/mq"
)

// logStream produces records of size bytes into a one-partition log for d
// (loaned, filled in place, committed), then an empty record that ends
// the stream, read by consumers processes, each with its own reader from
// offset 0: every consumer reads every record in place and checksums it.
// The value is msg/s per consumer: the records each read over the time
// until the last one reported (so the slowest consumer sets it).
func logStream(d time.Duration, size, consumers int) (bench.Measurement, error) {
	l, remove, err := newLog()
	if err != nil {
		return bench.Measurement{}, err
	}
	defer remove()
	peers := make([]*consumerPeer, consumers)
	for i := range peers {
		peer, err := startConsumer(fmt.Sprintf("mq consumer %d", i), "mq-log-consumer", peerArgs{Log: l.Name()})
		if err != nil {
			return bench.Measurement{}, err
		}
		defer peer.Kill()
		peers[i] = peer
	}
	// Every consumer registers its reader at offset 0 before it says
	// ready, so that under FullBlock the producer keeps what any has not
	// read.
	for _, peer := range peers {
		if err := peer.expect("ready"); err != nil {
			return bench.Measurement{}, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	n, sum, start, err := produce(ctx, l, d, size)
	if err != nil {
		return bench.Measurement{}, err
	}
	for _, peer := range peers {
		if err := peer.report(&result{}, n, sum); err != nil {
			return bench.Measurement{}, err
		}
	}
	elapsed := time.Since(start)
	for _, peer := range peers {
		if err := peer.Wait(); err != nil {
			return bench.Measurement{}, err
		}
	}
	if st, err := l.Stats(0); err != nil || st.Aborted != 0 {
		return bench.Measurement{}, fmt.Errorf("mq: stats %+v, %v", st, err)
	}
	return bench.Measurement{Value: float64(n) / elapsed.Seconds()}, nil
}

// produce loans, fills and commits records of size bytes into partition 0
// for d, 64 at a time (Log.LoanBatch: one claim and one publication for
// as many as fit in the rest of the segment), then sends the empty record
// that ends the stream. It returns how many it sent, the sum of their
// bytes and when it started.
func produce(ctx context.Context, l *mq.Log, d time.Duration, size int) (n, sum uint64, start time.Time, err error) {
	start = time.Now()
	for time.Since(start) < d {
		b, err := l.LoanBatch(ctx, 0, size, 64)
		if err != nil {
			return 0, 0, start, err
		}
		for i := range b.Len() {
			bench.Fill(b.Bytes(i), n+uint64(i))
		}
		if err := b.Commit(); err != nil {
			return 0, 0, start, err
		}
		sum += bench.FillSums(size, n, uint64(b.Len()))
		n += uint64(b.Len())
	}
	if _, err := l.Send(ctx, 0, nil); err != nil {
		return 0, 0, start, err
	}
	return n, sum, start, nil
}
