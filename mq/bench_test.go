package mq

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/ubkit-io/ubkit/internal/bench"
)

// BenchmarkSend100B: one goroutine sends 100-byte records, each payload
// written (bench.Fill), with no reader (retention drops old segments).
func BenchmarkSend100B(b *testing.B) {
	l := newLog(b, Config{})
	ctx := context.Background()
	b.SetBytes(100)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r, err := l.Loan(ctx, 0, 100)
		if err != nil {
			b.Fatal(err)
		}
		bench.Fill(r.Bytes(), uint64(i))
		if err := r.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendRecv100B: a producer goroutine sends 100-byte records and
// the benchmark's goroutine reads each, checksumming every byte; the
// partition holds 8 segments of 8 MiB and blocks when full.
func BenchmarkSendRecv100B(b *testing.B) {
	l := newLog(b, Config{})
	ctx := context.Background()
	r := newReader(b, l, 0, Newest)
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
		rec, err := r.Next(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if seq := binary.LittleEndian.Uint64(rec.Payload); seq != uint64(i) || bench.Sum(rec.Payload[8:]) != bench.FillSum(92, seq) {
			b.Fatalf("record %d: seq %d or its payload is wrong", i, seq)
		}
	}
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkSendFlush: one goroutine sends 100-byte records (Send: copy
// and commit) to a log in /dev/shm and to file-backed logs under each
// flush policy (the files in the test's temporary directory, on whatever
// disk holds it); no reader.
func BenchmarkSendFlush(b *testing.B) {
	for _, bc := range []struct {
		name string
		c    Config
	}{
		{"shm", Config{}},
		{"file-none", Config{Flush: FlushNone}},
		{"file-interval", Config{Flush: FlushInterval}},
		{"file-every-send", Config{Flush: FlushEverySend}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var l *Log
			if bc.name == "shm" {
				l = newLog(b, bc.c)
			} else {
				l, _ = newDirLog(b, bc.c)
			}
			ctx := context.Background()
			payload := make([]byte, 100)
			b.SetBytes(100)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				bench.Fill(payload, uint64(i))
				if _, err := l.Send(ctx, 0, payload); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
