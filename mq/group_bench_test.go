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

// BenchmarkGroupReceiveOpenLoan: a member owns two partitions; partition
// 0 has a record whose live producer holds its loan open, and the member
// receives and acks records of partition 1. Each Receive looks at the
// held record first (round robin): one header load, not a reader's spin
// (with the spin, 2,000 receives took about 190 times as long as with
// no loan open).
func BenchmarkGroupReceiveOpenLoan(b *testing.B) {
	l := newLog(b, Config{Partitions: 2, SegmentSize: 1 << 20})
	ctx := context.Background()
	g := join(b, l, "", GroupConfig{})
	res, err := l.Loan(ctx, 0, 8)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Abort()
	payload := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Send(ctx, 1, payload); err != nil {
			b.Fatal(err)
		}
		m, err := g.Receive(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if m.Partition != 1 {
			b.Fatalf("a record of partition %d, want 1", m.Partition)
		}
		if err := g.Ack(m); err != nil {
			b.Fatal(err)
		}
	}
}
