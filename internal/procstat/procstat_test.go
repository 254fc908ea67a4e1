package procstat

import (
	"os"
	"testing"
	"time"
)

// TestRead: an open file counts as one descriptor until it is closed, and
// WaitWithin sees it go.
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
	f.Close()
	if after, _ := WaitWithin(before, Usage{}, time.Second); !after.Within(before, Usage{}) {
		t.Errorf("after Close: %v, before %v", after, before)
	}
}
