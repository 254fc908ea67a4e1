package ubtest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"runtime"
	"sync"
	"testing"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// testRegister checks RegisterSegment (URMA's urma_register_seg): memory
// the test process has, registered, is reached by a peer process as an
// allocated segment is, within the registration's own bounds, access
// flags and token; writes on either side show on the other; Close
// deregisters it and leaves the memory to its owner.
func testRegister(t *testing.T, open Open, opts Options) {
	const size = 1 << 15
	l := newLocal(t, open, ub.ReliableMessage)
	mem := opts.memory(t, 2*size)
	if len(mem) < 2*size {
		t.Fatalf("Options.Memory gave %d bytes, want %d", len(mem), 2*size)
	}
	// Two registrations in one piece of memory: the first half for
	// everything, the second half read-only.
	rw, err := l.c.RegisterSegment(mem[:size], ub.SegmentConfig{Access: ub.AccessAtomic, Token: peerToken})
	if err != nil {
		t.Fatalf("RegisterSegment: %v (does the provider need Options.Memory?)", err)
	}
	ro, err := l.c.RegisterSegment(mem[size:], ub.SegmentConfig{Access: ub.AccessRead, Token: peerToken})
	if err != nil {
		t.Fatalf("RegisterSegment of read-only memory: %v", err)
	}
	if b := rw.Bytes(); len(b) != size || &b[0] != &mem[0] {
		t.Fatalf("Bytes of a registered segment is not the memory registered (%d bytes)", len(b))
	}
	if d := rw.Desc(); d.Size != size || d.Provider != l.c.Provider() || d.Name == "" {
		t.Errorf("descriptor %+v", d)
	}
	copy(mem[200:], "owner-wrote")
	copy(mem[size+16:], "read only")
	binary.LittleEndian.PutUint64(mem[512:], 40)
	p := startPeer(t)

	wantRemote := func(what string, r remoteResult, want ub.Status) {
		t.Helper()
		if r.Err != "" || r.Status != want.String() {
			t.Errorf("%s: status %q (%s), want %v", what, r.Status, r.Err, want)
		}
	}
	wantRemote("peer writes", p.remote("write", peerToken, 64, "peer-wrote", rw.Desc()), ub.StatusSuccess)
	if got := string(mem[64:74]); got != "peer-wrote" {
		t.Errorf("the registrant's memory holds %q after the peer's write completed", got)
	}
	r := p.remote("read", peerToken, 200, 11, rw.Desc())
	wantRemote("peer reads", r, ub.StatusSuccess)
	if r.Data != "owner-wrote" {
		t.Errorf("the peer read %q where the registrant wrote %q", r.Data, "owner-wrote")
	}
	r = p.remote("add", peerToken, 512, 2, rw.Desc())
	wantRemote("peer's fetch-add", r, ub.StatusSuccess)
	if r.Value != 40 || binary.LittleEndian.Uint64(mem[512:]) != 42 {
		t.Errorf("fetch-add of 2 on 40 returned %d and left %d", r.Value, binary.LittleEndian.Uint64(mem[512:]))
	}

	// The registration's bounds, flags and token, not the memory's.
	wantRemote("write with a wrong token", p.remote("write", peerToken+1, 0, "badtoken", rw.Desc()), ub.StatusBadToken)
	wantRemote("read with a wrong token", p.remote("read", peerToken+1, 200, 4, rw.Desc()), ub.StatusBadToken)
	wantRemote("write past the registered end", p.remote("write", peerToken, size-4, "overflow", rw.Desc()), ub.StatusOutOfBounds)
	wantRemote("write into read-only registered memory", p.remote("write", peerToken, 16, "writable", ro.Desc()), ub.StatusNoPermission)
	wantRemote("atomic on read-only registered memory", p.remote("add", peerToken, 0, 1, ro.Desc()), ub.StatusNoPermission)
	r = p.remote("read", peerToken, 16, 9, ro.Desc())
	wantRemote("read of read-only registered memory", r, ub.StatusSuccess)
	if r.Data != "read only" {
		t.Errorf("read of the read-only registration gave %q", r.Data)
	}
	if string(mem[:8]) == "badtoken" || string(mem[size-4:size+4]) == "overflow" || string(mem[size+16:size+24]) == "writable" {
		t.Error("a refused write reached the registered memory")
	}

	// Close deregisters; the memory stays the registrant's.
	if err := rw.Close(); err != nil {
		t.Fatalf("close a registered segment: %v", err)
	}
	wantRemote("write after deregistration", p.remote("write", peerToken, 64, "too-late", rw.Desc()), ub.StatusNoPermission)
	wantRemote("read after deregistration", p.remote("read", peerToken, 64, 4, rw.Desc()), ub.StatusNoPermission)
	if got := string(mem[64:74]); got != "peer-wrote" {
		t.Errorf("after Close the memory holds %q, want the peer's write", got)
	}
	copy(mem[64:], "still mine")
	if got := string(mem[64:74]); got != "still mine" {
		t.Errorf("the memory is not the caller's after Close: %q", got)
	}
	if err := rw.Close(); err != nil {
		t.Errorf("a second Close of a registered segment: %v", err)
	}
	// The other registration of the same memory is untouched.
	r = p.remote("read", peerToken, 16, 9, ro.Desc())
	wantRemote("read of the other registration after the first's Close", r, ub.StatusSuccess)

	// The context's Close deregisters what it registered, as it closes
	// what it allocated; the memory is still the caller's.
	if err := l.c.Close(); err != nil {
		t.Fatalf("close the context: %v", err)
	}
	copy(mem[size+16:], "caller's!")
	if r := p.remote("read", peerToken, 16, 9, ro.Desc()); r.Status == ub.StatusSuccess.String() {
		t.Errorf("a registration of a closed context is still readable (%q)", r.Data)
	}
	if got := string(mem[size+16 : size+25]); got != "caller's!" {
		t.Errorf("the memory is not the caller's after its context closed: %q", got)
	}
}

