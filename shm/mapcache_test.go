//go:build linux

package shm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// cacheFixture creates segment name (Keep, removed at the end) of size
// bytes filled with fill, closed, and returns a MapCache of n that the
// test closes.
func cacheFixture(t *testing.T, name string, size int, fill byte, n int) *MapCache {
	t.Helper()
	path := filepath.Join(ShmDir, userPrefix()+name)
	t.Cleanup(func() { os.Remove(path) })
	s, err := CreateSegment(name, size, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	copy(s.Data(), bytes.Repeat([]byte{fill}, s.Size()))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c := NewMapCache(n)
	t.Cleanup(func() { c.Close() })
	return c
}

// releaseNew makes n segments base-0 to base-<n-1> (removed at the end),
// opens each through c, calls before with it (if set), releases it into
// c, and returns where each was mapped.
func releaseNew(t *testing.T, c *MapCache, base string, n int, before func(i int, s *Segment)) []uintptr {
	t.Helper()
	var at []uintptr
	for i := range n {
		name := fmt.Sprintf("%s-%d", base, i)
		cacheFixture(t, name, 4096, byte('0'+i), 1)
		s, err := c.OpenSegment(name)
		if err != nil {
			t.Fatal(err)
		}
		at = append(at, start(s))
		if before != nil {
			before(i, s)
		}
		if err := c.Release(s); err != nil {
			t.Fatal(err)
		}
	}
	return at
}

// start is where s's mapping starts.
func start(s *Segment) uintptr { return uintptr(unsafe.Pointer(&s.mem[0])) }

// mapped reports whether this process has a mapping starting at addr.
func mapped(t *testing.T, addr uintptr) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains("\n"+string(maps), fmt.Sprintf("\n%x-", addr))
}

// TestMapCache: a segment released into the cache is opened again on the
// same mapping (no new one), shows what another mapping wrote meanwhile,
// and is found by MappingOf only while open; ReuseSegment through the
// cache zeroes the file through the idle mapping.
func TestMapCache(t *testing.T) {
	name := testName(t)
	c := cacheFixture(t, name, 2*4096, 'a', 4)
	s, err := c.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	at, data := start(s), s.Data()[:1]
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	if c.Idle() != 1 || !mapped(t, at) {
		t.Fatalf("after Release: %d idle, mapped %v; want 1, true", c.Idle(), mapped(t, at))
	}
	if _, err := MappingOf(data); err == nil {
		t.Fatal("MappingOf finds a released segment's memory")
	}
	// Another mapping (another process's, as far as the file knows)
	// writes meanwhile.
	w, err := OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	copy(w.Data(), "written elsewhere")
	w.Close()
	s, err = c.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	if start(s) != at || c.Hits() != 1 || c.Idle() != 0 {
		t.Fatalf("reopened at %#x (was %#x), %d hits, %d idle; want the same mapping, 1 hit, none idle", start(s), at, c.Hits(), c.Idle())
	}
	if got := string(s.Data()[:17]); got != "written elsewhere" {
		t.Fatalf("reopened mapping reads %q", got)
	}
	if m, err := MappingOf(s.Data()[:1]); err != nil || m.ID != s.ID() {
		t.Fatalf("MappingOf an adopted mapping: %+v, %v", m, err)
	}
	id := s.ID()
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	next := name + "-next"
	t.Cleanup(func() { os.Remove(filepath.Join(ShmDir, userPrefix()+next)) })
	r, err := c.ReuseSegment(name, next, 2*4096)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if start(r) != at || c.Hits() != 2 {
		t.Fatalf("reused at %#x (was %#x), %d hits; want the idle mapping", start(r), at, c.Hits())
	}
	if r.ID() == id || !bytes.Equal(r.Data(), make([]byte, r.Size())) {
		t.Fatalf("reused segment: ID %#x (was %#x), zeroed %v", r.ID(), id, bytes.Equal(r.Data(), make([]byte, r.Size())))
	}
}

// TestMapCacheReleaseUnlocks: a released segment no longer holds its
// file (the lock goes with the description's last reference, which the
// kept mapping holds, so Release drops it itself): RenameSegment, which
// needs the file to itself, takes it.
func TestMapCacheReleaseUnlocks(t *testing.T) {
	name := testName(t)
	c := cacheFixture(t, name, 4096, 'b', 4)
	s, err := c.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := RenameSegment(name, name+"-x"); err == nil {
		t.Fatal("renamed a segment held open")
	}
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(ShmDir, userPrefix()+name+"-x")) })
	r, err := RenameSegment(name, name+"-x")
	if err != nil {
		t.Fatalf("rename after Release: %v", err)
	}
	r.Close()
}

