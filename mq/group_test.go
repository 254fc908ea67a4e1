package mq

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

func init() {
	testenv.RegisterChild("member", memberChild)
}

var groupSeq atomic.Int64

// join makes a consumer of a new group of l (or of group name, if set)
// closed and removed at cleanup.
func join(t testing.TB, l *Log, name string, c GroupConfig) *Consumer {
	t.Helper()
	if name == "" {
		name = fmt.Sprintf("g%d", groupSeq.Add(1))
	}
	g, err := l.JoinGroup(name, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Close()
		RemoveGroup(l.Name(), name) // the first cleanup removes it
	})
	return g
}

// sendAll sends n self-checking records of 100 bytes to each of the log's
// partitions (producer = partition) and returns their offsets.
func sendAll(t testing.TB, ctx context.Context, l *Log, n int) [][]uint64 {
	t.Helper()
	offs := make([][]uint64, l.Config().Partitions)
	b := make([]byte, 100)
	for i := range n {
		for p := range offs {
			message(b, uint64(p), uint64(i))
			off, err := l.Send(ctx, p, b)
			if err != nil {
				t.Fatal(err)
			}
			offs[p] = append(offs[p], off)
		}
	}
	return offs
}

func receive(t testing.TB, ctx context.Context, g *Consumer) Message {
	t.Helper()
	m, err := g.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// nothingMore checks that g has no message to give for a little while.
func nothingMore(t testing.TB, g *Consumer) {
	t.Helper()
	if m, err := g.Receive(timeout(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("after every message: partition %d offset %d attempt %d, %v", m.Partition, m.Offset, m.Attempt, err)
	}
}

// TestGroupOneMember: a lone member owns every partition and gets every
// record once, in each partition's order; acked, the committed offsets
// reach the tails.
func TestGroupOneMember(t *testing.T) {
	l := newLog(t, Config{Partitions: 4, SegmentSize: 16 << 10, Segments: 8})
	ctx := timeout(t, 30*time.Second)
	g := join(t, l, "", GroupConfig{})
	const n = 500
	offs := sendAll(t, ctx, l, n)
	next := make([]int, 4)
	for range 4 * n {
		m := receive(t, ctx, g)
		p, seq := parse(t, m.Payload)
		if int(p) != m.Partition || seq != uint64(next[p]) || m.Offset != offs[p][seq] || m.Attempt != 1 {
			t.Fatalf("partition %d offset %d attempt %d: producer %d seq %d, want seq %d", m.Partition, m.Offset, m.Attempt, p, seq, next[p])
		}
		next[p]++
		if err := g.Ack(m); err != nil {
			t.Fatal(err)
		}
		if err := g.Ack(m); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("a second ack: %v", err)
		}
	}
	nothingMore(t, g)
	if a := g.Assigned(); !slices.Equal(a, []int{0, 1, 2, 3}) {
		t.Errorf("assigned %v", a)
	}
	for p := range 4 {
		st, _ := l.Stats(p)
		gs, err := g.Stats(p)
		if err != nil || gs.Committed != st.Tail || gs.Next != st.Tail || gs.InFlight != 0 || gs.Redelivered != 0 || gs.Owner != g.Member() {
			t.Errorf("partition %d: %+v, %v; tail %d", p, gs, err, st.Tail)
		}
	}
}

// TestGroupNack: a nacked message comes back at once with Attempt 2; the
// first delivery can no longer be acked.
func TestGroupNack(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{})
	offs := sendAll(t, ctx, l, 2)
	m := receive(t, ctx, g)
	if err := g.Nack(m); err != nil {
		t.Fatal(err)
	}
	again := receive(t, ctx, g)
	if again.Offset != offs[0][0] || again.Attempt != 2 {
		t.Fatalf("after a nack: offset %d attempt %d, want %d attempt 2", again.Offset, again.Attempt, offs[0][0])
	}
	if _, seq := parse(t, again.Payload); seq != 0 {
		t.Fatalf("redelivered seq %d", seq)
	}
	if err := g.Ack(m); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("ack of the nacked delivery: %v", err)
	}
	if err := g.Ack(again); err != nil {
		t.Fatal(err)
	}
	second := receive(t, ctx, g)
	if second.Offset != offs[0][1] || second.Attempt != 1 {
		t.Fatalf("then offset %d attempt %d", second.Offset, second.Attempt)
	}
	g.Ack(second)
	nothingMore(t, g)
	if gs, _ := g.Stats(0); gs.Redelivered != 1 || gs.InFlight != 0 {
		t.Errorf("stats %+v", gs)
	}
}

