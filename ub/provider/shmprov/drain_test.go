package shmprov

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// registeredAndImported registers 4 KiB of a new named segment in owner
// and imports it in peer.
func registeredAndImported(t *testing.T, owner, peer *Context) (ub.Segment, *remoteSegment) {
	t.Helper()
	mem, err := shm.CreateSegment(fmt.Sprintf("regdrain-%d-%d", os.Getpid(), time.Now().UnixNano()), 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	reg, err := owner.RegisterSegment(mem.Data()[:4096], ub.SegmentConfig{Access: ub.AccessWrite, Token: 3})
	if err != nil {
		t.Fatal(err)
	}
	r, err := peer.ImportSegment(reg.Desc(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return reg, r.(*remoteSegment)
}

// TestCloseWaitsForAccessUnderWay: an importer's access counted in
// before the registrant's Close holds Close until it is counted out, and
// the importer's end wakes Close (the patience is far longer than the
// test may take).
func TestCloseWaitsForAccessUnderWay(t *testing.T) {
	owner, peer := openForTest(t), openForTest(t)
	reg, r := registeredAndImported(t, owner, peer)
	r.begin() // an importer that saw the state live and is copying
	if st := r.check(0, 8, ub.AccessWrite); st != ub.StatusSuccess {
		t.Fatalf("check before Close: %v", st)
	}
	done := make(chan error, 1)
	go func() { done <- reg.Close() }()
	for r.state.Load() == stateLive {
		runtime.Gosched()
	}
	// Close has deregistered; it must not return while the access is
	// counted (before the fix it returned here, the access still under way).
	if st := r.check(0, 8, ub.AccessWrite); st != ub.StatusNoPermission {
		t.Errorf("a new access after deregistration: %v, want %v", st, ub.StatusNoPermission)
	}
	// Close must still be waiting: give it a while to return wrongly (a
	// correct Close cannot return here, however slow the machine).
	select {
	case err := <-done:
		t.Fatalf("Close returned (%v) while an access was counted", err)
	case <-time.After(100 * time.Millisecond):
	}
	r.end()
	if err := <-done; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := r.inflight.Load(); n != 0 {
		t.Errorf("%d accesses counted after Close", n)
	}
}

// TestCloseBoundedWhenImporterDies: an importer killed in the middle of
// an access leaves its count behind; Close then gives up after
// drainPatience and says so, rather than hang.
func TestCloseBoundedWhenImporterDies(t *testing.T) {
	defer func(d time.Duration) { drainPatience = d }(drainPatience)
	drainPatience = 50 * time.Millisecond
	owner, peer := openForTest(t), openForTest(t)
	reg, r := registeredAndImported(t, owner, peer)
	r.begin() // and never end: as if killed
	start := time.Now()
	err := reg.Close()
	if !errors.Is(err, errInFlight) {
		t.Fatalf("Close with an access counted forever: %v, want errInFlight", err)
	}
	if waited := time.Since(start); waited < drainPatience || waited > drainPatience+5*time.Second {
		t.Errorf("Close waited %v, patience %v", waited, drainPatience)
	}
	t.Log(err)
	if err := reg.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestContextCloseOneDeadline: importers killed mid-access on several
// registrations cost the context's Close drainPatience once, not once per
// registration (they are deregistered together and drained against one
// deadline); an allocated segment's Close does not wait at all.
func TestContextCloseOneDeadline(t *testing.T) {
	defer func(d time.Duration) { drainPatience = d }(drainPatience)
	drainPatience = 300 * time.Millisecond
	owner, peer := openForTest(t), openForTest(t)
	for range 5 {
		_, r := registeredAndImported(t, owner, peer)
		r.begin() // and never end: as if killed
	}
	start := time.Now()
	err := owner.Close()
	if !errors.Is(err, errInFlight) {
		t.Fatalf("Close with accesses counted forever: %v, want errInFlight", err)
	}
	if waited := time.Since(start); waited >= 3*drainPatience {
		t.Errorf("Close of 5 such registrations waited %v, patience %v: one deadline each", waited, drainPatience)
	}

	seg, err := peer.AllocSegment(64, ub.SegmentConfig{Access: ub.AccessWrite, Token: 5})
	if err != nil {
		t.Fatal(err)
	}
	other := openForTest(t)
	rs, err := other.ImportSegment(seg.Desc(), 5)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	rs.(*remoteSegment).begin() // never ends
	if err := seg.Close(); err != nil {
		t.Fatalf("Close of an allocated segment with an importer's count left: %v", err)
	}
}
