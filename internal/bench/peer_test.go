package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"testing"
	"time"
)

func init() {
	RegisterPeer("bench-test-print-and-exit", func(json.RawMessage) error {
		fmt.Println("result")
		return nil
	})
}

// TestPeerOutputOutlivesPeer: what a peer printed before it exited can
// still be read after it exited (a peer that reports and exits at once
// raced its reader, which got "file already closed").
func TestPeerOutputOutlivesPeer(t *testing.T) {
	p, err := StartPeerPipe("bench-test-print-and-exit", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Until the peer has exited, without closing its output as Wait does.
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(p.Stdout())
	if err != nil || string(got) != "result\n" {
		t.Fatalf("read %q, %v; want %q", got, err, "result\n")
	}
	if err := p.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestKillAfterDone: a caller that saw the peer exit (Done) and then
// kills it, as the suites do on their error paths, returns (it waited for
// ever when Done handed out the only copy of the exit status).
func TestKillAfterDone(t *testing.T) {
	p, err := StartPeerPipe("bench-test-print-and-exit", nil)
	if err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, p.Stdout())
	<-p.Done()
	killed := make(chan struct{})
	go func() { p.Kill(); close(killed) }()
	select {
	case <-killed:
	case <-time.After(10 * time.Second): // a hang guard
		t.Fatal("Kill after Done did not return")
	}
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
}
