//go:build linux

package shm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sleepOnBell sleeps on r's bell in a goroutine, for an hour unless the
// ring is ready (a record, or stop), and reports nil once the sleep ended
// with the ring ready, or else why it ended. A hang guard ends a sleep
// that nothing woke.
func sleepOnBell(r *MPMC, stop func() bool) <-chan error {
	ready := func() bool {
		pos := r.deq.Load()
		return r.seq(pos).Load() == pos+1 || (stop != nil && stop())
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		switch {
		case !r.bell.sleep(ctx, ready, time.Hour):
			done <- errors.New("another goroutine sleeps on the bell")
		case ctx.Err() != nil:
			done <- errors.New("nothing woke the sleep on the bell: the hang guard ended it")
		case !ready():
			done <- errors.New("the sleep on the bell ended with the ring not ready")
		default:
			done <- nil
		}
	}()
	return done
}

// bellSleep is the function that sleeps on a bell, as goroutine dumps
// name it (for waitParked).
const bellSleep = "shm.(*bell).sleep("

// A consumer asleep on its bell wakes for each push of a producer in its
// process, however long it would sleep otherwise, and leaves no FIFO
// behind.
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
	buf := make([]byte, 32)
	for range 50 {
		woke := sleepOnBell(r, nil)
		waitParked(t, 1, "IO wait", bellSleep)
		if err := prod.TryPush([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if err := <-woke; err != nil {
			t.Fatalf("after a push: %v", err)
		}
		if _, err := r.TryPop(buf); err != nil {
			t.Fatal(err)
		}
	}
	path := r.bell.path
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the bell is missing while the ring is open: %v", err)
	}
	r.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("Close left the bell %s (%v)", path, err)
	}
}

