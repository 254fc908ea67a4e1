package bench

import "testing"

func TestFillSum(t *testing.T) {
	for _, n := range []int{0, 7, 8, 64, 100, 1 << 20} {
		b := make([]byte, n)
		for _, seed := range []uint64{0, 1, 1 << 40} {
			Fill(b, seed)
			if got, want := Sum(b), FillSum(n, seed); got != want {
				t.Errorf("size %d seed %d: Sum %x, FillSum %x", n, seed, got, want)
			}
		}
	}
}

func TestFillSums(t *testing.T) {
	for _, n := range []int{0, 5, 64, 1000} {
		var want uint64
		for i := range uint64(100) {
			want += FillSum(n, 7+i)
		}
		if got := FillSums(n, 7, 100); got != want {
			t.Errorf("size %d: FillSums %x, want %x", n, got, want)
		}
	}
}

func BenchmarkFill1MiB(b *testing.B) {
	p := make([]byte, 1<<20)
	b.SetBytes(int64(len(p)))
	for i := 0; b.Loop(); i++ {
		Fill(p, uint64(i))
	}
}

func BenchmarkSum1MiB(b *testing.B) {
	p := make([]byte, 1<<20)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		Sum(p)
	}
}

func BenchmarkFill64(b *testing.B) {
	p := make([]byte, 64)
	b.SetBytes(int64(len(p)))
	for i := 0; b.Loop(); i++ {
		Fill(p, uint64(i))
	}
}

func TestSummer(t *testing.T) {
	b := make([]byte, 1000)
	Fill(b, 3)
	for _, cuts := range [][]int{{0}, {1, 7, 8, 9}, {3, 500, 999}, {13, 14, 15, 16, 17}} {
		var s Summer
		prev := 0
		for _, c := range append(cuts, len(b)) {
			s.Write(b[prev:c])
			prev = c
		}
		if s.Sum() != Sum(b) {
			t.Errorf("cuts %v: %d, want %d", cuts, s.Sum(), Sum(b))
		}
	}
}