// TestGroupDeadLetter: a record nacked MaxAttempts times lands in the
// dead-letter log once, with its partition, offset and attempts, and is
// not delivered again.
func TestGroupDeadLetter(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	if _, err := l.JoinGroup("small", GroupConfig{MaxAttempts: 3, DeadLetter: newLog(t, Config{SegmentSize: 4096})}); err == nil {
		t.Fatal("a dead-letter log whose segments cannot hold the log's largest record accepted")
	}
	dl := newLog(t, Config{SegmentSize: 8192})
	dr := newReader(t, dl, 0, 0)
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{MaxAttempts: 3, DeadLetter: dl})
	b := make([]byte, 100)
	message(b, 1, 7)
	bad, err := l.Send(ctx, 1, b)
	if err != nil {
		t.Fatal(err)
	}
	message(b, 1, 8)
	good, _ := l.Send(ctx, 1, b)
	for attempt := 1; ; attempt++ {
		m := receive(t, ctx, g)
		if m.Offset == good {
			if attempt != 4 {
				t.Fatalf("the next record after %d deliveries of the bad one", attempt-1)
			}
			g.Ack(m)
			break
		}
		if m.Offset != bad || m.Attempt != attempt || attempt > 3 {
			t.Fatalf("offset %d attempt %d, want %d attempt %d (at most 3)", m.Offset, m.Attempt, bad, attempt)
		}
		g.Nack(m)
	}
	nothingMore(t, g)
	rec, err := dr.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDeadLetter(rec.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if d.Partition != 1 || d.Offset != bad || d.Attempts != 3 {
		t.Fatalf("dead letter %+v, want partition 1 offset %d 3 attempts", d, bad)
	}
	if _, seq := parse(t, d.Payload); seq != 7 {
		t.Fatalf("dead letter of seq %d", seq)
	}
	if _, err := dr.Next(timeout(t, 50*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second dead letter: %v", err)
	}
	if gs, _ := g.Stats(1); gs.DeadLettered != 1 || gs.InFlight != 0 || gs.Redelivered != 2 {
		t.Errorf("stats %+v", gs)
	}
	if _, err := l.JoinGroup("x", GroupConfig{MaxAttempts: 2}); err == nil {
		t.Error("MaxAttempts without a dead-letter log accepted")
	}
}

// fakeClock is a clock the test moves.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time                   { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration)              { c.ns.Add(int64(d)) }
func newFakeClock() *fakeClock                        { c := &fakeClock{}; c.ns.Store(time.Now().UnixNano()); return c }
func (c *fakeClock) config(g GroupConfig) GroupConfig { g.now = c.now; return g }

// TestGroupVisibility: a message not acked within the visibility timeout
// is redelivered, not before; an ack of the old delivery then fails.
func TestGroupVisibility(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	clock := newFakeClock()
	g := join(t, l, "", clock.config(GroupConfig{VisibilityTimeout: time.Minute}))
	sendAll(t, ctx, l, 1)
	m := receive(t, ctx, g)
	nothingMore(t, g) // the clock has not moved
	clock.add(59 * time.Second)
	nothingMore(t, g)
	clock.add(time.Second)
	again := receive(t, ctx, g)
	if again.Offset != m.Offset || again.Attempt != 2 {
		t.Fatalf("offset %d attempt %d, want %d attempt 2", again.Offset, again.Attempt, m.Offset)
	}
	if err := g.Ack(m); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("ack after the timeout: %v", err)
	}
	if err := g.Ack(again); err != nil {
		t.Fatal(err)
	}
	clock.add(time.Hour)
	nothingMore(t, g)
}

// TestGroupClose: a member that leaves with unacked messages has them
// redelivered at once to the member that takes its partitions.
func TestGroupClose(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	a := join(t, l, "close", GroupConfig{})
	b := join(t, l, "close", GroupConfig{})
	offs := sendAll(t, ctx, l, 3)
	held := receive(t, ctx, b) // b owns partition 1
	if held.Partition != 1 || !slices.Equal(b.Assigned(), []int{1}) {
		t.Fatalf("b got partition %d, owns %v", held.Partition, b.Assigned())
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]int{}
	for range 6 {
		m := receive(t, ctx, a)
		if m.Partition == 1 {
			got[m.Offset] = m.Attempt
		}
		a.Ack(m)
	}
	nothingMore(t, a)
	want := map[uint64]int{offs[1][0]: 2, offs[1][1]: 1, offs[1][2]: 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("partition 1 offsets and attempts %v, want %v", got, want)
	}
}

