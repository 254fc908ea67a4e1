//go:build linux

package shm

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// A consumer asleep on its bell wakes for each push, well before its
// sleep's own end, and leaves no FIFO behind.
func TestBellWakes(t *testing.T) {
	seg, r := newMPMC(t, 64, 32)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	prod, err := OpenMPMC(seg, 0, Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var lat []time.Duration
	buf := make([]byte, 32)
	for i := 0; i < 50; i++ {
		pushed := make(chan time.Time, 1)
		go func() {
			time.Sleep(200 * time.Microsecond)
			pushed <- time.Now()
			if err := prod.TryPush([]byte("x")); err != nil {
				t.Error(err)
			}
		}()
		// A long sleep: only the bell ends it early.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := r.WaitNotEmpty(ctx)
		cancel()
		woke := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		lat = append(lat, woke.Sub(<-pushed))
		if _, err := r.TryPop(buf); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(lat)
	if lat[len(lat)/2] > livenessInterval/2 {
		t.Fatalf("median wake-up %v after the push: the bell did not ring", lat[len(lat)/2])
	}
	t.Logf("wake-up after a push: p50 %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
	path := r.bell.path
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the bell is missing while the ring is open: %v", err)
	}
	r.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("Close left the bell %s (%v)", path, err)
	}
}

// A cancelled wait returns at once even while asleep on the bell.
func TestBellCancel(t *testing.T) {
	_, r := newMPMC(t, 8, 8)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	start := time.Now()
	if err := r.WaitNotEmpty(ctx); err != context.Canceled {
		t.Fatalf("WaitNotEmpty after cancel: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the cancelled wait took %v", d)
	}
}

// Sweep removes a bell no process listens on and keeps a live one.
func TestSweepBells(t *testing.T) {
	_, r := newMPMC(t, 8, 8)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(ShmDir, userPrefix()+testName(t)+bellSuffix+"0")
	if err := mkfifo(stale); err != nil {
		t.Fatal(err)
	}
	// A young bell beside a live segment stays; a young one whose segment
	// is gone is an orphan.
	youngSeg := newSegment(t, 4096)
	young := filepath.Join(ShmDir, userPrefix()+youngSeg.Name()+bellSuffix+"0")
	if err := mkfifo(young); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(young)
	orphan := filepath.Join(ShmDir, userPrefix()+testName(t)+"-orphan"+bellSuffix+"0")
	if err := mkfifo(orphan); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(orphan)
	// Only bells older than a minute may be stale: a consumer opens its
	// bell just after making it.
	old := time.Now().Add(-2 * bellSweepAge)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	removed, err := Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, strings.TrimPrefix(filepath.Base(stale), userPrefix())) {
		t.Fatalf("Sweep left the stale bell %s (removed %v)", stale, removed)
	}
	if _, err := os.Lstat(r.bell.path); err != nil {
		t.Fatalf("Sweep removed a live ring's bell: %v", err)
	}
	if _, err := os.Lstat(young); err != nil {
		t.Fatalf("Sweep removed a bell made a moment ago beside its segment: %v", err)
	}
	if _, err := os.Lstat(orphan); !os.IsNotExist(err) {
		t.Fatalf("Sweep left a bell whose segment is gone (%v)", err)
	}
}

// A bell belongs to the consumer that made it: a second consumer cannot
// take it over while it is live, and a consumer whose bell was replaced
// does not remove the new one when it closes.
func TestBellOwnership(t *testing.T) {
	seg, r1 := newMPMC(t, 8, 8)
	r2, err := OpenMPMC(seg, 0, Wait{})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r1.EnableBell(); err != nil {
		t.Fatal(err)
	}
	if err := r2.EnableBell(); err == nil {
		t.Fatal("a second consumer took over a live bell")
	}
	// r1's FIFO goes (as a Sweep in a race would take it); r2 makes its own.
	os.Remove(r1.bell.path)
	if err := r2.EnableBell(); err != nil {
		t.Fatal(err)
	}
	r1.Close()
	if _, err := os.Lstat(r2.bell.path); err != nil {
		t.Fatalf("closing r1 removed r2's bell: %v", err)
	}
}