// testRegisterCloseUnderWrites checks that Close ends a peer's writes:
// a peer writes into registered memory over and over while the
// registrant closes the registration, and once Close has returned no
// write lands in the memory, which is the caller's again (URMA's
// unregister: the memory is not reached by the bus afterwards).
func testRegisterCloseUnderWrites(t *testing.T, open Open, opts Options) {
	testRegisterCloseUnderPeer(t, open, opts, false)
}

// testRegisterCloseUnderPeerReads checks that Close ends a peer's reads:
// a peer reads registered memory (all 0xAA) over and over while the
// registrant closes the registration and then clears the memory; no
// read completes successfully with anything but 0xAA (the bus reads no
// memory once Close has returned).
func testRegisterCloseUnderPeerReads(t *testing.T, open Open, opts Options) {
	testRegisterCloseUnderPeer(t, open, opts, true)
}

// testRegisterCloseUnderPeer is both: a peer's requests end successfully
// or refused, and none reaches the memory after Close.
func testRegisterCloseUnderPeer(t *testing.T, open Open, opts Options, read bool) {
	size, trials, cmd, access, what := 1<<20, 8, "hammer", ub.AccessWrite, "writes"
	if read {
		// Longer requests, more trials: a read reaching the memory
		// after Close shows only once the memory changed.
		size, trials, cmd, access, what = 4<<20, 24, "readhammer", ub.AccessRead, "reads"
	}
	l := newLocal(t, open, ub.ReliableMessage)
	mem := opts.memory(t, size)
	if len(mem) < size {
		t.Fatalf("Options.Memory gave %d bytes, want %d", len(mem), size)
	}
	mem = mem[:size]
	p := startPeer(t)
	for trial := range trials {
		fill := byte(0)
		if read {
			fill = 0xAA
		}
		for i := range mem {
			mem[i] = fill
		}
		seg, err := l.c.RegisterSegment(mem, ub.SegmentConfig{Access: access, Token: peerToken})
		if err != nil {
			t.Fatalf("RegisterSegment: %v", err)
		}
		d, err := json.Marshal(seg.Desc())
		if err != nil {
			t.Fatal(err)
		}
		var started string
		p.do(&started, cmd, uint32(peerToken), 0, size, string(d))
		if started != "" {
			t.Fatalf("the peer's %s did not start: %s", what, started)
		}
		if err := seg.Close(); err != nil {
			t.Fatalf("Close under a peer's %s: %v", what, err)
		}
		clear(mem) // the caller's again
		var statuses map[string]int
		p.do(&statuses, "stophammer")
		if i := bytes.IndexByte(mem, 0xAA); i >= 0 {
			t.Fatalf("trial %d: a peer's write reached byte %d of the memory after Close returned (the peer's writes: %v)", trial, i, statuses)
		}
		for st, n := range statuses {
			if st != ub.StatusSuccess.String() && st != ub.StatusNoPermission.String() {
				t.Errorf("trial %d: %d %s ended with %q (\"other bytes\": a read after Close returned)", trial, n, what, st)
			}
		}
	}
}