// TestGroupPin: the committed offset, not the read position, keeps the
// segments of unacked records from retention under FullFail.
func TestGroupPin(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
	ctx := timeout(t, 10*time.Second)
	g := join(t, l, "", GroupConfig{})
	b := make([]byte, 1000) // four records per segment
	for range 7 {
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	first := receive(t, ctx, g)
	for range 6 {
		g.Ack(receive(t, ctx, g)) // the group reads into segment 1
	}
	sent := 7
	var err error
	for ; sent < 20 && err == nil; sent++ {
		_, err = l.Send(ctx, 0, b)
	}
	if !errors.Is(err, ErrFull) || sent != 9 {
		t.Fatalf("after %d records: %v, want ErrFull at the 9th (segment 0 kept for the unacked record)", sent, err)
	}
	if err := g.Ack(first); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Send(ctx, 0, b); err != nil {
		t.Fatalf("after the ack: %v", err)
	}
}

// TestGroupCorrupt: a group segment whose shape or partition state makes
// no sense is refused with shm.ErrCorrupt, never a panic.
func TestGroupCorrupt(t *testing.T) {
	for _, c := range []struct {
		name string
		off  func(cap int) int
		v    uint64
		at   string // "join" or "receive"
	}{
		{"partitions", func(int) int { return gOffParts }, 3, "join"},
		{"in flight", func(int) int { return gOffInFlight }, 1 << 40, "join"},
		{"magic", func(int) int { return gOffMagic }, 1, "join"},
		{"ring count", func(c int) int { return gOffParts0 + pwCount*8 }, 1 << 20, "receive"},
		{"next offset", func(c int) int { return gOffParts0 + pwNext*8 }, 3, "receive"},
		{"next past the tail", func(c int) int { return gOffParts0 + pwNext*8 }, 1 << 40, "receive"},
		{"taken in a future generation", func(c int) int { return gOffParts0 + pwOwnerGen*8 }, 1 << 40, "receive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096})
			name := fmt.Sprintf("corrupt%d", groupSeq.Add(1))
			g := join(t, l, name, GroupConfig{})
			sendAll(t, timeout(t, 5*time.Second), l, 1)
			seg, err := shm.OpenSegment(groupName(l.Name(), name))
			if err != nil {
				t.Fatal(err)
			}
			defer seg.Close()
			w, _ := seg.Uint64At(c.off(256))
			if c.at == "receive" {
				w.Store(c.v)
				if _, err := g.Receive(timeout(t, 5*time.Second)); !errors.Is(err, shm.ErrCorrupt) {
					t.Fatalf("%v, want shm.ErrCorrupt", err)
				}
				return
			}
			w.Store(c.v)
			if g2, err := l.JoinGroup(name, GroupConfig{}); !errors.Is(err, shm.ErrCorrupt) {
				if err == nil {
					g2.Close()
				}
				t.Fatalf("%v, want shm.ErrCorrupt", err)
			}
		})
	}
}

// FuzzCheckPart: arbitrary partition state is refused or safe to use: the
// ring's entries it accepts lie inside the state, committed is an offset
// of it, and the repair of a dead member's leftovers leaves sane state.
func FuzzCheckPart(f *testing.F) {
	seed := make([]byte, partWords(4)*8)
	binary.LittleEndian.PutUint64(seed[pwNext*8:], 64)
	binary.LittleEndian.PutUint64(seed[pwCount*8:], 2)
	binary.LittleEndian.PutUint64(seed[pwHead*8:], 3)
	put := func(i int, off, meta uint64) {
		e := (partHeader + i*entryWords) * 8
		binary.LittleEndian.PutUint64(seed[e:], off)
		binary.LittleEndian.PutUint64(seed[e+8:], meta)
	}
	put(3, 16, entryMeta(1, entryInFlight, holderWord(0, 1)))
	put(0, 40, entryMeta(2, entryAcked, holderWord(1, 1)))
	f.Add(seed)
	f.Add(make([]byte, partWords(4)*8))
	f.Fuzz(func(t *testing.T, b []byte) {
		w := make([]atomic.Uint64, partWords(4))
		for i := range w {
			if 8*i+8 <= len(b) {
				w[i].Store(binary.LittleEndian.Uint64(b[8*i:]))
			}
		}
		if err := checkPart(w, 4); err != nil {
			if !errors.Is(err, shm.ErrCorrupt) {
				t.Fatalf("%v does not wrap shm.ErrCorrupt", err)
			}
			resetPart(w, 4)
			if err := checkPart(w, 4); err != nil {
				t.Fatalf("after the repair: %v", err)
			}
			return
		}
		if c := committed(w, 4); c > w[pwNext].Load() || c%8 != 0 {
			t.Fatalf("committed %d, next %d", c, w[pwNext].Load())
		}
		if checkRing(w, 4) != nil {
			t.Fatal("checkPart accepts what checkRing refuses")
		}
	})
}