// Cancelling the context ends a sleep on the bell, however long it would
// last otherwise, and WaitNotEmpty then returns the context's error.
func TestBellCancel(t *testing.T) {
	_, r := newMPMC(t, 8, 8)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	slept := make(chan error, 1)
	go func() {
		r.bell.sleep(ctx, func() bool { return false }, time.Hour)
		slept <- ctx.Err()
	}()
	waitParked(t, 1, "IO wait", bellSleep)
	cancel()
	select {
	case err := <-slept:
		if err != context.Canceled {
			t.Fatalf("the sleep on the bell ended with %v, want it cancelled", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("cancelling did not end the sleep on the bell")
	}

	ctx, cancel = context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- r.WaitNotEmpty(ctx) }()
	waitParked(t, 1, "IO wait", bellSleep)
	cancel()
	select {
	case err := <-waited:
		if err != context.Canceled {
			t.Fatalf("WaitNotEmpty after cancel: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("WaitNotEmpty did not return after cancel")
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

// The bell of a segment that Sweep removes goes in the same Sweep: it is
// an orphan then, however young (a bell beside its segment was kept
// because the segment was still there when Sweep looked at the bell).
func TestSweepTakesTheBellOfASegmentItRemoves(t *testing.T) {
	name := testName(t)
	if err := startChild(t, "keep-segment", name).Wait(); err != nil {
		t.Fatal(err)
	}
	bell := filepath.Join(ShmDir, userPrefix()+name+bellSuffix+"0")
	if err := mkfifo(bell); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Remove(bell)
		os.Remove(filepath.Join(ShmDir, userPrefix()+name))
	})
	removed, err := Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, name) || !slices.Contains(removed, name+bellSuffix+"0") {
		t.Fatalf("Sweep removed %v; want the segment of a dead creator, %s, and its bell", removed, name)
	}
	if _, err := os.Lstat(bell); !os.IsNotExist(err) {
		t.Fatalf("the bell after Sweep: %v, want it gone", err)
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

// A wait on a closed ring's bell does not spin on it: it sleeps on the
// futex.
func TestBellClosedDoesNotSpin(t *testing.T) {
	_, r := newMPMC(t, 8, 8)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() { waited <- r.WaitNotEmpty(ctx) }()
	waitParked(t, 1, "syscall", "shm.futexWait(")
	cancel()
	select {
	case err := <-waited:
		if err != context.Canceled {
			t.Fatalf("WaitNotEmpty after cancel: %v", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("WaitNotEmpty did not return after cancel")
	}
}

func init() {
	// Push one record for every line read from stdin.
	children["bell-pusher"] = func(args []string) error {
		r, closeRing, err := openChildMPMC(args[0])
		if err != nil {
			return err
		}
		defer closeRing()
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if err := r.Push(context.Background(), []byte("x")); err != nil {
				return err
			}
		}
		return in.Err()
	}
}

// A producer in another process rings the bell through the FIFO: each of
// its pushes ends the consumer's sleep on the bell, which nothing else
// would end.
func TestBellAcrossProcesses(t *testing.T) {
	seg, r := newMPMC(t, 64, 32)
	if err := r.EnableBell(); err != nil {
		t.Fatal(err)
	}
	cmd := childCommand(t, "bell-pusher", childArgs(seg.Name()))
	cmd.Stderr = os.Stderr
	push, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	for i := range 50 {
		woke := sleepOnBell(r, nil)
		waitParked(t, 1, "IO wait", bellSleep)
		if _, err := fmt.Fprintln(push, "push"); err != nil {
			t.Fatal(err)
		}
		if err := <-woke; err != nil {
			t.Fatalf("push %d from another process: %v", i, err)
		}
		if _, err := r.TryPop(buf); err != nil {
			t.Fatal(err)
		}
	}
	push.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// Kick ends a sleep on the bell or on the futex that nothing else would
// end, and WaitNotEmptyOr, asleep on either, returns once its stop
// condition holds.
func TestKickEndsWait(t *testing.T) {
	for _, withBell := range []bool{true, false} {
		t.Run(map[bool]string{true: "bell", false: "futex"}[withBell], func(t *testing.T) {
			_, r := newMPMC(t, 8, 8)
			state, parkedIn := "syscall", "shm.futexWait("
			if withBell {
				if err := r.EnableBell(); err != nil {
					t.Fatal(err)
				}
				state, parkedIn = "IO wait", bellSleep
				var stop atomic.Bool
				woke := sleepOnBell(r, stop.Load)
				waitParked(t, 1, state, parkedIn)
				stop.Store(true)
				r.Kick()
				if err := <-woke; err != nil {
					t.Fatalf("after Kick: %v", err)
				}
			} else {
				// A sleeper as the futex wait registers one; only a wake
				// ends its sleep before the hang guard.
				v := r.notEmptySeq.Load()
				r.popWaiters.Add(1)
				woke := make(chan struct{})
				go func() {
					futexWait(r.notEmptySeq, v, 3*hangGuard)
					r.popWaiters.Add(^uint32(0))
					close(woke)
				}()
				waitParked(t, 1, state, parkedIn)
				r.Kick()
				select {
				case <-woke:
				case <-time.After(hangGuard):
					t.Fatal("Kick did not wake the sleeper on the futex")
				}
			}
			var stop atomic.Bool
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			waited := make(chan error, 1)
			go func() { waited <- r.WaitNotEmptyOr(ctx, stop.Load) }()
			waitParked(t, 1, state, parkedIn)
			stop.Store(true)
			r.Kick()
			if err := <-waited; err != nil {
				t.Fatalf("WaitNotEmptyOr after its stop condition held and Kick: %v", err)
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
	// The sleep looks at the ring twice before it parks: once before its
	// read, and once in the read's first call, after the drain. By the
	// second look the FIFO must be empty.
	looks, pendingAtPark := 0, -1
	ready := func() bool {
		if looks++; looks == 2 {
			pendingAtPark, _ = unix.IoctlGetInt(r.bell.fd, unix.TIOCINQ)
		}
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	r.bell.sleep(ctx, ready, time.Hour)
	if looks < 2 || pendingAtPark != 0 {
		t.Fatalf("the sleep looked at the ring %d times, with %d bytes in the bell at the second look; want the bell emptied by then", looks, pendingAtPark)
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
