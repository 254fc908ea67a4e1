package offload

import (
	"context"
	"testing"
)

// BenchmarkPut1MiB: a producer loans 1 MiB in the store, fills it and
// commits it (the reference's checksum and the record's).
func BenchmarkPut1MiB(b *testing.B) {
	s := openStore(b, StoreConfig{})
	ctx := context.Background()
	src := payload1MiB()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		l, err := s.Loan(ctx, len(src))
		if err != nil {
			b.Fatal(err)
		}
		copy(l.Bytes(), src)
		if _, err := l.Commit(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStorePut1MiB: Store.Put of 1 MiB payloads, copied in and
// summed in one pass (mq.Reservation.CommitCopy), where
// BenchmarkPut1MiB's loan, copy and Commit read the payload twice.
func BenchmarkStorePut1MiB(b *testing.B) {
	s := openStore(b, StoreConfig{})
	ctx := context.Background()
	src := payload1MiB()
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Put(ctx, src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkView1MiB: a consumer on the store's host resolves references
// to 1 MiB payloads in place (map the record's segment, check it) and
// releases them, over 32 payloads in turn.
func BenchmarkView1MiB(b *testing.B) {
	s := openStore(b, StoreConfig{})
	r := newResolver(b, ResolverConfig{})
	ctx := context.Background()
	src := payload1MiB()
	refs := putAll(b, s, src, 32)
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p, release, err := r.View(ctx, refs[i%len(refs)])
		if err != nil {
			b.Fatal(err)
		}
		if len(p) != len(src) {
			b.Fatal(len(p))
		}
		release()
		i++
	}
}

// BenchmarkGet1MiB: a consumer on the store's host copies 1 MiB payloads
// out (Get: copied and summed in one pass), over 32 payloads in turn;
// BenchmarkViewCopy1MiB does the same as View then a copy (sum in place,
// then copy), as Get did before.
func BenchmarkGet1MiB(b *testing.B) { benchCopyOut(b, false) }

func BenchmarkViewCopy1MiB(b *testing.B) { benchCopyOut(b, true) }

func benchCopyOut(b *testing.B, viewCopy bool) {
	s := openStore(b, StoreConfig{})
	r := newResolver(b, ResolverConfig{})
	ctx := context.Background()
	src := payload1MiB()
	refs := putAll(b, s, src, 32)
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ref := refs[i%len(refs)]
		i++
		if viewCopy {
			p, release, err := r.View(ctx, ref)
			if err != nil {
				b.Fatal(err)
			}
			out := append([]byte(nil), p...)
			release()
			if len(out) != len(src) {
				b.Fatal(len(out))
			}
			continue
		}
		p, err := r.Get(ctx, ref)
		if err != nil {
			b.Fatal(err)
		}
		if len(p) != len(src) {
			b.Fatal(len(p))
		}
	}
}

// payload1MiB is the benchmarks' 1 MiB payload.
func payload1MiB() []byte {
	src := make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i * 7)
	}
	return src
}

// putAll puts src into s n times and returns the references.
func putAll(b *testing.B, s *Store, src []byte, n int) []Ref {
	var refs []Ref
	for range n {
		ref, err := s.Put(context.Background(), src)
		if err != nil {
			b.Fatal(err)
		}
		refs = append(refs, ref)
	}
	return refs
}
