//go:build linux

package shm

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fileOf stats the file at path, or fails the test.
func fileOf(t *testing.T, path string) fileID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return statID(&st)
}

// TestMappingOf: memory inside a named or file-backed segment's data
// area is found with the segment's name or path, its file's identity, its
// ID and the offset; anything else is ErrNotInSegment.
func TestMappingOf(t *testing.T) {
	name := testName(t)
	s, err := CreateSegment(name, 10000, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	id := fileOf(t, filepath.Join(ShmDir, s.file))
	want := Mapping{Name: name, Dev: id.dev, Ino: id.ino, ID: s.ID(), Offset: 100, Size: s.Size()}
	if m, err := MappingOf(s.Data()[100:200]); err != nil || m != want {
		t.Errorf("MappingOf in a created segment: %+v, %v; want %+v", m, err, want)
	}
	// The same file mapped again by OpenSegment: its own mapping, the
	// same identity.
	o, err := OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	want.Offset = o.Size() - 8
	if m, err := MappingOf(o.Data()[o.Size()-8:]); err != nil || m != want {
		t.Errorf("MappingOf in an opened segment: %+v, %v; want %+v", m, err, want)
	}
	o.Close()
	if _, err := MappingOf(s.Data()[:1]); err != nil {
		t.Errorf("closing another mapping of the file dropped this one: %v", err)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	f, err := CreateFileSegment(path, 5000, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fid := fileOf(t, path)
	if m, err := MappingOf(f.Data()); err != nil || m != (Mapping{Path: path, Dev: fid.dev, Ino: fid.ino, ID: f.ID(), Size: f.Size()}) {
		t.Errorf("MappingOf in a file-backed segment: %+v, %v", m, err)
	}

	mfd, err := CreateMemfd("mapping", 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mfd.Close()
	gone, err := CreateSegment(name+"-gone", 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	goneData := gone.Data()
	gone.Close()
	for what, b := range map[string][]byte{
		"a Go slice":            make([]byte, 64),
		"a memfd segment":       mfd.Data(),
		"a segment's header":    s.mem[:HeaderSize],
		"a header and its data": s.mem[HeaderSize-1 : HeaderSize+1],
		"no bytes":              s.Data()[:0],
		// Only its address is looked at: its memory is gone.
		"a closed segment": goneData,
	} {
		if m, err := MappingOf(b); !errors.Is(err, ErrNotInSegment) {
			t.Errorf("MappingOf(%s): %+v, %v; want ErrNotInSegment", what, m, err)
		}
	}
}

// TestMappingOfRepaired: RepairSegment's segments are found too, made or
// opened.
func TestMappingOfRepaired(t *testing.T) {
	name := testName(t)
	s, err := RepairSegment(name, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m, err := MappingOf(s.Data()); err != nil || m.Name != name {
		t.Errorf("a segment RepairSegment made: %+v, %v", m, err)
	}
	o, err := RepairSegment(name, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if m, err := MappingOf(o.Data()); err != nil || m.Name != name {
		t.Errorf("a segment RepairSegment opened: %+v, %v", m, err)
	}
}

// TestMappingOfConcurrent: lookups race with segments made and closed in
// other goroutines (run with -race); each goroutine's own segment is
// always found, and never after its Close (its address may be another
// goroutine's segment by then; only its address is looked at).
func TestMappingOfConcurrent(t *testing.T) {
	name := testName(t)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				own := name + "-" + string(rune('a'+g))
				s, err := CreateSegment(own, 4096, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if m, err := MappingOf(s.Data()[i:]); err != nil || m.Offset != i {
					t.Errorf("goroutine %d: %+v, %v", g, m, err)
				}
				d := s.Data()
				s.Close()
				if m, err := MappingOf(d); err == nil && m.Name == own {
					t.Errorf("goroutine %d: found after Close: %+v", g, m)
				}
			}
		})
	}
	wg.Wait()
}
