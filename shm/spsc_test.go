//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func newRing(t testing.TB, capacity int) (*Segment, *SPSC) {
	t.Helper()
	seg := newSegment(t, SPSCSize(capacity))
	r, err := CreateSPSC(seg, 0, capacity)
	if err != nil {
		t.Fatal(err)
	}
	return seg, r
}

// record i has a length and content derived from i and seed, so the reader
// can check every byte without being told.
func fillRecord(b []byte, i uint64) {
	for j := range b {
		b[j] = byte(i*31 + uint64(j))
	}
}

func recordLen(i uint64, max int) int { return int((i*2654435761)>>7) % max }

func checkRecord(b []byte, i uint64) error {
	for j := range b {
		if b[j] != byte(i*31+uint64(j)) {
			return fmt.Errorf("record %d byte %d is %d, want %d", i, j, b[j], byte(i*31+uint64(j)))
		}
	}
	return nil
}

func TestSPSCOrderAndWrap(t *testing.T) {
	for _, mode := range []WaitMode{WaitBlock, WaitSpin, WaitYield} {
		t.Run(strconv.Itoa(int(mode)), func(t *testing.T) {
			_, r := newRing(t, 4096)
			p, err := r.Producer(Wait{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			c, err := r.Consumer(Wait{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			const n = 20000
			ctx := context.Background()
			errc := make(chan error, 1)
			go func() {
				for i := range uint64(n) {
					b, err := p.ClaimWait(ctx, recordLen(i, 700))
					if err != nil {
						errc <- err
						return
					}
					fillRecord(b, i)
					if i%7 == 0 {
						p.Commit()
					}
				}
				errc <- p.Close()
			}()
			for i := uint64(0); ; i++ {
				b, err := c.NextWait(ctx)
				if errors.Is(err, ErrClosed) {
					if i != n {
						t.Fatalf("closed after %d records, want %d", i, n)
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(b) != recordLen(i, 700) {
					t.Fatalf("record %d: %d bytes, want %d", i, len(b), recordLen(i, 700))
				}
				if err := checkRecord(b, i); err != nil {
					t.Fatal(err)
				}
				if i%3 == 0 {
					c.Release()
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSPSCCloseDuringWait closes the producer while the consumer waits,
// between the wait's last look at the ring and its look at the peer: the
// peer check sees the ring closed and the wait looks once more. What the
// producer committed before Close must still come out, once, and then
// ErrClosed (before, a last look that found the final record was followed
// by another, which reported ErrClosed: the record was lost; and a last
// look that found ErrClosed made NextWait return no record and no error).
// The wrapped peer check makes the interleaving certain.
func TestSPSCCloseDuringWait(t *testing.T) {
	for _, mode := range []WaitMode{WaitBlock, WaitSpin, WaitYield} {
		for _, last := range []bool{true, false} {
			t.Run(fmt.Sprintf("%d/record=%v", mode, last), func(t *testing.T) {
				_, r := newRing(t, 4096)
				p, err := r.Producer(Wait{Mode: mode})
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				c, err := r.Consumer(Wait{Mode: mode})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				peer := c.peer
				closed := false
				c.peer = func() error {
					if !closed {
						// The wait's look found the ring empty; now the
						// producer commits its last record and closes.
						closed = true
						if last {
							if err := p.Send(context.Background(), []byte("last")); err != nil {
								t.Error(err)
							}
						}
						p.Close()
					}
					return peer()
				}
				b, err := c.NextWait(context.Background())
				if last {
					if err != nil || string(b) != "last" {
						t.Fatalf("NextWait: %q, %v; want the last record", b, err)
					}
					b, err = c.NextWait(context.Background())
				}
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("NextWait after the last record: %q, %v; want ErrClosed", b, err)
				}
			})
		}
	}
}

func TestSPSCFullEmptyTooLarge(t *testing.T) {
	_, r := newRing(t, 256)
	p, _ := r.Producer(Wait{})
	c, _ := r.Consumer(Wait{})
	if _, err := c.Next(); err != ErrRingEmpty {
		t.Fatalf("empty ring: %v", err)
	}
	if _, err := p.Claim(r.MaxRecord() + 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized claim: %v", err)
	}
	n := 0
	for {
		b, err := p.Claim(24)
		if err == ErrRingFull {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b[0] = byte(n)
		n++
	}
	if n != 256/32 {
		t.Errorf("%d records of 24 bytes fit in 256, want %d", n, 256/32)
	}
	if _, err := c.Next(); err != ErrRingEmpty {
		t.Fatalf("uncommitted records visible: %v", err)
	}
	p.Commit()
	for i := range n {
		b, err := c.Next()
		if err != nil || b[0] != byte(i) {
			t.Fatalf("record %d: %v %v", i, b, err)
		}
	}
	// Not released: still full.
	if _, err := p.Claim(24); err != ErrRingFull {
		t.Fatalf("claim before release: %v", err)
	}
	c.Release()
	if _, err := p.Claim(r.MaxRecord()); err != nil {
		t.Fatalf("max record after release: %v", err)
	}
	// A blocked claim honours its context.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := p.ClaimWait(ctx, 8); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ClaimWait on a full ring: %v", err)
	}
}

func TestSPSCBusyEnd(t *testing.T) {
	_, r := newRing(t, 256)
	p, err := r.Producer(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	// Not twice in one process: two producers would corrupt the ring.
	if _, err := r.Producer(Wait{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second producer in one process: %v", err)
	}
	p.Close()
	if _, err := p.Claim(8); !errors.Is(err, ErrClosed) {
		t.Fatalf("claim after Close: %v", err)
	}
	// Another live process holds it.
	init, err := LookupProcess(1)
	if err != nil {
		t.Fatal(err)
	}
	r.producerWord.Store(init.word())
	if _, err := r.Producer(Wait{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("attach over live pid 1: %v", err)
	}
	// A dead process's end can be taken over.
	r.producerWord.Store(Process{PID: init.PID, Start: init.Start + 1}.word())
	p, err = r.Producer(Wait{})
	if err != nil {
		t.Fatalf("attach over a dead process: %v", err)
	}
	// A closed consumer makes waiting producers fail; a new consumer
	// reopens the ring.
	c, _ := r.Consumer(Wait{})
	c.Close()
	if err := p.Send(context.Background(), []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("send to a closed consumer: %v", err)
	}
	if _, err := c.Next(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	c, err = r.Consumer(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Send(context.Background(), []byte("y")); err != nil {
		t.Fatalf("send to a new consumer: %v", err)
	}
	if b, err := c.Next(); err != nil || string(b) != "y" {
		t.Fatalf("new consumer got %q, %v", b, err)
	}
}

func init() {
	// ring-producer <segment> <records> <commit every>: streams records.
	children["ring-producer"] = func(args []string) error {
		seg, err := OpenSegment(args[0])
		if err != nil {
			return err
		}
		defer seg.Close()
		r, err := OpenSPSC(seg, 0)
		if err != nil {
			return err
		}
		p, err := r.Producer(Wait{})
		if err != nil {
			return err
		}
		n, _ := strconv.ParseUint(args[1], 10, 64)
		every, _ := strconv.ParseUint(args[2], 10, 64)
		for i := uint64(0); n == 0 || i < n; i++ {
			b, err := p.ClaimWait(context.Background(), recordLen(i, 300)+8)
			if err != nil {
				return err
			}
			binary.LittleEndian.PutUint64(b, i)
			fillRecord(b[8:], i)
			if i%every == 0 {
				p.Commit()
			}
		}
		return p.Close()
	}
	// ring-consumer <segment>: reads and checks records until closed.
	children["ring-consumer"] = func(args []string) error {
		seg, err := OpenSegment(args[0])
		if err != nil {
			return err
		}
		defer seg.Close()
		r, err := OpenSPSC(seg, 0)
		if err != nil {
			return err
		}
		c, err := r.Consumer(Wait{})
		if err != nil {
			return err
		}
		for i := uint64(0); ; i++ {
			b, err := c.NextWait(context.Background())
			if err != nil {
				return err
			}
			if got := binary.LittleEndian.Uint64(b); got != i {
				return fmt.Errorf("record %d has sequence %d", i, got)
			}
			c.Release()
		}
	}
}

func TestSPSCAcrossProcesses(t *testing.T) {
	seg, r := newRing(t, 1<<14)
	cmd := startChild(t, "ring-producer", seg.Name(), "50000", "5")
	c, err := r.Consumer(Wait{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var sum uint32
	for i := uint64(0); ; i++ {
		b, err := c.NextWait(ctx)
		if errors.Is(err, ErrClosed) {
			if i != 50000 {
				t.Fatalf("closed after %d records", i)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint64(b); got != i {
			t.Fatalf("record %d has sequence %d", i, got)
		}
		if err := checkRecord(b[8:], i); err != nil {
			t.Fatal(err)
		}
		sum = crc32.Update(sum, crc32.IEEETable, b)
		c.Release()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// TestSPSCPeerKilled kills the producer with SIGKILL in the middle of a
// stream, again and again: the consumer must get ErrPeerDead (never hang),
// promptly, and nothing must be left in /dev/shm. Then the same with the
// consumer killed under a producer blocked on a full ring.
func TestSPSCPeerKilled(t *testing.T) {
	var worst time.Duration
	for round := range 8 {
		for _, killConsumer := range []bool{false, true} {
			seg, err := CreateSegment(fmt.Sprintf("%s-%d-%v", testName(t), round, killConsumer), SPSCSize(4096), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { seg.Close() })
			r, err := CreateSPSC(seg, 0, 4096)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var cmd interface {
				Wait() error
			}
			killedAt := make(chan time.Time, 1)
			kill := func(pid int) {
				// At a random moment of the stream: not a
				// synchronisation.
				time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
				killedAt <- time.Now()
				syscall.Kill(pid, syscall.SIGKILL)
			}
			if !killConsumer {
				child := startChild(t, "ring-producer", seg.Name(), "0", "3")
				cmd = child
				c, err := r.Consumer(Wait{})
				if err != nil {
					t.Fatal(err)
				}
				// Read a while, then kill the producer mid-stream.
				var once sync.Once
				for i := 0; ; i++ {
					_, err = c.NextWait(ctx)
					if err != nil {
						break
					}
					if i == 1000 {
						once.Do(func() { go kill(child.Process.Pid) })
					}
					c.Release()
				}
				if !errors.Is(err, ErrPeerDead) {
					t.Fatalf("round %d: consumer got %v, want ErrPeerDead", round, err)
				}
			} else {
				child := startChild(t, "ring-consumer", seg.Name())
				cmd = child
				p, err := r.Producer(Wait{})
				if err != nil {
					t.Fatal(err)
				}
				// Kill it once it is attached and the stream runs.
				go func() {
					// Polling: nothing tells when the child has
					// attached. The producer's context bounds it.
					for r.consumerWord.Load() == 0 {
						if ctx.Err() != nil {
							return
						}
						time.Sleep(time.Millisecond)
					}
					kill(child.Process.Pid)
				}()
				for i := uint64(0); ; i++ {
					var b []byte
					b, err = p.ClaimWait(ctx, 100)
					if err != nil {
						break
					}
					binary.LittleEndian.PutUint64(b, i)
					p.Commit()
				}
				if !errors.Is(err, ErrPeerDead) {
					t.Fatalf("round %d: producer got %v, want ErrPeerDead", round, err)
				}
			}
			if d := time.Since(<-killedAt); d > worst {
				worst = d
			}
			cancel()
			cmd.Wait()
			if err := seg.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("slowest detection of a killed peer: %v", worst)
	if names := ubkitNamesOf(t); len(names) > 0 {
		t.Errorf("left in /dev/shm: %v", names)
	}
}

// ubkitNamesOf lists segments this test created that are still named.
func ubkitNamesOf(t *testing.T) []string {
	var out []string
	n := testName(t)
	prefix := userPrefix() + n[:strings.LastIndexByte(n, '-')+1]
	for _, n := range ubkitNames() {
		if len(n) >= len(prefix) && n[:len(prefix)] == prefix {
			out = append(out, n)
		}
	}
	return out
}

// A producer waiting for room with Wait.Room sleeps until that much is
// free, not until the first release: the consumer does not wake it before.
func TestSPSCProducerRoom(t *testing.T) {
	_, r := newRing(t, 4096)
	p, _ := r.Producer(Wait{Spin: -1, Room: 2048})
	c, _ := r.Consumer(Wait{})
	n := 0
	for {
		if _, err := p.Claim(248); err == ErrRingFull {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		n++
	}
	p.Commit() // 16 records of 256 bytes fill the ring
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		_, err := p.ClaimWait(ctx, 248)
		done <- err
	}()
	waitParked(t, 1, "syscall", "shm.futexWait(")
	// A wake-up advances the sequence the producer sleeps on; nothing
	// else does.
	seq := r.spaceSeq.Load()
	for i := 0; i < n; i++ {
		if _, err := c.Next(); err != nil {
			t.Fatal(err)
		}
		c.Release()
		if free := 256 * (i + 1); free < 2048 && r.spaceSeq.Load() != seq {
			t.Fatalf("the consumer woke the producer with %d bytes free, want at least 2048", free)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the producer, with the ring free: %v", err)
	}
}