// FuzzParseDeadLetter: any bytes decode to an error or a dead letter whose
// payload is the rest of the record.
func FuzzParseDeadLetter(f *testing.F) {
	b := make([]byte, deadLetterHeader+5)
	binary.LittleEndian.PutUint32(b, deadLetterMagic)
	binary.LittleEndian.PutUint32(b[4:], 3)
	binary.LittleEndian.PutUint64(b[8:], 4096)
	binary.LittleEndian.PutUint32(b[16:], 2)
	f.Add(b)
	f.Add([]byte("short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDeadLetter(b)
		if err != nil {
			return
		}
		if len(d.Payload) != len(b)-deadLetterHeader || d.Partition >= maxPartitions || d.Attempts < 1 || d.Offset%8 != 0 {
			t.Fatalf("%+v from %d bytes", d, len(b))
		}
	})
}

// TestAssignment: partitions spread evenly over the sorted members, each
// to exactly one.
func TestAssignment(t *testing.T) {
	for _, members := range [][]int{{0}, {0, 5}, {1, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8}} {
		for _, parts := range []int{1, 4, 7, 16} {
			owner := make([]int, parts)
			for i := range owner {
				owner[i] = -1
			}
			counts := map[int]int{}
			for _, m := range members {
				for _, p := range assignment(members, m, parts) {
					if owner[p] != -1 {
						t.Fatalf("%v %d: partition %d to %d and %d", members, parts, p, owner[p], m)
					}
					owner[p] = m
					counts[m]++
				}
			}
			for p, o := range owner {
				if o == -1 {
					t.Fatalf("%v %d: partition %d unowned", members, parts, p)
				}
			}
			for _, m := range members {
				if c := counts[m]; c < parts/len(members) || c > (parts+len(members)-1)/len(members) {
					t.Fatalf("%v %d: member %d has %d partitions", members, parts, m, c)
				}
			}
		}
	}
}