// A wait on a closed ring's bell does not spin: it falls back to the futex.
func TestBellClosedDoesNotSpin(t *testing.T) {
	_, r := newMPMC(t, 8, 8)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := cpu()
	r.WaitNotEmpty(ctx)
	// Waiting 300 ms on a futex costs a few ms of CPU; spinning, all 300.
	if used := cpu() - before; used > 150*time.Millisecond {
		t.Fatalf("a 300 ms wait on a closed ring's bell used %v of CPU", used)
	}
}

func init() {
	children["bell-pusher"] = func(args []string) error {
		r, closeRing, err := openChildMPMC(args[0])
		if err != nil {
			return err
		}
		defer closeRing()
		n, _ := strconv.Atoi(args[1])
		for range n {
			// One record at a time: wait until the consumer took the
			// last, so that it is asleep when the next comes.
			for r.deq.Load() != r.enq.Load() {
				time.Sleep(50 * time.Microsecond)
			}
			time.Sleep(300 * time.Microsecond)
			if err := r.Push(context.Background(), []byte("x")); err != nil {
				return err
			}
		}
		return nil
	}
}

// A producer in another process rings the bell through the FIFO: every
// push ends the consumer's sleep, which would otherwise last its full 20 ms
// bound each time (50 pushes: a second).
func TestBellAcrossProcesses(t *testing.T) {
	seg, r := newMPMC(t, 64, 32)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	const n = 50
	start := time.Now()
	cmd := startChild(t, "bell-pusher", seg.Name(), strconv.Itoa(n))
	buf := make([]byte, 32)
	for i := 0; i < n; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.WaitNotEmpty(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.TryPop(buf); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if took > 500*time.Millisecond {
		t.Fatalf("%d pushes from another process took %v to arrive: the bell did not ring", n, took)
	}
	t.Logf("%d pushes from another process, 300 µs apart, arrived in %v", n, took)
}

// Kick ends a WaitNotEmptyOr whose stop condition it made true, asleep on
// the bell or on the futex, well before the sleep's own end.
func TestKickEndsWait(t *testing.T) {
	for _, withBell := range []bool{true, false} {
		t.Run(map[bool]string{true: "bell", false: "futex"}[withBell], func(t *testing.T) {
			_, r := newMPMC(t, 8, 8)
			if withBell {
				if err := r.EnableBell(); err != nil {
					t.Fatal(err)
				}
			}
			var lat []time.Duration
			for i := 0; i < 30; i++ {
				var stop atomic.Bool
				kicked := make(chan time.Time, 1)
				go func() {
					time.Sleep(200 * time.Microsecond)
					kicked <- time.Now()
					stop.Store(true)
					r.Kick()
				}()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := r.WaitNotEmptyOr(ctx, stop.Load)
				cancel()
				woke := time.Now()
				if err != nil {
					t.Fatal(err)
				}
				if !stop.Load() {
					t.Fatal("WaitNotEmptyOr returned on an empty ring before the stop condition held")
				}
				lat = append(lat, woke.Sub(<-kicked))
			}
			slices.Sort(lat)
			if lat[len(lat)/2] > livenessInterval/2 {
				t.Fatalf("median wake-up %v after the kick: Kick did not wake the wait", lat[len(lat)/2])
			}
		})
	}
}

// Bytes a producer of another process left in the bell (its sleeper woke
// another way) are taken before the next sleep: on kernels that wake a
// pipe's readers only when it goes from empty to not empty, a bell that
// kept bytes would never ring again.
func TestBellEmptiedBeforeSleep(t *testing.T) {
	_, r := newMPMC(t, 8, 8)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	w, err := openBellForWriting(r.bell.path)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(w)
	if _, err := syscall.Write(w, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	r.bell.written.Store(1)
	// Let the poller see the FIFO readable before the sleep: only the
	// drain before parking then takes the bytes.
	time.Sleep(5 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := r.WaitNotEmpty(ctx); err != context.DeadlineExceeded {
		t.Fatalf("WaitNotEmpty on an empty ring: %v", err)
	}
	if r.bell.written.Load() != 0 {
		t.Fatal("the bell still says a producer wrote")
	}
	rd, err := syscall.Open(r.bell.path, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(rd)
	if n, err := syscall.Read(rd, make([]byte, 200)); err != syscall.EAGAIN {
		t.Fatalf("the bell still holds bytes: read %d, %v", n, err)
	}
}