// testRegisterCloseUnderReads checks that Close ends the registrant's own
// reads into registered memory: reads of 1 MiB (from a segment of its own,
// all 0xAA, through its import), eight in flight, over and over, while the
// memory's registration is closed; once Close has returned no read's data
// lands in the memory, and each read ends successfully or failed on its
// closed buffer.
func testRegisterCloseUnderReads(t *testing.T, open Open, opts Options) {
	const n, trials = 1 << 20, 8
	l := newLocal(t, open, ub.ReliableMessage)
	mem := opts.memory(t, 4*n)
	if len(mem) < 4*n {
		t.Fatalf("Options.Memory gave %d bytes, want %d", len(mem), 4*n)
	}
	mem = mem[:4*n]
	src, err := l.c.AllocSegment(n, ub.SegmentConfig{Access: ub.AccessRead, Token: peerToken})
	if err != nil {
		t.Fatal(err)
	}
	for i := range src.Bytes()[:n] {
		src.Bytes()[i] = 0xAA
	}
	r := l.importSegment(t, src.Desc(), peerToken)
	for trial := range trials {
		clear(mem)
		seg, err := l.c.RegisterSegment(mem, ub.SegmentConfig{})
		if err != nil {
			t.Fatalf("RegisterSegment: %v", err)
		}
		started, halt, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		statuses := map[ub.Status]int{}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			// Eight reads always in flight: Close meets them mid-way.
			defer wg.Done()
			defer close(done)
			comp := make([]ub.Completion, 1)
			post := func(i int) bool {
				wr := ub.WR{Op: ub.OpRead, Local: ub.Local{Seg: seg, Offset: i % 4 * n, Len: n}, Remote: ub.Remote{Seg: r}}
				if _, err := l.j.PostSend([]ub.WR{wr}); err != nil {
					t.Errorf("post a read: %v", err)
					return false
				}
				return true
			}
			for i := range 8 {
				if !post(i) {
					return
				}
			}
			for i, inFlight := 8, 8; inFlight > 0; i++ {
				if err := waitOne(l.cq, comp); err != nil {
					t.Errorf("wait for a read: %v", err)
					return
				}
				inFlight--
				statuses[comp[0].Status]++
				if i == 8 {
					close(started)
				}
				select {
				case <-halt:
					continue // no more: wait for those in flight
				default:
				}
				if !post(i) {
					return
				}
				inFlight++
			}
		}()
		select {
		case <-started:
		case <-done:
			t.Fatal("the reads failed before the first completed")
		}
		if err := seg.Close(); err != nil {
			t.Fatalf("Close under reads into it: %v", err)
		}
		clear(mem) // the caller's again
		close(halt)
		wg.Wait()
		if i := bytes.IndexByte(mem, 0xAA); i >= 0 {
			t.Fatalf("trial %d: a read's data reached byte %d of the memory after Close returned (reads: %v)", trial, i, statuses)
		}
		for st, k := range statuses {
			if st != ub.StatusSuccess && st != ub.StatusLocalLength {
				t.Errorf("trial %d: %d reads ended with %v", trial, k, st)
			}
		}
	}
}

