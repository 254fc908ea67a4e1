//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
)

func newMPMC(t testing.TB, slots, size int) (*Segment, *MPMC) {
	t.Helper()
	seg := newSegment(t, MPMCSize(slots, size))
	r, err := CreateMPMC(seg, 0, slots, size, Wait{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return seg, r
}

func TestMPMCBasics(t *testing.T) {
	_, r := newMPMC(t, 4, 16)
	buf := make([]byte, 16)
	if _, err := r.TryPop(buf); err != ErrRingEmpty {
		t.Fatalf("empty: %v", err)
	}
	for i := range 4 {
		if err := r.TryPush([]byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.TryPush([]byte{9}); err != ErrRingFull {
		t.Fatalf("full: %v", err)
	}
	if err := r.TryPush(make([]byte, 17)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too large: %v", err)
	}
	for i := range 4 {
		n, err := r.TryPop(buf)
		if err != nil || n != 1 || buf[0] != byte(i) {
			t.Fatalf("pop %d: %d %v %v", i, n, buf[:n], err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := r.Pop(ctx, buf); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Pop on empty: %v", err)
	}
}

// openChildMPMC opens, in a child process, the ring at offset 0 of the
// named segment; closeRing closes both.
func openChildMPMC(name string) (r *MPMC, closeRing func(), err error) {
	seg, err := OpenSegment(name)
	if err != nil {
		return nil, nil, err
	}
	r, err = OpenMPMC(seg, 0, Wait{})
	if err != nil {
		seg.Close()
		return nil, nil, err
	}
	return r, func() { r.Close(); seg.Close() }, nil
}

func init() {
	// mpmc-worker <segment> <push|pop> <count> <id>
	children["mpmc-worker"] = func(args []string) error {
		r, closeRing, err := openChildMPMC(args[0])
		if err != nil {
			return err
		}
		defer closeRing()
		n, _ := strconv.Atoi(args[2])
		id, _ := strconv.Atoi(args[3])
		ctx := context.Background()
		buf := make([]byte, 16)
		for i := range n {
			if args[1] == "push" {
				binary.LittleEndian.PutUint64(buf, uint64(id)<<32|uint64(i))
				if err := r.Push(ctx, buf); err != nil {
					return err
				}
			} else if _, err := r.Pop(ctx, buf); err != nil {
				return err
			}
		}
		return nil
	}
}

// TestMPMCAcrossProcesses runs two producer processes and one consumer
// process against goroutines of this one; every record arrives exactly once
// and in per-producer order.
func TestMPMCAcrossProcesses(t *testing.T) {
	seg, r := newMPMC(t, 64, 16)
	const per = 20000
	var cmds []interface{ Wait() error }
	for id := 1; id <= 2; id++ {
		cmds = append(cmds, startChild(t, "mpmc-worker", seg.Name(), "push", strconv.Itoa(per), strconv.Itoa(id)))
	}
	cmds = append(cmds, startChild(t, "mpmc-worker", seg.Name(), "pop", strconv.Itoa(per), "0"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 16)
		for i := range per {
			binary.LittleEndian.PutUint64(buf, 3<<32|uint64(i))
			if err := r.Push(ctx, buf); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	last := map[uint64]int64{1: -1, 2: -1, 3: -1}
	seen := 0
	buf := make([]byte, 16)
	for seen < 2*per {
		n, err := r.Pop(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		v := binary.LittleEndian.Uint64(buf[:n])
		id, i := v>>32, int64(uint32(v))
		if i <= last[id] {
			t.Fatalf("producer %d: record %d after %d", id, i, last[id])
		}
		last[id] = i
		seen++
	}
	wg.Wait()
	for _, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.TryPop(buf); err != ErrRingEmpty {
		t.Fatalf("ring not empty at the end: %v", err)
	}
}

func TestMPMCPeerDead(t *testing.T) {
	seg, r := newMPMC(t, 8, 16)
	cmd := startChild(t, "mpmc-worker", seg.Name(), "pop", "1000000", "0")
	// Wait for it to attach, then kill it: a producer blocked on the full ring
	// learns nobody is left to pop.
	for deadline := time.Now().Add(hangGuard); r.peerCheck() == nil && r.part(1).Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the child did not attach to the ring")
		}
		// Polling: nothing tells when the child has attached.
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for err == nil {
		err = r.Push(ctx, []byte("x"))
	}
	if !errors.Is(err, ErrPeerDead) {
		t.Fatalf("push with every peer dead: %v", err)
	}
}

func TestMPMCCorrupt(t *testing.T) {
	_, r := newMPMC(t, 8, 16)
	buf := make([]byte, 16)
	r.seq(0).Store(12345)
	if err := r.TryPush([]byte("x")); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("push: %v", err)
	}
	r.seq(0).Store(1)
	binary.LittleEndian.PutUint32(r.slot(0)[8:], 1<<20)
	if _, err := r.TryPop(buf); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("pop of an oversized record: %v", err)
	}
	r.seq(1).Store(1 << 40)
	if _, err := r.TryPop(buf); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("pop: %v", err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go scribble(r.mem, stop, &wg)
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		callReturns(t, "MPMC push/pop", func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Millisecond)
			defer cancel()
			r.Push(ctx, []byte("abc"))
			r.Pop(ctx, buf)
		})
	}
	close(stop)
	wg.Wait()
}
