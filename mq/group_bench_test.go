package mq

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// BenchmarkGroupReceiveAck100B: a producer goroutine sends 100-byte
// records to one partition and a group consumer receives each, checksums
// every byte and acks it, as BenchmarkSendRecv100B does with a Reader: the
// difference is the group's cost (the partition lock, the in-flight entry,
// the committed offset and its pin).
func BenchmarkGroupReceiveAck100B(b *testing.B) {
	l := newLog(b, Config{})
	ctx := context.Background()
	g := join(b, l, "", GroupConfig{})
	n := b.N
	errs := make(chan error, 1)
	go func() {
		for i := range n {
			res, err := l.Loan(ctx, 0, 100)
			if err != nil {
				errs <- err
				return
			}
			p := res.Bytes()
			binary.LittleEndian.PutUint64(p, uint64(i))
			bench.Fill(p[8:], uint64(i))
			if err := res.Commit(); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	b.SetBytes(100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range n {
		m, err := g.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if seq := binary.LittleEndian.Uint64(m.Payload); seq != uint64(i) || bench.Sum(m.Payload[8:]) != bench.FillSum(92, seq) {
			b.Fatalf("record %d: seq %d or its payload is wrong", i, seq)
		}
		if err := g.Ack(m); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
