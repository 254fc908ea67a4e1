package fssuite

import (
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/bench/benchtest"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) {
	bench.RunPeerIfChild()
	testenv.Main(m)
}

// TestCasesRun runs every case on small files across processes: each
// contender's sum of the bytes it read must match the others' (checkSum),
// Python's included.
func TestCasesRun(t *testing.T) {
	e := NewEnv(t.TempDir(), true)
	e.big, e.gib = 24<<20+4096+123, 16<<20
	defer e.Close()
	benchtest.CasesRun(t, e.Cases(), 50*time.Millisecond)
	want := 2 // the big file whole, the tensors
	if netnsReady() == nil {
		want++ // and the remote file (make test runs as root)
	}
	if n := len(e.sums); n != want {
		t.Errorf("sums of %d files and ways of reading checked, want %d", n, want)
	}
}

// TestSharedMeasures: the shared case tells one copy from four.
func TestSharedMeasures(t *testing.T) {
	e := NewEnv(t.TempDir(), true)
	e.gib = 64 << 20
	gib := func() (string, error) { return e.rawFile(e.gib) }
	one, err := e.sharedRun(gib, "ubkit")(0)
	if err != nil {
		t.Fatal(err)
	}
	four, err := e.sharedRun(gib, "independent")(0)
	if err != nil {
		t.Fatal(err)
	}
	if one.Value > 1.2 || four.Value < 3.5 {
		t.Errorf("four holders of one copy: %.2f file sizes (want about 1), four independent loads: %.2f (want about 4)", one.Value, four.Value)
	}
}

func TestSum(t *testing.T) {
	b := make([]byte, 3<<20+13)
	var want uint64
	for i := range b {
		b[i] = byte(i * 7)
	}
	for i := 0; i+8 <= len(b); i += 8 {
		var w uint64
		for j := range 8 {
			w |= uint64(b[i+j]) << (8 * j)
		}
		want += w
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		want += uint64(b[i])
	}
	if got := Sum(b); got != want {
		t.Errorf("Sum = %#x, want %#x", got, want)
	}
}