// testRegisterAtomics checks atomics on registered memory: a word 8-byte
// aligned at its offset but not in memory completes with
// StatusMisaligned (reads and writes of such memory work), and a peer's
// FetchAdd and CAS are atomic with respect to the registrant's own CPU
// atomics on the same word (sync/atomic, here through shm.WordIn), as on
// hardware: no increment of either is lost.
func testRegisterAtomics(t *testing.T, open Open, opts Options) {
	const size = 4096
	l := newLocal(t, open, ub.ReliableMessage)
	mem := opts.memory(t, size+16)
	if len(mem) < size+16 {
		t.Fatalf("Options.Memory gave %d bytes, want %d", len(mem), size+16)
	}
	aligned := 0
	for ; aligned < 8; aligned++ {
		if _, err := shm.WordIn(mem, aligned); err == nil {
			break
		}
	}
	p := startPeer(t)
	want := func(what string, r remoteResult, st ub.Status) {
		t.Helper()
		if r.Err != "" || r.Status != st.String() {
			t.Errorf("%s: status %q (%s), want %v", what, r.Status, r.Err, st)
		}
	}

	// Memory one byte past an 8-byte boundary: every 8-byte offset of
	// the registration is unaligned in memory.
	odd := mem[aligned+1 : aligned+1+size]
	binary.LittleEndian.PutUint64(odd[8:], 5)
	seg, err := l.c.RegisterSegment(odd, ub.SegmentConfig{Access: ub.AccessAtomic, Token: peerToken})
	if err != nil {
		t.Fatalf("RegisterSegment of memory unaligned by one byte: %v", err)
	}
	for _, off := range []int{0, 8} {
		want("fetch-add at an aligned offset of unaligned memory", p.remote("add", peerToken, off, 1, seg.Desc()), ub.StatusMisaligned)
	}
	if got := binary.LittleEndian.Uint64(odd[8:]); got != 5 {
		t.Errorf("a refused fetch-add changed the word: %d, want 5", got)
	}
	want("write into unaligned registered memory", p.remote("write", peerToken, 3, "unaligned", seg.Desc()), ub.StatusSuccess)
	if got := string(odd[3:12]); got != "unaligned" {
		t.Errorf("the memory holds %q after the write", got)
	}
	if err := seg.Close(); err != nil {
		t.Fatal(err)
	}

	// The peer's atomics and the registrant's, on one word.
	const peerAdds, ownAdds = 400, 20000
	word, err := shm.WordIn(mem, aligned)
	if err != nil {
		t.Fatal(err)
	}
	word.Store(0)
	seg, err = l.c.RegisterSegment(mem[aligned:aligned+size], ub.SegmentConfig{Access: ub.AccessAtomic, Token: peerToken})
	if err != nil {
		t.Fatal(err)
	}
	d, err := json.Marshal(seg.Desc())
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var own uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Until the peer is done, and a bounded number: a provider
		// whose goroutines serve the peer's atomics here needs the
		// processor too (GOMAXPROCS=1), and a scheduler may leave a
		// goroutine that is always runnable in its place.
		for range ownAdds {
			select {
			case <-stop:
				return
			default:
			}
			word.Add(1)
			own++
			runtime.Gosched()
		}
	}()
	var res string
	p.do(&res, "add", 0, peerAdds, string(d))
	close(stop)
	wg.Wait()
	if res != "ok" {
		t.Fatalf("the peer's atomics: %s", res)
	}
	if got := word.Load(); got != own+peerAdds {
		t.Errorf("the word is %d after %d increments of the registrant and %d of the peer: %d lost", got, own, peerAdds, own+peerAdds-got)
	}
	if err := seg.Close(); err != nil {
		t.Fatal(err)
	}
}
