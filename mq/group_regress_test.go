package mq

// Regression tests for holes a review found in consumer groups (docs/mq.md,
// "Consumer groups", "Holes fixed"). Each failed before its fix.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// sendUntilFull sends 1000-byte records to partition p until the log says
// ErrFull or 20 records went; it returns how many went and the last error.
func sendUntilFull(t *testing.T, ctx context.Context, l *Log, p, sent int) (int, error) {
	t.Helper()
	buf := make([]byte, 1000)
	var err error
	for ; sent < 20; sent++ {
		if _, err = l.Send(ctx, p, buf); err != nil {
			break
		}
	}
	return sent, err
}

// TestGroupClosePin: a member that Closes holding an unacked record in a
// segment it has read past hands its pin over: until a survivor takes the
// partition, a producer under FullFail gets ErrFull instead of dropping the
// record's segment, and the survivor redelivers the record.
func TestGroupClosePin(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
	ctx := timeout(t, 10*time.Second)
	a := join(t, l, "closepin", GroupConfig{})
	b := join(t, l, "closepin", GroupConfig{})
	if _, err := sendUntilFull(t, ctx, l, 0, 13); err != nil {
		t.Fatal(err)
	}
	first := receive(t, ctx, a)
	for range 6 {
		if err := a.Ack(receive(t, ctx, a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if sent, err := sendUntilFull(t, ctx, l, 0, 7); !errors.Is(err, ErrFull) {
		t.Errorf("after a's Close, %d records sent without ErrFull (%v): the unacked record's segment was dropped", sent, err)
	}
	m, err := b.Receive(timeout(t, time.Second))
	st, _ := b.Stats(0)
	if err != nil || m.Offset != first.Offset || m.Attempt != 2 {
		t.Fatalf("b: offset %d attempt %d %v, want offset %d attempt 2; stats %+v", m.Offset, m.Attempt, err, first.Offset, st)
	}
	if err := b.Ack(m); err != nil {
		t.Fatal(err)
	}
	// b's own pin took over and the handed-over one is released: with
	// everything acked, the producer goes on.
	for {
		m, err := b.Receive(timeout(t, 20*time.Millisecond))
		if err != nil {
			break
		}
		if err := b.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Send(ctx, 0, make([]byte, 1000)); err != nil {
		t.Errorf("everything acked, the producer still fails: %v (the handed-over pin was not released)", err)
	}
}

// TestGroupJoinPin: a join moves partition 1 from a to b; a lets go of it
// at its next Receive, before b has taken it: the pin a hands over holds
// a's unacked record's segment meanwhile.
func TestGroupJoinPin(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096, Segments: 2, Full: FullFail})
	ctx := timeout(t, 10*time.Second)
	a := join(t, l, "joinpin", GroupConfig{})
	if _, err := sendUntilFull(t, ctx, l, 1, 13); err != nil {
		t.Fatal(err)
	}
	first := receive(t, ctx, a)
	for range 6 {
		if err := a.Ack(receive(t, ctx, a)); err != nil {
			t.Fatal(err)
		}
	}
	b := join(t, l, "joinpin", GroupConfig{})
	// a's next Receive sees the join and lets partition 1 go.
	if m, err := a.Receive(timeout(t, 50*time.Millisecond)); err == nil {
		t.Fatalf("a got partition %d offset %d", m.Partition, m.Offset)
	}
	if got := a.Assigned(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("a owns %v, want [0]", got)
	}
	if sent, err := sendUntilFull(t, ctx, l, 1, 7); !errors.Is(err, ErrFull) {
		t.Errorf("after the rebalance, %d records sent without ErrFull (%v): a's unacked record's segment dropped", sent, err)
	}
	if err := a.Nack(first); err != nil {
		t.Fatal(err)
	}
	m, err := b.Receive(timeout(t, time.Second))
	st, _ := b.Stats(1)
	if err != nil || m.Offset != first.Offset {
		t.Fatalf("b: offset %d attempt %d %v, want the nacked offset %d; stats %+v", m.Offset, m.Attempt, err, first.Offset, st)
	}
}

// TestGroupLeaveStress: members leave (Close) while records flow under
// FullBlock: every record is delivered at least once.
func TestGroupLeaveStress(t *testing.T) {
	const parts, per = 8, 3000
	l := newLog(t, Config{Partitions: parts, SegmentSize: 64 << 10, Segments: 64, Full: FullBlock})
	ctx := timeout(t, 60*time.Second)
	name := fmt.Sprintf("leave%d", groupSeq.Add(1))
	var mu sync.Mutex
	seen := map[[2]uint64]bool{}
	var wg sync.WaitGroup
	run := func(g *Consumer, quit <-chan struct{}) {
		defer wg.Done()
		defer g.Close()
		for {
			select {
			case <-quit:
				return
			default:
			}
			m, err := g.Receive(timeout(t, 20*time.Millisecond))
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Error(err)
					return
				}
				continue
			}
			mu.Lock()
			seen[[2]uint64{uint64(m.Partition), m.Offset}] = true
			mu.Unlock()
			g.Ack(m)
		}
	}
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		b := make([]byte, 50)
		for range per {
			for p := range parts {
				if _, err := l.Send(ctx, p, b); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	quits := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	counts := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }
	for _, q := range quits {
		g, err := l.JoinGroup(name, GroupConfig{})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go run(g, q)
	}
	// Leave while records flow: after a sixth and after a third of them.
	for _, at := range []int{parts * per / 6, parts * per / 3} {
		for counts() < at && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		if at == parts*per/6 {
			close(quits[1])
		} else {
			close(quits[2])
		}
	}
	for counts() < parts*per && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(quits[0])
	wg.Wait()
	<-sendDone
	if n := counts(); n != parts*per {
		t.Errorf("%d of %d records never delivered", parts*per-n, parts*per)
	}
	RemoveGroup(l.Name(), name)
}

// TestGroupStaleTake: a member's take of a partition from a member list of
// an older generation must not leave the partition owned by nobody. n's
// rebalance reads the members at gen2 (p3 is n's), x joins (gen3: p3 is
// m's again), m keeps p3 at gen3, then n's take of p3 at gen2 comes.
func TestGroupStaleTake(t *testing.T) {
	l := newLog(t, Config{Partitions: 4, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := "staletake"
	m := join(t, l, name, GroupConfig{})
	m.Receive(timeout(t, 20*time.Millisecond)) // m owns 0-3
	n := join(t, l, name, GroupConfig{})
	_, gen2, err := n.members()
	if err != nil {
		t.Fatal(err)
	}
	x := join(t, l, name, GroupConfig{})
	m.Receive(timeout(t, 20*time.Millisecond)) // m rebalances at gen3, keeps p3
	n.mu.Lock()
	n.take(3, gen2) // the rest of n's stale rebalance
	n.mu.Unlock()
	for range 2 {
		for _, c := range []*Consumer{n, x, m} {
			c.Receive(timeout(t, 20*time.Millisecond))
		}
	}
	if _, err := l.Send(ctx, 3, []byte("p3")); err != nil {
		t.Fatal(err)
	}
	got := false
	for _, c := range []*Consumer{m, n, x, m, n, x} {
		if msg, err := c.Receive(timeout(t, 100*time.Millisecond)); err == nil && msg.Partition == 3 {
			got = true
		}
	}
	if !got {
		st, _ := m.Stats(3)
		t.Errorf("a record of p3 is never delivered (m %v, n %v, x %v): %+v", m.Assigned(), n.Assigned(), x.Assigned(), st)
	}
}

// TestGroupRepairDuringStreamRead: a repair (a dead holder's lock taken
// over, the ring emptied, next moved back) that lands while the owner
// reads its stream without the lock: the owner discards what it read, and
// the delivered, unacked records are delivered again.
func TestGroupRepairDuringStreamRead(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := fmt.Sprintf("repairread%d", groupSeq.Add(1))
	g := join(t, l, name, GroupConfig{VisibilityTimeout: time.Hour})
	offs := sendAll(t, ctx, l, 4)
	if err := g.Ack(receive(t, ctx, g)); err != nil {
		t.Fatal(err)
	}
	receive(t, ctx, g)
	receive(t, ctx, g) // records 1 and 2 in flight
	seg, err := shm.OpenSegment(groupName(l.Name(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	word := func(off int) *atomic.Uint64 { w, _ := seg.Uint64At(off); return w }
	base := gOffParts0
	head := word(base + pwHead*8).Load()
	word(base + (partHeader+int((head+1)%256)*entryWords+1)*8).Store(0) // a half-written entry
	// What Receive does next, with the lock's holder dying while the
	// stream is read (before pollStream's lockPart).
	g.mu.Lock()
	word(base).Store(uint64(0x7ffffff0)<<32 | 1) // the lock's owner: no such process
	word(base + 8).Add(1)                        // its write open
	m, ok, err := g.pollStream(ctx, 0, g.parts[0])
	g.mu.Unlock()
	if ok {
		g.Ack(m)
	}
	got := map[uint64]bool{}
	for {
		m, err := g.Receive(timeout(t, 100*time.Millisecond))
		if err != nil {
			break
		}
		got[m.Offset] = true
		g.Ack(m)
	}
	for _, i := range []int{1, 2} {
		if !got[offs[0][i]] {
			st, _ := g.Stats(0)
			t.Errorf("record %d (offset %d, delivered, never acked) is never delivered again (pollStream: %d %v %v; delivered after %v; %+v)", i, offs[0][i], m.Offset, ok, err, got, st)
		}
	}
}

// TestGroupCountTOCTOU: a ring count that flips between a sane value and
// a huge one between its check and its use never makes Receive loop over
// the huge one.
func TestGroupCountTOCTOU(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := fmt.Sprintf("toctou%d", groupSeq.Add(1))
	g, err := l.JoinGroup(name, GroupConfig{MaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer RemoveGroup(l.Name(), name)
	sendAll(t, ctx, l, 3)
	g.Nack(receive(t, ctx, g)) // minDue 0: every poll scans the ring (due)
	seg, err := shm.OpenSegment(groupName(l.Name(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	w, _ := seg.Uint64At(gOffParts0 + pwCount*8)
	due, _ := seg.Uint64At(gOffParts0 + pwMinDue*8)
	stop := make(chan struct{})
	flipped := make(chan struct{})
	go func() {
		defer close(flipped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			w.Store(1)
			due.Store(0)
			w.Store(1 << 40)
			runtime.Gosched()
		}
	}()
	for i := range 2000 {
		done := make(chan error, 1)
		go func() {
			_, err := g.Receive(timeout(t, 5*time.Millisecond))
			done <- err
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			for _, gr := range strings.Split(string(buf[:n]), "\n\n") {
				if strings.Contains(gr, "Receive") {
					t.Log(gr)
				}
			}
			close(stop)
			t.Fatalf("Receive %d has not returned in 5 s (a loop over a count of 1<<40)", i) // g stays open: its Receive holds it
		}
	}
	close(stop)
	<-flipped
	g.Close()
}

// TestGroupKilledOwnerPinSameProcessBuddy: TestGroupKilledOwnerPin with a
// second, idle member of the group in the owner's process: the buddy the
// pin is held in the name of must be in another process, else the pin dies
// with its owner.
func TestGroupKilledOwnerPinSameProcessBuddy(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
	ctx := timeout(t, 30*time.Second)
	const group = "ownerpin2"
	b := make([]byte, 1000)
	var first uint64
	for i := range 7 {
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = off
		}
	}
	child := startMember(t, l, group, "MQ_WAIT=1", "MQ_HOLD=1", "MQ_THEN_ACK=6", "MQ_SECOND=1") // members 0 and 1
	g := join(t, l, group, GroupConfig{VisibilityTimeout: time.Hour})                           // member 2
	if _, err := io.WriteString(child.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	for child.lines.Scan() && child.lines.Text() != "holding" {
	}
	child.cmd.Process.Kill()
	child.cmd.Wait()
	if sent, err := sendUntilFull(t, ctx, l, 0, 7); !errors.Is(err, ErrFull) {
		t.Errorf("after %d records no ErrFull (%v): the dead owner's pin died with it (its buddy was in its process)", sent, err)
	}
	m, err := g.Receive(timeout(t, time.Second))
	if err != nil || m.Offset != first || m.Attempt != 2 {
		st, _ := g.Stats(0)
		t.Fatalf("survivor: offset %d attempt %d %v, want %d attempt 2; stats %+v", m.Offset, m.Attempt, err, first, st)
	}
}

// slotsInUse counts the log's reader slots held.
func slotsInUse(l *Log) int {
	n := 0
	for i := range maxReaders {
		w, _ := l.meta.Uint64At(offReaders + i*line)
		if w.Load() != 0 {
			n++
		}
	}
	return n
}

// TestGroupSlotLeak: members join and leave thirty times, with acks and
// nacks, while one stays: the pins handed over at each leave are released,
// and after the last Close no reader slot of the log is held.
func TestGroupSlotLeak(t *testing.T) {
	l := newLog(t, Config{Partitions: 4, SegmentSize: 4096, Segments: 4, Full: FullFail})
	ctx := timeout(t, 30*time.Second)
	name := fmt.Sprintf("slots%d", groupSeq.Add(1))
	defer RemoveGroup(l.Name(), name)
	b := make([]byte, 500)
	keep, err := l.JoinGroup(name, GroupConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		g, err := l.JoinGroup(name, GroupConfig{})
		if err != nil {
			t.Fatal(err)
		}
		for range 10 {
			for p := range 4 {
				l.Send(ctx, p, b) // ErrFull once the group is behind
			}
		}
		for _, c := range []*Consumer{keep, g, keep, g} {
			if m, err := c.Receive(timeout(t, 5*time.Millisecond)); err == nil {
				if i%2 == 0 {
					c.Nack(m)
				} else {
					c.Ack(m)
				}
			}
		}
		g.Close()
	}
	for {
		m, err := keep.Receive(timeout(t, 50*time.Millisecond))
		if err != nil {
			break
		}
		keep.Ack(m)
	}
	if n := slotsInUse(l); n > 2*4+1 {
		t.Errorf("keep owns %v; %d reader slots in use, want at most 2 per partition + 1", keep.Assigned(), n)
	}
	keep.Close()
	if n := slotsInUse(l); n != 0 {
		t.Errorf("%d reader slots leaked", n)
	}
}

// TestGroupCloseAfterHandover: a holds a message of partition 1 when b
// joins and takes partition 1 (a is alive: the entry keeps its deadline);
// a then Closes: its message is redelivered at once, not after the
// visibility timeout (an hour).
func TestGroupCloseAfterHandover(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	cfg := GroupConfig{VisibilityTimeout: time.Hour}
	a := join(t, l, "handover", cfg)
	if _, err := l.Send(ctx, 1, []byte("x")); err != nil {
		t.Fatal(err)
	}
	held := receive(t, ctx, a)
	b := join(t, l, "handover", cfg)
	if m, err := b.Receive(timeout(t, 100*time.Millisecond)); err == nil {
		t.Fatalf("b got partition %d offset %d", m.Partition, m.Offset)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	m, err := b.Receive(timeout(t, time.Second))
	if err != nil || m.Offset != held.Offset || m.Attempt != 2 {
		st, _ := b.Stats(1)
		t.Fatalf("a closed holding partition 1 offset %d: b got offset %d attempt %d, %v; stats %+v", held.Offset, m.Offset, m.Attempt, err, st)
	}
}

// TestGroupBogusOwner: garbage in a partition's owner word that names a
// plausible member (slot 5, free) does not wedge the partition: its
// assigned member takes it back and delivers the pending records.
func TestGroupBogusOwner(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := "bogusowner"
	g := join(t, l, name, GroupConfig{MaxInFlight: 4})
	sendAll(t, ctx, l, 3)
	if err := g.Ack(receive(t, ctx, g)); err != nil {
		t.Fatal(err)
	}
	seg, err := shm.OpenSegment(groupName(l.Name(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	w, _ := seg.Uint64At(gOffParts0 + pwOwner*8)
	w.Store(holderWord(5, 7))
	got := 0
	for range 3 {
		if m, err := g.Receive(timeout(t, 300*time.Millisecond)); err == nil {
			got++
			g.Ack(m)
		}
	}
	if got != 2 {
		t.Errorf("%d of the 2 pending records delivered after a bogus owner word (assigned %v)", got, g.Assigned())
	}
}

// TestGroupCorruptStarves: one partition's corrupt state (a ring count
// past the capacity) is reported once and does not starve the member's
// healthy partition.
func TestGroupCorruptStarves(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	name := fmt.Sprintf("starve%d", groupSeq.Add(1))
	g := join(t, l, name, GroupConfig{})
	ctx := timeout(t, 5*time.Second)
	sendAll(t, ctx, l, 5)
	if m := receive(t, ctx, g); m.Partition != 0 {
		t.Fatalf("first message from partition %d", m.Partition)
	} else {
		g.Ack(m)
	}
	seg, err := shm.OpenSegment(groupName(l.Name(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	w, _ := seg.Uint64At(gOffParts0 + partWords(256)*8 + pwCount*8)
	w.Store(1 << 20)
	got, errs := 0, 0
	for range 20 {
		m, err := g.Receive(timeout(t, 10*time.Millisecond))
		switch {
		case err == nil && m.Partition == 0:
			got++
			g.Ack(m)
		case errors.Is(err, shm.ErrCorrupt):
			errs++
		}
	}
	if got != 4 || errs != 1 {
		t.Errorf("partition 0 (healthy, 4 records left): %d delivered in 20 Receives, %d corrupt errors (want 4 and 1)", got, errs)
	}
}

// TestGroupRedeliveryReadAt: a redelivery reads its record with
// Log.ReadAt, not a Reader of its own: no reader slot for it (a Reader
// also mapped the next segment ahead, touching its pages, for each
// redelivery: 6 ms with 64 MiB segments).
func TestGroupRedeliveryReadAt(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 64 << 10, Segments: 4})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{})
	sendAll(t, ctx, l, 2)
	m := receive(t, ctx, g)
	for range 3 {
		if err := g.Nack(m); err != nil {
			t.Fatal(err)
		}
		r := receive(t, ctx, g)
		if r.Offset != m.Offset || r.Attempt != m.Attempt+1 || len(r.Payload) != 100 {
			t.Fatalf("redelivered offset %d attempt %d (%d bytes), want offset %d attempt %d", r.Offset, r.Attempt, len(r.Payload), m.Offset, m.Attempt+1)
		}
		if _, seq := parse(t, r.Payload); seq != 0 {
			t.Fatalf("redelivered seq %d, want 0", seq)
		}
		if n := slotsInUse(l); n != 2 {
			t.Errorf("%d reader slots in use while a redelivered payload is held, want 2 (stream and pin)", n)
		}
		m = r
	}
}

// TestGroupAssignedDoesNotWait: Assigned answers while a Receive is under
// way (Receive holds the consumer's lock while it waits).
func TestGroupAssignedDoesNotWait(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	g := join(t, l, "", GroupConfig{})
	g.Receive(timeout(t, 10*time.Millisecond))
	g.mu.Lock() // as a Receive under way holds it
	done := make(chan []int, 1)
	go func() { done <- g.Assigned() }()
	select {
	case a := <-done:
		if len(a) != 2 {
			t.Errorf("Assigned() = %v, want both partitions", a)
		}
	case <-time.After(5 * time.Second):
		t.Error("Assigned waits for the Receive under way")
		g.mu.Unlock()
		<-done
		return
	}
	g.mu.Unlock()
}

// until polls cond (every 100 µs) until it holds, failing the test if
// ctx ends first.
func until(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("never: %s", what)
		case <-tick.C:
		}
	}
}

// receiveAsync runs g.Receive in a goroutine, until the test ends (the
// caller's ctx bounds the wait for its result: a Receive whose ctx ended
// still returns a message it finds then).
func receiveAsync(t *testing.T, g *Consumer) <-chan receiveResult {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // before g's Close, which waits for the Receive
	done := make(chan receiveResult, 1)
	go func() {
		m, err := g.Receive(ctx)
		done <- receiveResult{m, err}
	}()
	return done
}

// result waits for done until ctx ends.
func result(t *testing.T, ctx context.Context, done <-chan receiveResult, what string) receiveResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		t.Fatalf("no message: %s", what)
		return receiveResult{}
	}
}

// asleep waits until a Receive sleeps on partition p's futex word: the
// count of its sleepers is zeroed first (an earlier sleep left it up),
// and the sleeper counts itself just before its ready check and the
// futex wait.
func asleep(t *testing.T, ctx context.Context, l *Log, p int, receive func()) {
	t.Helper()
	pt := l.parts[p]
	pt.sleepers.Store(0)
	receive()
	until(t, ctx, fmt.Sprintf("a Receive asleep on partition %d", p), func() bool { return pt.sleepers.Load() != 0 })
}

type receiveResult struct {
	m   Message
	err error
}

// TestGroupNackWakesSleeper: a member that owns one partition sleeps on
// the partition's futex word; a Nack must wake it (its sleep is made an
// hour long here: without the wake-up, the redelivery waits for it).
func TestGroupNackWakesSleeper(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour})
	sendAll(t, ctx, l, 1)
	m := receive(t, ctx, g)
	var done <-chan receiveResult
	asleep(t, ctx, l, 0, func() { done = receiveAsync(t, g) })
	if err := g.Nack(m); err != nil {
		t.Fatal(err)
	}
	r := result(t, ctx, done, "the nacked message is not redelivered (the sleeper was not woken)")
	if r.err != nil || r.m.Offset != m.Offset || r.m.Attempt != 2 {
		t.Fatalf("after a Nack: offset %d attempt %d, %v; want offset %d attempt 2 (the sleeper was not woken)", r.m.Offset, r.m.Attempt, r.err, m.Offset)
	}
}

// TestGroupLeaveWakesSleeper: a member asleep on its one partition's
// futex word must see a generation change (here another member's Close,
// which gives it a partition with a record waiting) at once, not at the
// end of its sleep (an hour here).
func TestGroupLeaveWakesSleeper(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := fmt.Sprintf("leavewake%d", groupSeq.Add(1))
	cfg := GroupConfig{parkFor: time.Hour}
	a := join(t, l, name, cfg)
	b := join(t, l, name, cfg)
	a.Receive(timeout(t, 10*time.Millisecond))
	b.Receive(timeout(t, 10*time.Millisecond))
	if got := a.Assigned(); len(got) != 1 || got[0] != 0 {
		t.Fatalf("a owns %v, want [0]", got)
	}
	off, err := l.Send(ctx, 1, []byte("p1"))
	if err != nil {
		t.Fatal(err)
	}
	var done <-chan receiveResult
	asleep(t, ctx, l, 0, func() { done = receiveAsync(t, a) })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	r := result(t, ctx, done, "partition 1's record is not delivered (a was not woken)")
	if r.err != nil || r.m.Partition != 1 || r.m.Offset != off {
		t.Fatalf("after b's Close: partition %d offset %d, %v; want partition 1 offset %d (a was not woken)", r.m.Partition, r.m.Offset, r.err, off)
	}
}

// TestGroupOpenLoanNoHeadOfLine: a live producer's open loan in one
// partition does not hold up the member's other partition: every look at
// the loaned record gives up after the reader's spin (a dead producer's
// record is skipped at the look that finds it dead). A second look used to
// wait for it synchronously (60 ms each round; an hour here, with the
// member's sleep bound).
func TestGroupOpenLoanNoHeadOfLine(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{parkFor: time.Hour})
	res, err := l.Loan(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var offs []uint64
	for i := range 3 {
		off, err := l.Send(ctx, 1, []byte{byte(i)})
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
	}
	for i, want := range offs {
		r := result(t, ctx, receiveAsync(t, g), fmt.Sprintf("record %d of partition 1 held up behind partition 0's open loan", i))
		if r.err != nil || r.m.Partition != 1 || r.m.Offset != want {
			t.Fatalf("record %d: partition %d offset %d, %v; want partition 1 offset %d", i, r.m.Partition, r.m.Offset, r.err, want)
		}
		g.Ack(r.m)
	}
	// The loan's commit wakes the member, asleep with nothing to do.
	done := receiveAsync(t, g)
	if err := res.Commit(); err != nil {
		t.Fatal(err)
	}
	r := result(t, ctx, done, "the committed loan is not delivered")
	if r.err != nil || r.m.Partition != 0 || r.m.Offset != res.Offset() {
		t.Fatalf("after the commit: partition %d offset %d, %v; want partition 0 offset %d", r.m.Partition, r.m.Offset, r.err, res.Offset())
	}
}

// TestGroupOpenLoanOnePartition: a member of one partition with a live
// producer's open loan at its stream's head sleeps until the commit
// instead of spinning: the commit wakes it.
func TestGroupOpenLoanOnePartition(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{parkFor: time.Hour})
	res, err := l.Loan(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var done <-chan receiveResult
	asleep(t, ctx, l, 0, func() { done = receiveAsync(t, g) })
	if err := res.Commit(); err != nil {
		t.Fatal(err)
	}
	r := result(t, ctx, done, "the committed loan is not delivered")
	if r.err != nil || r.m.Offset != res.Offset() {
		t.Fatalf("offset %d, %v; want %d", r.m.Offset, r.err, res.Offset())
	}
}

// TestGroupIdleDoesNotPoll: an idle member that owns several partitions
// sleeps until a producer commits to one of them (or a Nack, or a new
// generation), instead of waking every millisecond to look (its sleep
// bound is an hour here).
func TestGroupIdleDoesNotPoll(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour})
	g.Receive(timeout(t, 10*time.Millisecond))
	if got := g.Assigned(); len(got) != 2 {
		t.Fatalf("owns %v", got)
	}
	naps := g.naps.Load()
	done := receiveAsync(t, g)
	until(t, ctx, "the member asleep", func() bool { return g.naps.Load() > naps })
	// A sleep ends only when something wakes it: none comes for 200 ms
	// (a loaded machine can hide a poll, not invent one).
	watch := timeout(t, 200*time.Millisecond)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for watch.Err() == nil {
		if n := g.naps.Load() - naps; n > 2 {
			t.Fatalf("an idle member slept %d times in 200 ms: it polls", n)
		}
		select {
		case <-watch.Done():
		case <-tick.C:
		}
	}
	off, err := l.Send(ctx, 1, []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	r := result(t, ctx, done, "a commit did not wake the idle member")
	if r.err != nil || r.m.Partition != 1 || r.m.Offset != off {
		t.Fatalf("partition %d offset %d, %v; want partition 1 offset %d", r.m.Partition, r.m.Offset, r.err, off)
	}
	// A Nack wakes it too.
	naps = g.naps.Load()
	done = receiveAsync(t, g)
	until(t, ctx, "the member asleep", func() bool { return g.naps.Load() > naps })
	if err := g.Nack(r.m); err != nil {
		t.Fatal(err)
	}
	again := result(t, ctx, done, "a Nack did not wake the idle member")
	if again.err != nil || again.m.Offset != off || again.m.Attempt != 2 {
		t.Fatalf("after the Nack: offset %d attempt %d, %v", again.m.Offset, again.m.Attempt, again.err)
	}
}

// TestGroupTornReads: members() and Stats read without a lock and retry
// a read that a write overlapped; under a writer that keeps changing the
// sequence word (here: between every read and its validation) they must
// still return, not retry forever.
func TestGroupTornReads(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := fmt.Sprintf("torn%d", groupSeq.Add(1))
	g := join(t, l, name, GroupConfig{})
	sendAll(t, ctx, l, 1)
	m := receive(t, ctx, g)
	seg, err := shm.OpenSegment(groupName(l.Name(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	groupSeqWord, _ := seg.Uint64At(gOffLock + 8)
	partSeqWord, _ := seg.Uint64At(gOffParts0 + 8)
	var stop atomic.Bool // the test failed: let the reads through, to end them
	g.torn = func() {
		if !stop.Load() {
			groupSeqWord.Add(2)
			partSeqWord.Add(2)
		}
	}
	type answer struct {
		what string
		err  error
	}
	done := make(chan answer, 2)
	go func() {
		slots, _, err := g.members()
		if err == nil && (len(slots) != 1 || slots[0] != g.Member()) {
			err = fmt.Errorf("members %v, want [%d]", slots, g.Member())
		}
		done <- answer{"members", err}
	}()
	go func() {
		st, err := g.Stats(0)
		if err == nil && (st.InFlight != 1 || st.Committed != m.Offset) {
			err = fmt.Errorf("stats %+v, want one in flight at %d", st, m.Offset)
		}
		done <- answer{"Stats", err}
	}()
	for i := 0; i < 2; i++ {
		select {
		case a := <-done:
			if a.err != nil {
				t.Errorf("%s: %v", a.what, a.err)
			}
		case <-ctx.Done():
			if !stop.Swap(true) {
				t.Error("members() or Stats retries forever under a writer that keeps changing the sequence")
			}
			i--
		}
	}
}

// TestGroupGarbagePinRecord: a pin record in the partition state that
// names a gone member and a live reader slot of the same partition (here
// the owner's own stream reader, in its own name) is garbage: releasing
// it must not free that slot. Only a slot that a group pin holds, as that
// record says, is freed.
func TestGroupGarbagePinRecord(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{})
	sendAll(t, ctx, l, 2)
	receive(t, ctx, g)
	gp := g.parts[0]
	rs := g.readerSlot(gp.stream)
	if rs < 0 {
		t.Fatal("no reader slot for the stream")
	}
	owner, _ := l.meta.Uint64At(offReaders + rs*line)
	held := owner.Load()
	last := pwPins + 2*(maxPins-1)
	gp.w[last+1].Store(held)
	gp.w[last].Store(uint64(rs+1) | holderWord(5, 7)<<8) // member 5 is gone
	if err := g.lockPart(0); err != nil {
		t.Fatal(err)
	}
	g.releaseOrphans(0, gp)
	gp.lock.Unlock()
	if w := owner.Load(); w != held {
		t.Fatalf("the stream's reader slot %d was freed by a garbage pin record (owner %#x, was %#x)", rs, w, held)
	}
	if m, err := g.Receive(ctx); err != nil || m.Attempt != 1 {
		t.Fatalf("after the garbage record: offset %d attempt %d, %v", m.Offset, m.Attempt, err)
	}
}

// TestGroupDeadLetterBlocked: a record out of attempts is being copied to
// a dead-letter log under FullBlock that is full (a reader holds its
// oldest segment), so the copy waits. Meanwhile the delivery nacked
// before can no longer be acked (the copy holds the entry as a new
// attempt), and Close does not wait for the copy: it ends it.
func TestGroupDeadLetterBlocked(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	dl := newLog(t, Config{SegmentSize: 4096 + deadLetterHeader, Segments: 2, Full: FullBlock})
	ctx := timeout(t, 10*time.Second)
	dr := newReader(t, dl, 0, Oldest) // holds segment 0
	for range 8 {                     // four records of 1,016 bytes fill a segment
		if _, err := dl.Send(ctx, 0, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dl.Send(doneCtx, 0, make([]byte, 100)); err == nil {
		t.Fatal("the dead-letter log is not full")
	}
	g, err := l.JoinGroup(fmt.Sprintf("dlblock%d", groupSeq.Add(1)), GroupConfig{MaxAttempts: 1, DeadLetter: dl, VisibilityTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close(); RemoveGroup(l.Name(), g.name) })
	sendAll(t, ctx, l, 1)
	m := receive(t, ctx, g)
	if err := g.Nack(m); err != nil {
		t.Fatal(err)
	}
	pt := dl.parts[0]
	pt.blocked.Store(0) // the check above counted itself
	done := receiveAsync(t, g)
	until(t, ctx, "the dead-letter copy blocked on the full log", func() bool { return pt.blocked.Load() != 0 })
	if err := g.Ack(m); !errors.Is(err, ErrNotHeld) {
		t.Errorf("the nacked delivery acked while it is being dead-lettered: %v, want ErrNotHeld", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- g.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Error(err)
		}
	case <-ctx.Done():
		t.Error("Close waits for a dead-letter copy blocked on a full log")
		dr.Close() // frees the log: the copy, then Close, go on
		<-closed
	}
	if r := <-done; !errors.Is(r.err, ErrClosed) {
		t.Errorf("the Receive under way: %v, want ErrClosed", r.err)
	}
}

// TestGroupCreatorDied: a group whose creator died before it wrote the
// magic is made usable by the next member to join, not left refused
// until RemoveGroup: the creator died with an empty segment ("empty"),
// with nothing but the segment's file ("file": before its header), or
// holding the group lock with its write open halfway through ("locked").
func TestGroupCreatorDied(t *testing.T) {
	for _, state := range []string{"empty", "file", "locked"} {
		t.Run(state, func(t *testing.T) {
			l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
			ctx := timeout(t, 10*time.Second)
			name := fmt.Sprintf("creator%d", groupSeq.Add(1))
			gname := groupName(l.Name(), name)
			t.Cleanup(func() { RemoveGroup(l.Name(), name) })
			if state == "file" {
				f, err := os.OpenFile(shmFile(gname), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
				t.Cleanup(func() { os.Remove(shmFile(gname)) })
			} else {
				seg, err := shm.CreateSegment(gname, groupSize(2, 256), &shm.SegmentConfig{Keep: true})
				if err != nil {
					t.Fatal(err)
				}
				if state == "locked" {
					w := func(off int) *atomic.Uint64 { w, _ := seg.Uint64At(off); return w }
					w(gOffParts).Store(2)
					w(gOffLock).Store(uint64(0x7ffffff0)<<32 | 1) // the lock's owner: no such process
					w(gOffLock + 8).Store(1)                      // its write open
				}
				seg.Close()
			}
			// A segment RepairSegment remakes names this process as its
			// creator: the join must not wait for itself.
			var waited atomic.Bool
			groupHook = func(step, n string) {
				if step == "waiting" && n == name {
					waited.Store(true)
				}
			}
			t.Cleanup(func() { groupHook = nil })
			g := join(t, l, name, GroupConfig{})
			if waited.Load() {
				t.Error("the join waited for a creator that is gone")
			}
			sendAll(t, ctx, l, 1)
			for range 2 {
				if err := g.Ack(receive(t, ctx, g)); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// calledFrom reports whether the caller of the function that calls it is
// fn (a suffix such as ".(*Consumer).sleep"): the tests below act from a
// group's clock at the moment its sleep asks for the time.
func calledFrom(fn string) bool {
	pc, _, _, ok := runtime.Caller(2)
	if !ok {
		return false
	}
	f := runtime.FuncForPC(pc)
	return f != nil && strings.HasSuffix(f.Name(), fn)
}

// TestGroupStuckCommitBeforeSleep: a member gives up on a record at its
// stream's head whose producer holds the loan, and the producer commits
// it after that look but before the member registers as a sleeper (here:
// from the clock at the start of sleep). The commit's wake-up finds
// nobody asleep; a sleeper that trusted its last look (stuck) slept its
// whole bound, an hour here (20 ms by default), with a committed record
// at its head (review finding). With one partition and with two.
func TestGroupStuckCommitBeforeSleep(t *testing.T) {
	for _, parts := range []int{1, 2} {
		t.Run(fmt.Sprint(parts), func(t *testing.T) {
			l := newLog(t, Config{Partitions: parts, SegmentSize: 4096})
			ctx := timeout(t, 10*time.Second)
			res, err := l.Loan(ctx, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			var g *Consumer
			var committed atomic.Bool
			cfg := GroupConfig{parkFor: time.Hour, now: func() time.Time {
				if g != nil && g.parts[0].stuck != 0 && calledFrom(".(*Consumer).sleep") && !committed.Swap(true) {
					if err := res.Commit(); err != nil {
						panic(err)
					}
				}
				return time.Now()
			}}
			g = join(t, l, "", cfg)
			m, err := g.Receive(ctx)
			if err != nil || m.Offset != res.Offset() || !committed.Load() {
				t.Fatalf("committed in the window: %v; offset %d, %v; want the committed loan at %d", committed.Load(), m.Offset, err, res.Offset())
			}
			// A lost wake-up ends the sleep at ctx's deadline, after
			// which Receive polls and finds the record all the same.
			if ctx.Err() != nil {
				t.Fatal("the member slept until its context ended: the commit did not wake it")
			}
		})
	}
}

// TestGroupGenChangeBeforeSleep: a member's leave that lands after
// Receive compared generations but before the other member sleeps (from
// its clock at the start of sleep) rang before the sleeper registered: a
// sleeper that compared with the generation it found then, and not with
// the one it acted on, slept its whole bound (an hour here) before taking
// over the partition the leaver had (review finding).
func TestGroupGenChangeBeforeSleep(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := fmt.Sprintf("genwake%d", groupSeq.Add(1))
	var b *Consumer
	var armed, fired atomic.Bool
	cfg := GroupConfig{parkFor: time.Hour}
	acfg := cfg
	acfg.now = func() time.Time {
		if armed.Load() && calledFrom(".(*Consumer).sleep") && !fired.Swap(true) {
			b.Close()
		}
		return time.Now()
	}
	a := join(t, l, name, acfg)
	b = join(t, l, name, cfg)
	owns := func(g *Consumer, p int) bool { got := g.Assigned(); return len(got) == 1 && got[0] == p }
	for !owns(a, 0) || !owns(b, 1) {
		a.Receive(timeout(t, 10*time.Millisecond))
		b.Receive(timeout(t, 10*time.Millisecond))
		if ctx.Err() != nil {
			t.Fatalf("a owns %v and b %v, want [0] and [1]", a.Assigned(), b.Assigned())
		}
	}
	off, err := l.Send(ctx, 1, []byte("p1"))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	rctx := timeout(t, 10*time.Second)
	m, err := a.Receive(rctx)
	if err != nil || m.Partition != 1 || m.Offset != off || !fired.Load() {
		t.Fatalf("b left in the window: %v; partition %d offset %d, %v; want partition 1's record", fired.Load(), m.Partition, m.Offset, err)
	}
	if rctx.Err() != nil {
		t.Fatal("a slept until its context ended: b's leave did not wake it")
	}
}

// TestGroupCommitsDoNotWakeUnreadyMember: a member that no commit can make
// ready (its ring full, waiting for an Ack; two partitions with full
// rings; no partition at all, more members than partitions) sleeps
// through commits: only ring (an Ack that makes room, a new generation)
// wakes it. It used to sleep on the log's word for any partition, which
// every commit wakes: a sleep per commit. After each commit the test waits
// for the member to be registered asleep again (a commit takes the
// sleepers it wakes), so a member woken by commits sleeps once per commit.
func TestGroupCommitsDoNotWakeUnreadyMember(t *testing.T) {
	const commits = 200
	for _, c := range []struct {
		name  string
		parts int
	}{{"full ring", 1}, {"full rings", 2}, {"no partition", 1}} {
		t.Run(c.name, func(t *testing.T) {
			l := newLog(t, Config{Partitions: c.parts, SegmentSize: 1 << 20})
			ctx := timeout(t, 20*time.Second)
			name := fmt.Sprintf("unready%d", groupSeq.Add(1))
			cfg := GroupConfig{MaxInFlight: 1, VisibilityTimeout: time.Hour, parkFor: time.Hour}
			g := join(t, l, name, cfg)
			var other *Consumer
			var held []Message
			if c.name == "no partition" {
				g.Receive(timeout(t, 10*time.Millisecond))
				other = join(t, l, name, cfg)
				other.Receive(timeout(t, 10*time.Millisecond))
				g.Receive(timeout(t, 10*time.Millisecond))
				if got := other.Assigned(); len(got) != 0 {
					t.Fatalf("the second member owns %v, want nothing", got)
				}
				g, other = other, g
			} else {
				sendAll(t, ctx, l, 1)
				for range c.parts {
					held = append(held, receive(t, ctx, g)) // every ring full
				}
			}
			asleep := func() bool {
				return l.parts[0].anySleepers.Load() != 0 || l.parts[0].sleepers.Load() != 0 || g.bellSleepers.Load() != 0
			}
			naps := g.naps.Load()
			done := receiveAsync(t, g)
			until(t, ctx, "the member asleep", func() bool { return g.naps.Load() > naps && asleep() })
			naps = g.naps.Load()
			for range commits {
				if _, err := l.Send(ctx, 0, []byte("x")); err != nil {
					t.Fatal(err)
				}
				until(t, ctx, "the member asleep again", asleep)
			}
			if n := g.naps.Load() - naps; n > 2 {
				t.Fatalf("the member slept %d times during %d commits: commits wake it", n, commits)
			}
			// What does wake it: an Ack that makes room, a leave.
			if other != nil {
				if err := other.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				for _, m := range held {
					if m.Partition == 0 {
						if err := g.Ack(m); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			r := result(t, ctx, done, "the member was not woken")
			if r.err != nil || r.m.Partition != 0 {
				t.Fatalf("partition %d offset %d, %v", r.m.Partition, r.m.Offset, r.err)
			}
		})
	}
}

// errCrash is what a pinStep hook panics with: the member "dies" there.
var errCrash = errors.New("crashed here")

// pinInBuddy makes a group whose one member owns partition 0 with its pin
// held in the name of a live process other than this one (the test's
// parent stands in for a buddy in another process: its word is buddy)
// and recorded.
func pinInBuddy(t *testing.T) (l *Log, name string, g *Consumer, rs int, buddy uint64) {
	t.Helper()
	l = newLog(t, Config{SegmentSize: 4096})
	name = fmt.Sprintf("pincrash%d", groupSeq.Add(1))
	g = join(t, l, name, GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour})
	g.Receive(timeout(t, 10*time.Millisecond))
	parent, err := shm.LookupProcess(os.Getppid())
	if err != nil || !shm.AliveWord(parent.Word()) {
		t.Fatalf("no live parent process to stand in for a buddy: %v", err)
	}
	gp := g.parts[0]
	g.buddy.Store(parent.Word())
	if err := g.lockPart(0); err != nil {
		t.Fatal(err)
	}
	err = g.repin(0, gp)
	gp.lock.Unlock()
	if err != nil || gp.pin == nil || gp.pin.me != parent.Word() {
		t.Fatalf("pin not in the buddy's name: %v", err)
	}
	if rs = g.readerSlot(gp.pin); rs < 0 {
		t.Fatal("no reader slot for the pin")
	}
	return l, name, g, rs, parent.Word()
}

// crashAt runs f with g's pinStep hook panicking at step, and reports
// whether it did.
func crashAt(g *Consumer, step string, f func()) (crashed bool) {
	g.pinStep = func(s string) {
		if s == step {
			panic(errCrash)
		}
	}
	defer func() {
		g.pinStep = nil
		if r := recover(); r != nil {
			if r != errCrash {
				panic(r)
			}
			crashed = true
		}
	}()
	f()
	return false
}

// deadWord is a process word no live process has.
const deadWord = uint64(0x7ffffff0)<<32 | 1

// die makes g look like a member whose process died: its member slot, and
// reader slot rs if it is in g's process's name (the log reclaims the slots
// of dead processes).
func die(t *testing.T, l *Log, g *Consumer, rs int) {
	g.closed.Store(true) // its Close does nothing: it is dead
	t.Cleanup(func() {   // but its process lives on: unmap what it had
		for _, gp := range g.parts {
			for _, r := range []*Reader{gp.stream, gp.pin} {
				if r != nil {
					r.Close()
				}
			}
		}
		g.seg.Close()
	})
	g.mem[2*g.slot].Store(deadWord)
	owner, _ := l.meta.Uint64At(offReaders + rs*line)
	owner.CompareAndSwap(g.pw, deadWord)
}

// TestGroupPinCrashWindows: a member that dies between two steps of a
// pin's tagging (closing a pin, handing it over) leaves a state the
// partition's next owner cleans: the pin's reader slot ends free or in a
// dead process's name (the log reclaims it), never held in a live buddy's
// name with nothing left to release it. It used to be leaked: closePin
// untagged the slot before it closed it, and recordHandOver retagged it
// before it rewrote the record, so the record no longer matched the tag.
func TestGroupPinCrashWindows(t *testing.T) {
	for _, c := range []struct {
		step string
		do   func(g *Consumer)
	}{
		{"closePin:own", repinOwn},
		{"closePin:untagged", repinOwn},
		{"closePin:closed", repinOwn},
		{"handOver:recorded", func(g *Consumer) { g.handOver(0) }},
		{"handOver:tagged", func(g *Consumer) { g.handOver(0) }},
	} {
		t.Run(c.step, func(t *testing.T) {
			l, name, g, rs, buddy := pinInBuddy(t)
			if !crashAt(g, c.step, func() { c.do(g) }) {
				t.Fatalf("never at step %s", c.step)
			}
			die(t, l, g, rs)
			h := join(t, l, name, GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour})
			h.Receive(timeout(t, 10*time.Millisecond)) // takes partition 0 over
			if got := h.Assigned(); len(got) != 1 || got[0] != 0 {
				t.Fatalf("the survivor owns %v", got)
			}
			owner, _ := l.meta.Uint64At(offReaders + rs*line)
			if w := owner.Load(); w == buddy {
				t.Fatalf("reader slot %d of the dead member's pin is still held in the buddy's name: leaked", rs)
			}
		})
	}
}

// repinOwn moves g's pin of partition 0 back into its own process's name:
// the pin in the buddy's name is closed.
func repinOwn(g *Consumer) {
	g.buddy.Store(g.pw)
	if err := g.lockPart(0); err != nil {
		panic(err)
	}
	defer g.parts[0].lock.Unlock()
	g.repin(0, g.parts[0])
}

// TestGroupReleaseLateUntag: the next owner frees a dead member's pin slot
// and then untags it; a reader that takes the slot in between and a
// member that tags it as its own pin keep their tag (the untag compares).
// It used to erase it: the new pin's record then named a slot no release
// frees.
func TestGroupReleaseLateUntag(t *testing.T) {
	l, name, g, rs, _ := pinInBuddy(t)
	die(t, l, g, rs)
	h := join(t, l, name, GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour})
	owner, _ := l.meta.Uint64At(offReaders + rs*line)
	tag := pinTag(l, rs)
	other := uint64(rs+1) | holderWord(9, 9)<<8
	fired := false
	h.pinStep = func(s string) {
		if s == "release:freed" && !fired {
			fired = true
			owner.Store(h.pw) // a new reader, and another member's pin
			tag[0].Store(h.tag)
			tag[1].Store(other)
		}
	}
	h.Receive(timeout(t, 10*time.Millisecond))
	h.pinStep = nil
	if !fired {
		t.Fatal("the dead member's pin was not released")
	}
	if tag[0].Load() != h.tag || tag[1].Load() != other {
		t.Errorf("the slot's new tag {%#x %#x} was erased by the release's late untag: {%#x %#x}", h.tag, other, tag[0].Load(), tag[1].Load())
	}
	owner.CompareAndSwap(h.pw, 0)
}

// TestGroupJoinerWaitsForCreator: a joiner that opens a group segment its
// live creator made but has not initialized yet waits for the creator:
// the creator's MaxInFlight is the group's, and the joiner asking for
// another is refused with both values named. It used to initialize the
// group itself with its own MaxInFlight, and the creator was refused.
func TestGroupJoinerWaitsForCreator(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	name := fmt.Sprintf("creator%d", groupSeq.Add(1))
	t.Cleanup(func() { RemoveGroup(l.Name(), name) })
	created, release := make(chan struct{}), make(chan struct{})
	waiting := make(chan struct{}, 1)
	groupHook = func(step, n string) {
		switch {
		case n != name:
		case step == "created":
			close(created)
			<-release
		case step == "waiting":
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	}
	t.Cleanup(func() { groupHook = nil })
	type joined struct {
		g   *Consumer
		err error
	}
	creator, joiner := make(chan joined, 1), make(chan joined, 1)
	go func() {
		g, err := l.JoinGroup(name, GroupConfig{MaxInFlight: 16})
		creator <- joined{g, err}
	}()
	<-created
	go func() {
		g, err := l.JoinGroup(name, GroupConfig{MaxInFlight: 8})
		joiner <- joined{g, err}
	}()
	var j joined
	select {
	case <-waiting: // the fix: it waits for the creator
	case j = <-joiner: // made the group itself meanwhile
		joiner <- j
	}
	close(release)
	c := <-creator
	j = <-joiner
	for _, x := range []joined{c, j} {
		if x.g != nil {
			x.g.Close()
		}
	}
	if c.err != nil {
		t.Errorf("the creator (MaxInFlight 16) was refused: %v", c.err)
	}
	if j.err == nil || !strings.Contains(j.err.Error(), "16") || !strings.Contains(j.err.Error(), "8") {
		t.Errorf("the joiner (MaxInFlight 8): %v, want a refusal naming 16 and 8", j.err)
	}
}

// TestGroupUnfinishedTooSmall: a group segment left without its magic by a
// creator that is gone, too small for the joiner's MaxInFlight: the
// refusal names the largest MaxInFlight the segment holds.
func TestGroupUnfinishedTooSmall(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	name := fmt.Sprintf("small%d", groupSeq.Add(1))
	t.Cleanup(func() { RemoveGroup(l.Name(), name) })
	seg, err := shm.CreateSegment(groupName(l.Name(), name), groupSize(1, 8), &shm.SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	fit := maxInFlight
	for groupSize(1, fit) > seg.Size() {
		fit--
	}
	seg.Close()
	g, err := l.JoinGroup(name, GroupConfig{MaxInFlight: maxInFlight})
	if err == nil {
		g.Close()
		t.Fatal("joined with a MaxInFlight the segment cannot hold")
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("up to %d", fit)) || !strings.Contains(err.Error(), fmt.Sprint(maxInFlight)) {
		t.Errorf("%v: want the largest MaxInFlight the segment holds (%d) and the one asked for (%d)", err, fit, maxInFlight)
	}
	g = join(t, l, name, GroupConfig{MaxInFlight: fit}) // what it holds is fine
	if g.cap != fit {
		t.Errorf("MaxInFlight %d, want %d", g.cap, fit)
	}
}

// deadLetters reads every committed record of dl's partition 0 and
// returns the dead letters among them.
func deadLetters(t *testing.T, dl *Log) []DeadLetter {
	t.Helper()
	r := newReader(t, dl, 0, Oldest)
	var ds []DeadLetter
	for {
		rec, ok, err := r.NextBelow(timeout(t, 5*time.Second), dl.parts[0].tail.Load())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return ds
		}
		d, err := ParseDeadLetter(rec.Payload)
		if err != nil {
			t.Fatal(err)
		}
		d.Payload = nil // not printed
		ds = append(ds, d)
	}
}

// heldAt says whether a live producer is still writing the record of n
// bytes at off.
func heldAt(l *Log, p int, off uint64, n int) bool {
	_, release, held, _ := l.claimAt(p, off, n)
	if release != nil {
		release()
	}
	return held
}

// dyingHandle opens dl again for a member that is to die copying to it:
// its own producer slot dies with it. At cleanup the reservation the dead
// member held, unreachable, goes with the handle's mappings.
func dyingHandle(t *testing.T, dl *Log) *Log {
	dying, err := Open(dl.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dying.parts[0].mu.Lock()
		for _, m := range dying.parts[0].segs {
			for m.refs.Load() > 1 {
				m.release()
			}
		}
		dying.parts[0].mu.Unlock()
		dying.Close()
	})
	return dying
}

// dieCopying makes g, stopped by crashAt while it copied to the
// dead-letter handle dying, look like a member whose process died: its
// member slot and dying's producer slot.
func dieCopying(t *testing.T, g *Consumer, dying *Log) {
	g.closed.Store(true)
	t.Cleanup(func() {
		for _, gp := range g.parts {
			for _, r := range []*Reader{gp.stream, gp.pin} {
				if r != nil {
					r.Close()
				}
			}
		}
		if g.redo != nil {
			g.redo()
		}
		g.seg.Close()
	})
	g.mem[2*g.slot].Store(deadWord)
	dying.slots[2*dying.slot].Store(deadWord)
}

// TestGroupDeadLetterCrashWindows: a member that dies while it copies a
// message out of attempts to the dead-letter log, with the copy's space
// claimed ("claimed"), recorded in the partition's state ("recorded") or
// committed but not acked ("committed"), leaves exactly one dead letter:
// the partition's next owner acks a committed copy, and copies again
// one its dead writer never committed. A death after the commit used to
// make a second copy.
func TestGroupDeadLetterCrashWindows(t *testing.T) {
	for _, step := range []string{"deadLetter:claimed", "deadLetter:recorded", "deadLetter:committed"} {
		t.Run(step, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096})
			dl := newLog(t, Config{SegmentSize: 8192})
			dying := dyingHandle(t, dl)
			name := fmt.Sprintf("dlcrash%d", groupSeq.Add(1))
			ctx := timeout(t, 10*time.Second)
			g := join(t, l, name, GroupConfig{MaxAttempts: 1, DeadLetter: dying, VisibilityTimeout: time.Hour, parkFor: time.Hour})
			b := make([]byte, 100)
			message(b, 0, 7)
			bad, _ := l.Send(ctx, 0, b)
			message(b, 0, 8)
			good, _ := l.Send(ctx, 0, b)
			if m := receive(t, ctx, g); m.Offset != bad {
				t.Fatalf("offset %d, want %d", m.Offset, bad)
			} else if err := g.Nack(m); err != nil {
				t.Fatal(err)
			}
			if !crashAt(g, step, func() { g.Receive(ctx) }) {
				t.Fatalf("never at step %s", step)
			}
			dieCopying(t, g, dying)

			h := join(t, l, name, GroupConfig{MaxAttempts: 1, DeadLetter: dl, VisibilityTimeout: time.Hour, parkFor: time.Hour})
			if m := receive(t, ctx, h); m.Offset != good || m.Attempt != 1 {
				t.Fatalf("offset %d attempt %d, want %d attempt 1", m.Offset, m.Attempt, good)
			}
			ds := deadLetters(t, dl)
			if len(ds) != 1 || ds[0].Partition != 0 || ds[0].Offset != bad || ds[0].Attempts != 1 {
				t.Fatalf("dead letters %+v, want one of offset %d", ds, bad)
			}
			if gs, _ := h.Stats(0); gs.DeadLettered != 1 || gs.InFlight != 1 {
				t.Errorf("stats %+v, want 1 dead-lettered and the good one in flight", gs)
			}
		})
	}
}

// copyingStopped starts a Receive of g that stops, alive, in a
// dead-letter copy with its record written and the copy not committed,
// and returns when it is there. release lets it go on; finish releases
// it, ends the Receive and waits for it (again: a no-op).
func copyingStopped(t *testing.T, ctx context.Context, g *Consumer) (release, finish func()) {
	at, resume := make(chan struct{}), make(chan struct{})
	release = sync.OnceFunc(func() { close(resume) })
	g.pinStep = func(s string) {
		if s == "deadLetter:recorded" {
			close(at)
			<-resume
		}
	}
	gctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Receive(gctx)
	}()
	select {
	case <-at:
	case <-ctx.Done():
		t.Fatal("the dead-letter copy never recorded")
	}
	return release, sync.OnceFunc(func() {
		release()
		cancel()
		<-done
	})
}

// deadLetterCase is a two-partition log whose group's one member g
// (MaxAttempts 1, a fake clock, visibility a minute) got and nacked the
// first of two records sent to partition 1 (offs): its next look copies
// it to dl.
type deadLetterCase struct {
	l, dl *Log
	clock *fakeClock
	cfg   GroupConfig
	name  string
	ctx   context.Context
	g     *Consumer
	offs  [2]uint64
}

func newDeadLetterCase(t *testing.T) deadLetterCase {
	c := deadLetterCase{l: newLog(t, Config{Partitions: 2, SegmentSize: 4096}), dl: newLog(t, Config{SegmentSize: 8192}), clock: newFakeClock()}
	c.cfg = c.clock.config(GroupConfig{MaxAttempts: 1, DeadLetter: c.dl, VisibilityTimeout: time.Minute, parkFor: time.Hour})
	c.name = fmt.Sprintf("dllive%d", groupSeq.Add(1))
	c.ctx = timeout(t, 10*time.Second)
	c.g = join(t, c.l, c.name, c.cfg)
	b := make([]byte, 100)
	for i := range c.offs {
		message(b, 1, uint64(7+i))
		c.offs[i], _ = c.l.Send(c.ctx, 1, b)
	}
	m := receive(t, c.ctx, c.g)
	if m.Partition != 1 || m.Offset != c.offs[0] {
		t.Fatalf("partition %d offset %d, want 1 %d", m.Partition, m.Offset, c.offs[0])
	}
	if err := c.g.Nack(m); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGroupDeadLetterLiveCopier: the partition changes hands while its
// old owner, alive, is writing a dead-letter copy, and the entry's
// visibility timeout passes: the new owner does not copy it again while
// the copy is being written, and acks it once it is committed. (It used
// to make a second copy.)
func TestGroupDeadLetterLiveCopier(t *testing.T) {
	c := newDeadLetterCase(t)
	l, dl, clock, cfg, name, ctx, g := c.l, c.dl, c.clock, c.cfg, c.name, c.ctx, c.g
	bad, good := c.offs[0], c.offs[1]
	release, finish := copyingStopped(t, ctx, g) // g holds the copy's space, recorded, not committed
	defer finish()

	h := join(t, l, name, cfg) // takes partition 1
	clock.add(2 * time.Minute) // g's hold of the entry times out
	if m := receive(t, ctx, h); m.Partition != 1 || m.Offset != good {
		t.Fatalf("partition %d offset %d, want 1 %d", m.Partition, m.Offset, good)
	}
	if ds := deadLetters(t, dl); len(ds) != 0 {
		t.Fatalf("dead letters %+v while the first copy is being written", ds)
	}
	if gs, _ := h.Stats(1); gs.DeadLettered != 0 || gs.InFlight != 2 {
		t.Fatalf("stats %+v, want the entry still held, nothing dead-lettered", gs)
	}
	release() // g commits its copy; its ack fails: the entry was taken
	until(t, ctx, "g's copy committed", func() bool { return dl.parts[0].tail.Load() > 0 && !heldAt(dl, 0, 0, deadLetterHeader+100) })
	finish()
	clock.add(time.Second)
	if _, err := h.Receive(timeout(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after the dead letter: %v", err)
	}
	ds := deadLetters(t, dl)
	if len(ds) != 1 || ds[0].Partition != 1 || ds[0].Offset != bad {
		t.Fatalf("dead letters %+v, want one of partition 1 offset %d", ds, bad)
	}
	if gs, _ := h.Stats(1); gs.DeadLettered != 1 || gs.InFlight != 1 {
		t.Errorf("stats %+v, want 1 dead-lettered and the good one in flight", gs)
	}
}

// TestGroupLostOnlyPadding: a group whose next offset is the padding
// that ends a segment retention dropped lost nothing, and says so; one
// whose next offset is an unread record of it lost that. The first used
// to count a loss too.
func TestGroupLostOnlyPadding(t *testing.T) {
	for _, c := range []struct {
		name   string
		unread int
		lost   uint64
	}{{"padding", 0, 0}, {"record", 1, 1}} {
		t.Run(c.name, func(t *testing.T) {
			// 34 records of 100 bytes (120 with the header) leave 16
			// bytes of a 4,096-byte segment: the next record's
			// producer pads them.
			l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
			ctx := timeout(t, 10*time.Second)
			name := fmt.Sprintf("padloss%d", groupSeq.Add(1))
			send := func(from, to int) {
				b := make([]byte, 100)
				for i := from; i < to; i++ {
					message(b, 0, uint64(i))
					if _, err := l.Send(ctx, 0, b); err != nil {
						t.Fatal(err)
					}
				}
			}
			send(0, 34)
			g := join(t, l, name, GroupConfig{parkFor: time.Hour})
			for range 34 - c.unread {
				if err := g.Ack(receive(t, ctx, g)); err != nil {
					t.Fatal(err)
				}
			}
			g.Close() // nothing pins segment 0 now
			send(34, 34+35)
			if h := l.parts[0].head.Load(); h != 1 {
				t.Fatalf("the oldest segment kept is %d, want 1", h)
			}
			h := join(t, l, name, GroupConfig{parkFor: time.Hour})
			m := receive(t, ctx, h)
			if _, seq := parse(t, m.Payload); m.Offset != 4096 || seq != 34 {
				t.Fatalf("offset %d seq %d, want 4096 seq 34", m.Offset, seq)
			}
			if gs, _ := h.Stats(0); gs.Lost != c.lost {
				t.Errorf("%d losses counted, want %d", gs.Lost, c.lost)
			}
		})
	}
}

// TestGroupOtherPartitionsDoNotWake: a member that owns several
// partitions sleeps through commits to partitions it does not own, and
// wakes for a commit to one of its own. It used to sleep on the log's
// word that every commit wakes, and went round once per commit
// elsewhere. Without futex_waitv ("fallback") it still does, and still
// wakes for its own.
func TestGroupOtherPartitionsDoNotWake(t *testing.T) {
	const commits = 200
	for _, fallback := range []bool{false, true} {
		t.Run(map[bool]string{false: "futex_waitv", true: "fallback"}[fallback], func(t *testing.T) {
			if fallback {
				sleepAny = func([]*atomic.Uint32, []uint32, time.Duration) error { return shm.ErrSleepAnyUnsupported }
				t.Cleanup(func() { sleepAny = shm.SleepAny })
			}
			l := newLog(t, Config{Partitions: 3, SegmentSize: 1 << 20})
			ctx := timeout(t, 20*time.Second)
			name := fmt.Sprintf("others%d", groupSeq.Add(1))
			cfg := GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour}
			g := join(t, l, name, cfg)
			g.Receive(timeout(t, 10*time.Millisecond))
			h := join(t, l, name, cfg)
			h.Receive(timeout(t, 10*time.Millisecond))
			g.Receive(timeout(t, 10*time.Millisecond))
			if got := g.Assigned(); len(got) != 2 || got[0] != 0 || got[1] != 2 {
				t.Fatalf("the first member owns %v, want [0 2]", got)
			}
			// Asleep: on its words (their counts stay up until a wake
			// takes them: a commit to partition 1 would take the
			// log's), or, in the fallback, on the log's word.
			asleep := func() bool {
				if fallback {
					return l.parts[0].anySleepers.Load() != 0
				}
				return g.bellSleepers.Load() != 0 && l.parts[0].sleepers.Load() != 0 && l.parts[2].sleepers.Load() != 0
			}
			// Nobody sleeps now: zero the counts the sleeps above left.
			for _, w := range []*atomic.Uint32{g.bellSleepers, l.parts[0].anySleepers, l.parts[0].sleepers, l.parts[1].sleepers, l.parts[2].sleepers} {
				w.Store(0)
			}
			naps := g.naps.Load()
			done := receiveAsync(t, g)
			until(t, ctx, "the member asleep", func() bool { return g.naps.Load() > naps && asleep() })
			naps = g.naps.Load()
			if !fallback && (l.parts[0].anySleepers.Load() != 0 || l.parts[1].sleepers.Load() != 0) {
				t.Fatal("the member sleeps on the log's word or on partition 1's")
			}
			for range commits {
				if _, err := l.Send(ctx, 1, []byte("x")); err != nil { // h's
					t.Fatal(err)
				}
				until(t, ctx, "the member asleep again", asleep)
			}
			n := g.naps.Load() - naps
			if !fallback && n > 2 {
				t.Fatalf("the member slept %d times during %d commits to a partition it does not own", n, commits)
			}
			if fallback && n < commits/2 {
				t.Fatalf("without futex_waitv the member slept only %d times during %d commits elsewhere: is it asleep on the log's word?", n, commits)
			}
			off, err := l.Send(ctx, 2, []byte("mine"))
			if err != nil {
				t.Fatal(err)
			}
			r := result(t, ctx, done, "a commit to an owned partition did not wake the member")
			if r.err != nil || r.m.Partition != 2 || r.m.Offset != off {
				t.Fatalf("partition %d offset %d, %v; want partition 2 offset %d", r.m.Partition, r.m.Offset, r.err, off)
			}
		})
	}
}

// TestGroupDeadLetterOneRecord: while a live member writes the copy of
// one message out of attempts (its record in the partition's state), the
// partition's new owner has a second message out of attempts: it waits
// for the first copy rather than overwrite its record, and each message
// is dead-lettered once. The second's record used to overwrite the
// first's, which was then copied again. (A review's finding.)
func TestGroupDeadLetterOneRecord(t *testing.T) {
	c := newDeadLetterCase(t)
	l, dl, clock, cfg, name, ctx, g := c.l, c.dl, c.clock, c.cfg, c.name, c.ctx, c.g
	bad1, bad2 := c.offs[0], c.offs[1]
	release, finish := copyingStopped(t, ctx, g) // g writes bad1's copy, recorded
	defer finish()
	h := join(t, l, name, cfg)
	clock.add(2 * time.Minute)
	m := receive(t, ctx, h) // bad1's copy is being written: later; bad2's first delivery
	if m.Offset != bad2 {
		t.Fatalf("offset %d, want %d", m.Offset, bad2)
	}
	h.Nack(m)
	tail := dl.parts[0].tail.Load()            // g's claim
	h.Receive(timeout(t, 20*time.Millisecond)) // bad2 out of attempts: waits for bad1's record
	if got := dl.parts[0].tail.Load(); got != tail {
		t.Errorf("the dead-letter log's tail moved from %d to %d while bad2 waited: a claim made and dropped", tail, got)
	}
	release()
	until(t, ctx, "g's copy committed", func() bool { return dl.parts[0].tail.Load() > 0 && !heldAt(dl, 0, 0, deadLetterHeader+100) })
	finish()
	for range 3 { // bad1 acked, then bad2 copied
		clock.add(time.Second)
		h.Receive(timeout(t, 20*time.Millisecond))
	}
	count := map[uint64]int{}
	for _, d := range deadLetters(t, dl) {
		count[d.Offset]++
	}
	if count[bad1] != 1 || count[bad2] != 1 || len(count) != 2 {
		t.Fatalf("dead letters by offset %v, want one each of %d and %d", count, bad1, bad2)
	}
	if gs, _ := h.Stats(1); gs.DeadLettered != 2 || gs.InFlight != 0 {
		t.Errorf("stats %+v, want 2 dead-lettered, nothing in flight", gs)
	}
}

// TestGroupDeadLetterCopyGone: a member dies with its dead-letter copy
// recorded but not committed, and retention drops the dead-letter
// segment that held the claim: the next owner copies the message again.
// It used to take the gone copy for a done one and ack the message with
// no dead letter anywhere. (A review's finding.)
func TestGroupDeadLetterCopyGone(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	dl := newLog(t, Config{SegmentSize: 8192, Segments: 2, Full: FullOverwrite})
	dying := dyingHandle(t, dl)
	name := fmt.Sprintf("dlgone%d", groupSeq.Add(1))
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, name, GroupConfig{MaxAttempts: 1, DeadLetter: dying, VisibilityTimeout: time.Hour, parkFor: time.Hour})
	b := make([]byte, 100)
	message(b, 0, 7)
	bad, _ := l.Send(ctx, 0, b)
	g.Nack(receive(t, ctx, g))
	if !crashAt(g, "deadLetter:recorded", func() { g.Receive(ctx) }) {
		t.Fatal("never at deadLetter:recorded")
	}
	dieCopying(t, g, dying)
	for dl.parts[0].head.Load() == 0 { // other traffic drops the claim's segment
		if _, err := dl.Send(ctx, 0, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	h := join(t, l, name, GroupConfig{MaxAttempts: 1, DeadLetter: dl, VisibilityTimeout: time.Hour, parkFor: time.Hour})
	h.Receive(timeout(t, 50*time.Millisecond))
	n := 0
	r := newReader(t, dl, 0, Oldest)
	for {
		rec, ok, err := r.NextBelow(ctx, dl.parts[0].tail.Load())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if d, err := ParseDeadLetter(rec.Payload); err == nil && d.Offset == bad { // the rest is other traffic
			n++
		}
	}
	if gs, _ := h.Stats(0); n != 1 || gs.DeadLettered != 1 || gs.InFlight != 0 {
		t.Errorf("%d dead letters of offset %d, stats %+v: want one, acked", n, bad, gs)
	}
}

// TestClaimAtGarbage: claimAt on a header whose producer slot is beyond
// the table (garbage, or a hostile writer's) says it is corrupt and leaves
// it, without a panic (writerDead indexed the slot table with it); a dead
// writer's claim of the caller's length is aborted;
// a claim of another length than the caller's is left alone (a review:
// a recreated dead-letter log put a payload word under a stale record).
func TestClaimAtGarbage(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 8192})
	ctx := timeout(t, 10*time.Second)
	off, err := l.Send(ctx, 0, make([]byte, 100))
	if err != nil {
		t.Fatal(err)
	}
	seg, err := l.openSeg(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	w, _ := seg.Uint64s(int(off), 1)
	other := uint64(50<<32 | 1<<16 | 300<<4 | stateWriting) // another length: not the caller's
	w[0].Store(other)
	if rec, release, held, err := l.claimAt(0, off, 100); held || release != nil || rec.Payload != nil || w[0].Load() != other {
		t.Errorf("a claim of another length: held %v, record %v, err %v, header %#x (want it left %#x)", held, rec.Payload != nil, err, w[0].Load(), other)
	}
	garbage := uint64(100<<32 | 300<<4 | stateWriting) // no producer slot 300
	w[0].Store(garbage)
	if rec, release, held, err := l.claimAt(0, off, 100); held || release != nil || rec.Payload != nil || !errors.Is(err, shm.ErrCorrupt) || w[0].Load() != garbage {
		t.Errorf("a garbage claim: held %v, record %v, err %v, header %#x (want ErrCorrupt, left alone)", held, rec.Payload != nil, err, w[0].Load())
	}
	w[0].Store(100<<32 | 0<<16 | 5<<4 | stateWriting) // slot 5, generation 0: nobody's
	if rec, release, held, err := l.claimAt(0, off, 100); held || release != nil || rec.Payload != nil || err != nil || w[0].Load()&stateMask != stateAborted {
		t.Errorf("a dead writer's claim: held %v, record %v, err %v, header %#x (want it aborted)", held, rec.Payload != nil, err, w[0].Load())
	}
	if l.writerDead(100<<32|4095<<4|stateWriting) != true {
		t.Error("a producer slot beyond the table is not dead")
	}
}

// hookCtx runs hook at its first Deadline call: in Consumer.sleep, the
// context.WithTimeout after the look at the rings and before the sleeper
// registers.
type hookCtx struct {
	context.Context
	once sync.Once
	hook func()
}

func (c *hookCtx) Deadline() (time.Time, bool) {
	c.once.Do(c.hook)
	return c.Context.Deadline()
}

// TestGroupRoomBeforeSleep: a member of several partitions, one of them
// with a full ring when it looks, whose Ack makes room before the member
// registers its sleep (the Ack's ring finds nobody), wakes for the next
// commit to that partition. With futex_waitv it slept on the other
// partitions' words and the bell only, and slept through the commit.
// (A review's finding.)
func TestGroupRoomBeforeSleep(t *testing.T) {
	l := newLog(t, Config{Partitions: 3, SegmentSize: 1 << 20})
	ctx := timeout(t, 20*time.Second)
	name := fmt.Sprintf("roomsleep%d", groupSeq.Add(1))
	cfg := GroupConfig{VisibilityTimeout: time.Hour, parkFor: time.Hour, MaxInFlight: 1}
	g := join(t, l, name, cfg)
	g.Receive(timeout(t, 10*time.Millisecond))
	h := join(t, l, name, cfg)
	h.Receive(timeout(t, 10*time.Millisecond))
	g.Receive(timeout(t, 10*time.Millisecond))
	if got := g.Assigned(); len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Fatalf("the first member owns %v, want [0 2]", got)
	}
	if _, err := l.Send(ctx, 2, []byte("a")); err != nil {
		t.Fatal(err)
	}
	held := receive(t, ctx, g) // partition 2's ring (of 1) is full
	if held.Partition != 2 {
		t.Fatalf("partition %d, want 2", held.Partition)
	}
	hc := &hookCtx{Context: timeout(t, time.Minute), hook: func() {
		if err := g.Ack(held); err != nil {
			t.Error(err)
		}
	}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.mu.Lock()
		defer g.mu.Unlock()
		g.sleep(hc)
	}()
	// The sleep does not wait: it goes round to sleep where a commit to
	// partition 2 wakes it (had it slept, a commit there would not
	// have woken it: nothing else ends this sleep before hc's minute).
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the member sleeps where a commit to its partition with room again does not wake it")
	}
	off, err := l.Send(ctx, 2, []byte("b"))
	if err != nil {
		t.Fatal(err)
	}
	if m := receive(t, ctx, g); m.Partition != 2 || m.Offset != off {
		t.Fatalf("partition %d offset %d, want 2 %d", m.Partition, m.Offset, off)
	}
}

// TestOnlyPadding: the cases Log.onlyPadding tells apart, on a log whose
// padding words it sets: the padding of the dropped segment, the few
// bytes too short for a header, an unread record before the padding, a
// drop of more than the rest of one segment, a word of the segment 8
// before (same word, other segment), a bad partition.
func TestOnlyPadding(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Partitions: 2})
	const size = 4096
	pe := l.parts[1].padEnds
	pe[3%padRing].Store(3*size + 4000)
	pe[5%padRing].Store(13*size + 4000) // segment 13's, in 5's word
	for _, c := range []struct {
		p        int
		from, to uint64
		want     bool
	}{
		{1, 3*size + 4000, 4 * size, true},
		{1, 3*size + 4088, 4 * size, true},  // 8 bytes left: no header fits
		{1, 3*size + 4080, 4 * size, false}, // 16 left: a padding's place, not the one recorded
		{1, 3*size + 3880, 4 * size, false}, // a record before the padding
		{1, 3*size + 4000, 5 * size, false}, // segment 4 dropped too
		{1, 5*size + 4000, 6 * size, false},
		{0, 3*size + 4000, 4 * size, false}, // another partition's word
		{7, 3*size + 4000, 4 * size, false},
	} {
		if got := l.onlyPadding(c.p, c.from, c.to); got != c.want {
			t.Errorf("onlyPadding(%d, %d, %d) = %v, want %v", c.p, c.from, c.to, got, c.want)
		}
	}
}