// TestMapCacheOtherFile: the idle mapping of a file removed since is
// never given to a new file of the same name, and a segment removed
// before its Release is not kept at all.
func TestMapCacheOtherFile(t *testing.T) {
	name := testName(t)
	c := cacheFixture(t, name, 4096, 'c', 4)
	s, err := c.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(ShmDir, userPrefix()+name)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	n, err := CreateSegment(name, 4096, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	copy(n.Data(), "new file")
	n.Close()
	s, err = c.OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	// The old file's idle mapping is let go (its file is removed), and
	// the new file mapped anew (perhaps where the old mapping was).
	if c.Hits() != 0 || c.Idle() != 0 || string(s.Data()[:8]) != "new file" {
		t.Fatalf("a new file of the name: %d hits, %d idle, reads %q; want a new mapping of it, the old one let go", c.Hits(), c.Idle(), s.Data()[:8])
	}
	// Removed while open: closed on Release, not kept.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	at := start(s)
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	if c.Idle() != 0 || mapped(t, at) {
		t.Fatalf("released after its removal: %d idle, still mapped %v", c.Idle(), mapped(t, at))
	}
}

// TestMapCacheBounds: beyond its size the cache unmaps its oldest idle
// mapping; Close unmaps the rest, and a Release after Close closes.
func TestMapCacheBounds(t *testing.T) {
	base := testName(t)
	fds := openFDs(t)
	c := NewMapCache(2)
	at := releaseNew(t, c, base, 3, nil)
	if n := openFDs(t) - fds; n != 2 {
		t.Fatalf("%d descriptors more with 2 idle mappings", n)
	}
	if c.Idle() != 2 || mapped(t, at[0]) || !mapped(t, at[1]) || !mapped(t, at[2]) {
		t.Fatalf("3 released into a cache of 2: %d idle, mapped %v %v %v; want the oldest unmapped", c.Idle(), mapped(t, at[0]), mapped(t, at[1]), mapped(t, at[2]))
	}
	s, err := c.OpenSegment(base + "-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if c.Idle() != 0 || mapped(t, at[1]) {
		t.Fatalf("after Close: %d idle, mapped %v", c.Idle(), mapped(t, at[1]))
	}
	if err := c.Release(s); err != nil || mapped(t, at[2]) || c.Idle() != 0 {
		t.Fatalf("Release after Close: %v, still mapped %v, %d idle", err, mapped(t, at[2]), c.Idle())
	}
	before := openSegments.Load()
	if err := c.Release(s); err != nil || openSegments.Load() != before {
		t.Fatalf("a second Release: %v, open segments %d → %d", err, before, openSegments.Load())
	}
	if n := openFDs(t) - fds; n != 0 {
		t.Fatalf("%d descriptors left after Close", n)
	}
}

// TestMapCacheUnlinking: a segment whose Close would unlink it (created
// without Keep) is closed by Release, not kept.
func TestMapCacheUnlinking(t *testing.T) {
	name := testName(t)
	c := NewMapCache(2)
	defer c.Close()
	s, err := CreateSegment(name, 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ShmDir, userPrefix()+name)); !os.IsNotExist(err) || c.Idle() != 0 {
		t.Fatalf("released creator's segment: stat %v, %d idle; want it unlinked and closed", err, c.Idle())
	}
}

// TestMapCachePrunesRemoved: an idle mapping whose file is removed while
// it is idle is let go (unmapped, its descriptor closed: its memory
// freed) at the cache's next Release or opening, not only when it is
// the oldest; a mapping made read-only is writable again when reused.
func TestMapCachePrunesRemoved(t *testing.T) {
	base := testName(t)
	fds := openFDs(t)
	c := NewMapCache(8)
	defer c.Close()
	at := releaseNew(t, c, base, 3, func(i int, s *Segment) {
		if i == 2 {
			if err := ProtectReadOnly(s.Data()); err != nil {
				t.Fatal(err)
			}
		}
	})
	if err := os.Remove(filepath.Join(ShmDir, userPrefix()+base+"-0")); err != nil {
		t.Fatal(err)
	}
	// The next opening lets go of it.
	s, err := c.OpenSegment(base + "-2")
	if err != nil {
		t.Fatal(err)
	}
	if c.Idle() != 1 || mapped(t, at[0]) || !mapped(t, at[1]) || start(s) != at[2] {
		t.Fatalf("after an opening: %d idle, removed file's mapping there %v, the other's %v, reopened on the idle mapping %v; want 1, false, true, true",
			c.Idle(), mapped(t, at[0]), mapped(t, at[1]), start(s) == at[2])
	}
	s.Data()[0] = 'w' // faults if still read-only
	if err := os.Remove(filepath.Join(ShmDir, userPrefix()+base+"-1")); err != nil {
		t.Fatal(err)
	}
	// And the next Release.
	if err := c.Release(s); err != nil {
		t.Fatal(err)
	}
	if c.Idle() != 1 || mapped(t, at[1]) {
		t.Fatalf("after a Release: %d idle, removed file's mapping there %v; want 1, false", c.Idle(), mapped(t, at[1]))
	}
	if n := openFDs(t) - fds; n != 1 {
		t.Fatalf("%d descriptors more with 1 idle mapping (the removed files' closed)", n)
	}
}
