package procstat

import (
	"os"
	"testing"
	"time"
)

// TestRead: an open file counts as one descriptor until it is closed, and
// Returned sees it go.
func TestRead(t *testing.T) {
	before, err := Read()
	if err != nil {
		t.Fatal(err)
	}
	if before.RSS <= 0 || before.Mappings == 0 || before.Goroutines == 0 {
		t.Fatalf("implausible usage: %v", before)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	open, _ := Read()
	if d := open.Sub(before).FDs; d != 1 {
		t.Errorf("an open file counts as %d descriptors", d)
	}
	if open.Within(before, Usage{}) {
		t.Error("Within ignores an extra descriptor")
	}
	if _, err := Returned(before, Usage{Goroutines: 1 << 20}, 10*time.Millisecond); err == nil {
		t.Error("Returned ignores an open file")
	}
	f.Close()
	if _, err := Returned(before, Usage{Goroutines: 1 << 20}, time.Second); err != nil {
		t.Errorf("after Close: %v", err)
	}
}