// memberChild joins group MQ_GROUP of log MQ_LOG (visibility timeout: an
// hour, longer than any test) and says "joined". With
// MQ_WAIT set, it then waits for "go" on its standard input. With
// MQ_HOLD=k it receives k messages without acking them, prints each
// ("held p offset"), receives and acks MQ_THEN_ACK more, prints
// "holding", and waits to be killed. Otherwise it
// receives, checks, acks and prints each message ("msg p offset attempt
// producer seq") until its standard input ends, then leaves the group.
func memberChild() int {
	l, err := Open(os.Getenv("MQ_LOG"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	g, err := l.JoinGroup(os.Getenv("MQ_GROUP"), GroupConfig{VisibilityTimeout: time.Hour})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if os.Getenv("MQ_SECOND") != "" {
		// A second consumer of the group in this process (idle), as a
		// process with a consumer per worker goroutine has.
		if _, err := l.JoinGroup(os.Getenv("MQ_GROUP"), GroupConfig{VisibilityTimeout: time.Hour}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "joined")
	out.Flush()
	in := bufio.NewReader(os.Stdin)
	if os.Getenv("MQ_WAIT") != "" {
		if line, err := in.ReadString('\n'); line != "go\n" {
			fmt.Fprintln(os.Stderr, "told", line, err)
			return 1
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if hold, _ := strconv.Atoi(os.Getenv("MQ_HOLD")); hold > 0 {
		for range hold {
			m, err := g.Receive(ctx)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Fprintln(out, "held", m.Partition, m.Offset)
		}
		then, _ := strconv.Atoi(os.Getenv("MQ_THEN_ACK"))
		for range then {
			m, err := g.Receive(ctx)
			if err == nil {
				err = g.Ack(m)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
		fmt.Fprintln(out, "holding")
		out.Flush()
		io.Copy(io.Discard, in)
		return 1
	}
	go func() {
		io.Copy(io.Discard, in)
		cancel()
	}()
	for {
		m, err := g.Receive(ctx)
		if errors.Is(err, context.Canceled) {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		producer, seq := binary.LittleEndian.Uint64(m.Payload), binary.LittleEndian.Uint64(m.Payload[8:])
		if bench.Sum(m.Payload[16:]) != bench.FillSum(len(m.Payload)-16, producer<<32|seq) {
			fmt.Fprintln(os.Stderr, "torn payload at", m.Partition, m.Offset)
			return 1
		}
		if err := g.Ack(m); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintln(out, "msg", m.Partition, m.Offset, m.Attempt, producer, seq)
		out.Flush()
	}
	if err := g.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// member is a member child process and its output.
type member struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

func startMember(t *testing.T, l *Log, group string, env ...string) *member {
	t.Helper()
	cmd := testenv.Child(t, "member", append([]string{"MQ_LOG=" + l.Name(), "MQ_GROUP=" + group}, env...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &member{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(out)}
	if !m.lines.Scan() || m.lines.Text() != "joined" {
		t.Fatalf("member said %q, %v", m.lines.Text(), m.lines.Err())
	}
	return m
}

// delivery is one "msg" line of a member.
type delivery struct {
	member, p   int
	off         uint64
	attempt     int
	producer, s uint64
}

// collect reads the "msg" lines of members into a channel.
func collect(t *testing.T, members []*member) <-chan delivery {
	ch := make(chan delivery, 1024)
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() {
			for m.lines.Scan() {
				var d delivery
				if _, err := fmt.Sscan(m.lines.Text()[len("msg"):], &d.p, &d.off, &d.attempt, &d.producer, &d.s); err != nil {
					t.Errorf("member %d said %q", i, m.lines.Text())
					return
				}
				d.member = i
				ch <- d
			}
		})
	}
	go func() { wg.Wait(); close(ch) }()
	return ch
}

// TestGroupProcesses: three member processes share a four-partition log:
// every record is processed exactly once (first attempts only), the
// partitions are spread over the three, and everything ends acked.
func TestGroupProcesses(t *testing.T) {
	l := newLog(t, Config{Partitions: 4, SegmentSize: 64 << 10, Segments: 4})
	const group, n = "procs", 3000
	var members []*member
	for range 3 {
		members = append(members, startMember(t, l, group))
	}
	ch := collect(t, members)
	ctx := timeout(t, 2*time.Minute)
	done := make(chan [][]uint64, 1)
	go func() { done <- sendAll(t, ctx, l, n) }()
	seen := map[[2]uint64]bool{}
	by := map[int]int{}
	for len(seen) < 4*n {
		var d delivery
		select {
		case d = <-ch:
		case <-ctx.Done():
			t.Fatalf("after %d records: %v", len(seen), ctx.Err())
		}
		k := [2]uint64{d.producer, d.s}
		if seen[k] || d.attempt != 1 || d.producer != uint64(d.p) {
			t.Fatalf("member %d: partition %d offset %d attempt %d record %v (seen before: %v)", d.member, d.p, d.off, d.attempt, k, seen[k])
		}
		seen[k] = true
		by[d.member]++
	}
	<-done
	for _, m := range members {
		m.stdin.Close()
	}
	for _, m := range members {
		if err := m.cmd.Wait(); err != nil {
			t.Fatalf("member: %v", err)
		}
	}
	for d := range ch {
		t.Fatalf("a delivery after all the records: %+v", d)
	}
	if len(by) != 3 {
		t.Errorf("deliveries per member %v: want all three to have had some", by)
	}
	// Everything acked, nothing redelivered.
	g := join(t, l, group, GroupConfig{})
	for p := range 4 {
		st, _ := l.Stats(p)
		if gs, err := g.Stats(p); err != nil || gs.Committed != st.Tail || gs.Redelivered != 0 || gs.InFlight != 0 {
			t.Errorf("partition %d: %+v %v, tail %d", p, gs, err, st.Tail)
		}
	}
}

// TestGroupKilledMember: a member process SIGKILLed while it holds
// unacked messages: its partition moves to the survivor, which gets those
// messages again (Attempt 2) and every other record once.
func TestGroupKilledMember(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 16 << 10, Segments: 8})
	ctx := timeout(t, time.Minute)
	const group, n, hold = "killed", 200, 5
	// The visibility timeout (the child's too) is far longer than the
	// test: the held messages come back because their holder died.
	g := join(t, l, group, GroupConfig{VisibilityTimeout: time.Hour}) // member 0: partition 0 once the child joins
	offs := sendAll(t, ctx, l, n)
	child := startMember(t, l, group, "MQ_HOLD="+strconv.Itoa(hold)) // partition 1
	held := map[uint64]bool{}
	for range hold {
		if !child.lines.Scan() {
			t.Fatal(child.lines.Err())
		}
		var p int
		var off uint64
		if _, err := fmt.Sscanf(child.lines.Text(), "held %d %d", &p, &off); err != nil || p != 1 {
			t.Fatalf("child said %q", child.lines.Text())
		}
		held[off] = true
	}
	if !child.lines.Scan() || child.lines.Text() != "holding" {
		t.Fatalf("child said %q", child.lines.Text())
	}
	child.cmd.Process.Kill()
	child.cmd.Wait()
	got := map[uint64]int{}
	for range 2 * n {
		m := receive(t, ctx, g)
		_, seq := parse(t, m.Payload)
		if m.Offset != offs[m.Partition][seq] {
			t.Fatalf("partition %d offset %d holds seq %d", m.Partition, m.Offset, seq)
		}
		want := 1
		if m.Partition == 1 && held[m.Offset] {
			want = 2
		}
		if m.Attempt != want {
			t.Fatalf("partition %d offset %d attempt %d, want %d", m.Partition, m.Offset, m.Attempt, want)
		}
		if m.Partition == 1 {
			got[m.Offset]++
		}
		g.Ack(m)
	}
	nothingMore(t, g)
	if len(got) != n {
		t.Fatalf("%d records of partition 1, want %d", len(got), n)
	}
	if a := g.Assigned(); !slices.Equal(a, []int{0, 1}) {
		t.Errorf("the survivor owns %v", a)
	}
	if gs, _ := g.Stats(1); gs.Redelivered != hold || gs.Owner != g.Member() {
		t.Errorf("partition 1: %+v, want %d redelivered", gs, hold)
	}
}

// TestGroupJoin: a member process joining takes a partition over from a
// live member without loss or duplicates: the old owner can still ack
// what it holds, and the newcomer goes on after it.
func TestGroupJoin(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 16 << 10, Segments: 8})
	ctx := timeout(t, time.Minute)
	const group, n = "join", 300
	g := join(t, l, group, GroupConfig{})
	sendAll(t, ctx, l, n)
	seen := map[[2]uint64]int{}
	note := func(p, seq uint64) {
		if seen[[2]uint64{p, seq}]++; seen[[2]uint64{p, seq}] > 1 {
			t.Fatalf("partition %d seq %d twice", p, seq)
		}
	}
	// Read some of both partitions; keep one of partition 1 unacked.
	var kept Message
	for i := 0; i < 20 || kept.Payload == nil; i++ {
		m := receive(t, ctx, g)
		p, seq := parse(t, m.Payload)
		note(p, seq)
		if m.Partition == 1 && kept.Payload == nil {
			kept = m
			continue
		}
		g.Ack(m)
	}
	keptOff := kept.Offset
	child := startMember(t, l, group) // takes partition 1
	ch := collect(t, []*member{child})
	// Once the newcomer has taken partition 1 (it delivered a record of
	// it), the old member still holds its message there, unredelivered.
	select {
	case got := <-ch:
		if got.p != 1 || got.attempt != 1 || got.off == keptOff {
			t.Fatalf("the newcomer got %+v", got)
		}
		note(got.producer, got.s)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := g.Ack(kept); err != nil {
		t.Fatalf("ack of a message held across the rebalance: %v", err)
	}
	for len(seen) < 2*n {
		var got delivery
		select {
		case got = <-ch:
			if got.p != 1 || got.attempt != 1 || got.off == keptOff {
				t.Fatalf("the newcomer got %+v", got)
			}
			note(got.producer, got.s)
			continue
		default:
		}
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		m, err := g.Receive(short)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			select {
			case got = <-ch:
				if got.p != 1 || got.attempt != 1 {
					t.Fatalf("the newcomer got %+v", got)
				}
				note(got.producer, got.s)
			case <-ctx.Done():
				t.Fatalf("%d records seen: %v", len(seen), ctx.Err())
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		p, seq := parse(t, m.Payload)
		note(p, seq)
		g.Ack(m)
	}
	if a := g.Assigned(); !slices.Equal(a, []int{0}) {
		t.Errorf("the old member owns %v after the join", a)
	}
	child.stdin.Close()
	if err := child.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		st, _ := l.Stats(p)
		if gs, _ := g.Stats(p); gs.Committed != st.Tail || gs.Redelivered != 0 {
			t.Errorf("partition %d: %+v, tail %d", p, gs, st.Tail)
		}
	}
}

// TestGroupKilledProducer: a producer process SIGKILLed while it holds a
// loan in a partition the group reads does not stop the group: the
// record is aborted and skipped and the records after it delivered.
func TestGroupKilledProducer(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 30*time.Second)
	g := join(t, l, "", GroupConfig{})
	b := make([]byte, 100)
	message(b, 0, 0)
	if _, err := l.Send(ctx, 0, b); err != nil {
		t.Fatal(err)
	}
	cmd := startWaiting(t, "holder", l, "loaned")
	message(b, 0, 1)
	after, err := l.Send(ctx, 0, b)
	if err != nil {
		t.Fatal(err)
	}
	g.Ack(receive(t, ctx, g))
	// The live writer's record is waited for, not skipped.
	nothingMore(t, g)
	cmd.Process.Kill()
	cmd.Wait()
	m := receive(t, ctx, g)
	if _, seq := parse(t, m.Payload); seq != 1 || m.Offset != after {
		t.Fatalf("after the dead writer's record: seq %d at %d", seq, m.Offset)
	}
	g.Ack(m)
	if st, _ := l.Stats(0); st.Aborted != 1 {
		t.Errorf("stats %+v, want one aborted record", st)
	}
	if gs, _ := g.Stats(0); gs.Committed != gs.Next || gs.Next != after+align8(headerSize+100) {
		t.Errorf("group stats %+v", gs)
	}
}

// TestGroupRepair: a member that died holding a partition's lock with its
// state half written (here: an entry's meta word zeroed) leaves it to the
// next locker, which finds the state corrupt, empties the ring and
// delivers again from the oldest unacked record (a first attempt again:
// the ring's attempt counts went with it).
func TestGroupRepair(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	name := fmt.Sprintf("repair%d", groupSeq.Add(1))
	g := join(t, l, name, GroupConfig{})
	offs := sendAll(t, ctx, l, 3)
	g.Ack(receive(t, ctx, g))
	m1 := receive(t, ctx, g)
	receive(t, ctx, g) // records 1 and 2 in flight
	seg, err := shm.OpenSegment(groupName(l.Name(), name))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	word := func(off int) *atomic.Uint64 { w, _ := seg.Uint64At(off); return w }
	base := gOffParts0
	head := word(base + pwHead*8).Load()
	word(base + (partHeader+int((head+1)%256)*entryWords+1)*8).Store(0) // entry of record 2
	word(base).Store(uint64(0x7ffffff0)<<32 | 1)                        // the lock's owner: no such process
	word(base + 8).Add(1)                                               // its write open
	// The next locker (this ack) repairs: the ring goes, so the ack
	// finds nothing to settle.
	if err := g.Ack(m1); !errors.Is(err, ErrNotHeld) {
		t.Fatalf("ack after the repair: %v", err)
	}
	for i, want := range []uint64{offs[0][1], offs[0][2]} {
		m := receive(t, ctx, g)
		if m.Offset != want || m.Attempt != 1 {
			t.Fatalf("delivery %d after the repair: offset %d attempt %d, want %d", i, m.Offset, m.Attempt, want)
		}
		g.Ack(m)
	}
	nothingMore(t, g)
	if gs, err := g.Stats(0); err != nil || gs.InFlight != 0 || gs.Committed != gs.Next {
		t.Errorf("stats %+v %v", gs, err)
	}
}

// TestGroupConcurrentAck: messages received in one goroutine and acked in
// another (with MaxInFlight small enough that Receive waits for the
// acks), then Close while an Ack may run: all acked, no race.
func TestGroupConcurrentAck(t *testing.T) {
	l := newLog(t, Config{Partitions: 2, SegmentSize: 16 << 10, Segments: 8})
	ctx := timeout(t, 30*time.Second)
	g := join(t, l, "", GroupConfig{MaxInFlight: 8})
	const n = 1000
	sendAll(t, ctx, l, n)
	msgs := make(chan Message, 64)
	acked := make(chan error, 1)
	go func() {
		for m := range msgs {
			if err := g.Ack(m); err != nil {
				acked <- err
				return
			}
		}
		acked <- nil
	}()
	for range 2 * n {
		m := receive(t, ctx, g)
		parse(t, m.Payload) // before the next Receive: the payload's lifetime
		m.Payload = nil
		msgs <- m
	}
	close(msgs)
	if err := <-acked; err != nil {
		t.Fatal(err)
	}
	for p := range 2 {
		st, _ := l.Stats(p)
		if gs, _ := g.Stats(p); gs.Committed != st.Tail || gs.InFlight != 0 {
			t.Errorf("partition %d: %+v, tail %d", p, gs, st.Tail)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			if err := g.Ack(Message{}); errors.Is(err, ErrClosed) {
				return
			}
		}
	}()
	g.Close()
	<-done
	if _, err := g.Receive(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Receive after Close: %v", err)
	}
}

// TestGroupKilledOwnerPin: the owner of a partition is SIGKILLed holding
// an unacked record in a segment it has read past; before anyone takes
// the partition over, a producer under FullFail still finds that segment
// kept (the dead owner's pin is held in the name of a live member), and
// the new owner then redelivers the record.
func TestGroupKilledOwnerPin(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullFail})
	ctx := timeout(t, 30*time.Second)
	const group = "ownerpin"
	b := make([]byte, 1000) // four records per segment
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
	child := startMember(t, l, group, "MQ_WAIT=1", "MQ_HOLD=1", "MQ_THEN_ACK=6") // member 0: the partition
	g := join(t, l, group, GroupConfig{VisibilityTimeout: time.Hour})            // member 1: nothing, the owner's buddy
	if _, err := io.WriteString(child.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	for child.lines.Scan() && child.lines.Text() != "holding" {
	}
	child.cmd.Process.Kill()
	child.cmd.Wait()
	sent := 7
	var err error
	for ; sent < 20 && err == nil; sent++ {
		_, err = l.Send(ctx, 0, b)
	}
	if !errors.Is(err, ErrFull) || sent != 9 {
		t.Fatalf("after %d records: %v, want ErrFull at the 9th (segment 0 kept for the dead owner's unacked record)", sent, err)
	}
	m := receive(t, ctx, g)
	if m.Offset != first || m.Attempt != 2 {
		t.Fatalf("the new owner's first message: offset %d attempt %d, want %d attempt 2", m.Offset, m.Attempt, first)
	}
	if err := g.Ack(m); err != nil {
		t.Fatal(err)
	}
	m = receive(t, ctx, g) // the eighth record
	g.Ack(m)
	if _, err := l.Send(ctx, 0, b); err != nil {
		t.Fatalf("after the acks: %v", err)
	}
}

// FuzzGroupSegment writes arbitrary bytes over a live group's partition
// state and then uses it: Receive, Ack, Nack and Stats return (an error
// is fine), never panic, and never wait past their context by more than
// the bounded waits.
func FuzzGroupSegment(f *testing.F) {
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, uint16(pwCount*8))
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0}, uint16(pwNext*8))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0}, uint16(pwMinDue*8))
	f.Add([]byte{0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, uint16(partHeader*8))
	f.Add([]byte{3, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint16(pwPins*8))
	f.Add([]byte{7, 0, 0, 0}, uint16(pwOwner*8))
	f.Fuzz(func(t *testing.T, b []byte, at uint16) {
		l := newLog(t, Config{SegmentSize: 4096})
		name := fmt.Sprintf("fuzz%d", groupSeq.Add(1))
		g := join(t, l, name, GroupConfig{MaxInFlight: 4})
		ctx := timeout(t, 10*time.Second)
		sendAll(t, ctx, l, 3)
		m, err := g.Receive(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seg, err := shm.OpenSegment(groupName(l.Name(), name))
		if err != nil {
			t.Fatal(err)
		}
		defer seg.Close()
		area := partWords(4) * 8
		off := int(at) % area
		if off < shm.SeqLockSize {
			off += shm.SeqLockSize // the lock is shm's, fuzzed there
		}
		copy(seg.Data()[gOffParts0+off:gOffParts0+area], b)
		start := time.Now()
		short := timeout(t, 20*time.Millisecond)
		for range 3 {
			if m2, err := g.Receive(short); err == nil {
				g.Ack(m2)
			}
		}
		g.Ack(m)
		g.Nack(m)
		g.Stats(0)
		g.Assigned()
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("took %v", d)
		}
	})
}
