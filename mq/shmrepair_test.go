package mq

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// A maker of a /dev/shm segment killed between its made CAS and its
// segment (docs/mq.md, "Durability").

func init() {
	testenv.RegisterChild("shm-maker-dies", shmMakerDiesChild)
}

// shmMakerDiesChild sends records of producer 1 to partition 0 of log
// MQ_LOG, saying "sent i" after each, until a maker of its counts segment
// MQ_K or later as made: then it says "claimed k" and stops (SIGSTOP),
// before creating it, to be killed: stopped, its other producer cannot
// take the segment over itself after a second.
func shmMakerDiesChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	from, _ := strconv.ParseUint(os.Getenv("MQ_K"), 10, 64)
	hook := func(_ *Log, p int, k uint64) {
		if p == 0 && k >= from {
			fmt.Printf("claimed %d\n", k)
			osproc.StopSelf()
			select {} // not reached: killed while stopped
		}
	}
	testSegClaimed.Store(&hook)
	b := make([]byte, 1000)
	for i := range 1000 {
		message(b, 1, uint64(i))
		if _, err := l.Send(context.Background(), 0, b); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("sent %d\n", i)
	}
	fmt.Fprintln(os.Stderr, "never claimed")
	return 1
}

// shmFile is this user's predictable file in /dev/shm for segment name.
func shmFile(name string) string {
	return filepath.Join(shm.ShmDir, shm.NamePrefix+strconv.Itoa(os.Geteuid())+"-"+name)
}

// killMakerAt runs shmMakerDiesChild on log l, kills it once it claimed
// a segment, leaves that segment in state (as a maker killed later would
// have: "missing", "empty" after its O_EXCL open, "sized" before its
// header) and returns the segment and how many records the child sent.
func killMakerAt(t *testing.T, l *Log, state string) (k uint64, sent int) {
	t.Helper()
	cmd := testenv.Child(t, "shm-maker-dies", "MQ_LOG="+l.Name(), "MQ_K=2")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	claimed := false
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) != 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "sent":
			sent = n + 1
		case "claimed":
			k, claimed = uint64(n), true
		}
		if claimed {
			break
		}
	}
	if !claimed {
		cmd.Wait()
		t.Fatal("the child never claimed a segment")
	}
	// Held open, as a reader would: a Sweep (shm's tests run one) removes
	// the segments of a dead creator that nobody holds.
	for i := range k {
		seg, err := shm.OpenSegment(segName(l.Name(), 0, i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { seg.Close() })
	}
	cmd.Process.Kill()
	for lines.Scan() { // a Send that returned before the kill
		if f := strings.Fields(lines.Text()); len(f) == 2 && f[0] == "sent" {
			n, _ := strconv.Atoi(f[1])
			sent = n + 1
		}
	}
	cmd.Wait()
	if _, err := os.Lstat(shmFile(segName(l.Name(), 0, k))); !os.IsNotExist(err) {
		t.Fatalf("segment %d after its maker was killed before creating it: %v", k, err)
	}
	if got := l.parts[0].made.Load(); got != k+1 {
		t.Fatalf("made %d after the maker of %d was killed", got, k)
	}
	path := shmFile(segName(l.Name(), 0, k))
	switch state {
	case "empty":
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	case "sized":
		if err := os.WriteFile(path, make([]byte, shm.HeaderSize+8192), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return k, sent
}

// TestShmMakerDied: a producer process killed after it counted a segment
// of a /dev/shm log as made and before it made it (or, made by hand, in
// CreateSegment after its open or its ftruncate) does not wedge the
// partition: two producers (two handles) that reach the segment wait a
// second, then one makes it (shm.RepairSegment) and the other opens it,
// and every record sent is read once, in order. Every Send into it used
// to fail after a second's wait, for good.
func TestShmMakerDied(t *testing.T) {
	for _, state := range []string{"missing", "empty", "sized"} {
		t.Run(state, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096, Segments: 64})
			k, sent := killMakerAt(t, l, state)
			l2, err := Open(l.Name())
			if err != nil {
				t.Fatal(err)
			}
			defer l2.Close()
			ctx := timeout(t, time.Minute)
			const n = 20
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for id, h := range []*Log{l, l2} {
				wg.Go(func() {
					b := make([]byte, 1000)
					for i := range n {
						message(b, uint64(2+id), uint64(i))
						if _, err := h.Send(ctx, 0, b); err != nil {
							errs <- fmt.Errorf("producer %d, send %d, past segment %d whose maker died: %w", 2+id, i, k, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			r := newReader(t, l, 0, Oldest)
			next := map[uint64]uint64{}
			for next[2] < n || next[3] < n {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("after %v: %v", next, err)
				}
				p, seq := parse(t, rec.Payload)
				if seq != next[p] {
					t.Fatalf("producer %d: seq %d, want %d", p, seq, next[p])
				}
				next[p]++
			}
			// A record whose Send the kill cut short may be there
			// too, but none before the child's last one is missing.
			if got := int(next[1]); got < sent || got > sent+1 {
				t.Fatalf("%d records of the killed child read, it sent %d", got, sent)
			}
			if len(next) != 3 {
				t.Fatalf("records of producers %v", next)
			}
			t.Logf("segment %d %s; the child sent %d", k, state, sent)
		})
	}
}

// TestShmMakerDiedRemove: Remove takes a segment whose maker died with
// the rest of the log, sized or not: nothing of the log is left in
// /dev/shm. An unsized one used to be left behind.
func TestShmMakerDiedRemove(t *testing.T) {
	for _, state := range []string{"missing", "empty", "sized"} {
		t.Run(state, func(t *testing.T) {
			name := fmt.Sprintf("test-%d-%d", os.Getpid(), logSeq.Add(1))
			l, err := Create(name, Config{SegmentSize: 4096, Segments: 64})
			if err != nil {
				t.Fatal(err)
			}
			killMakerAt(t, l, state)
			l.Close()
			if err := Remove(name); err != nil {
				t.Fatalf("remove: %v", err)
			}
			segs, err := shm.Segments()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range segs {
				if s == metaName(name) || strings.HasPrefix(s, metaName(name)+"-p") {
					t.Errorf("segment %s left after Remove", s)
				}
			}
		})
	}
}
