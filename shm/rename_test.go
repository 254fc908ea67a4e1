//go:build linux

package shm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// renameFixture creates a segment old, fills it and closes it, and
// returns it, a free name and the bytes written.
func renameFixture(t *testing.T) (old, name string, want []byte) {
	t.Helper()
	old, name = testName(t)+"-old", testName(t)+"-new"
	for _, n := range []string{old, name} {
		path := filepath.Join(ShmDir, userPrefix()+n)
		t.Cleanup(func() { os.Remove(path) })
	}
	s, err := CreateSegment(old, 3*4096, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	want = bytes.Repeat([]byte("recycled"), s.Size()/8)
	copy(s.Data(), want)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return old, name, want
}

func TestRenameSegment(t *testing.T) {
	for _, zero := range []bool{false, true} {
		t.Run(map[bool]string{false: "keep", true: "zero"}[zero], func(t *testing.T) {
			old, name, want := renameFixture(t)
			before, err := OpenSegment(old)
			if err != nil {
				t.Fatal(err)
			}
			id := before.ID()
			before.Close()
			rename := func() (*Segment, error) { return RenameSegment(old, name) }
			if zero {
				rename = func() (*Segment, error) { return ReuseSegment(old, name, 3*4096) }
			}
			s, err := rename()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Name() != name {
				t.Fatalf("renamed segment's name %q, want %q", s.Name(), name)
			}
			if _, err := OpenSegment(old); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("OpenSegment(old) after the rename: %v, want os.ErrNotExist", err)
			}
			o, err := OpenSegment(name)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			if zero {
				want = make([]byte, len(want))
				if o.ID() == id {
					t.Fatalf("a zeroed segment kept its ID %#x", id)
				}
				if o.Creator() != Self() {
					t.Fatalf("a zeroed segment's creator is %v, want this process", o.Creator())
				}
			} else if o.ID() != id {
				t.Fatalf("a renamed segment's ID changed from %#x to %#x", id, o.ID())
			}
			if !bytes.Equal(o.Data(), want) {
				t.Fatalf("data under the new name is not what it should be (zero=%v)", zero)
			}
			// The returned segment holds its lock: it cannot be renamed
			// again while open.
			if _, err := RenameSegment(name, old); !errors.Is(err, ErrLocked) {
				t.Fatalf("renaming a segment held open: %v, want ErrLocked", err)
			}
		})
	}
}

// A segment held by an open Segment, in this process or another (mapped
// with its descriptor closed too), is not renamed, and keeps its name
// and bytes; once the holder is gone it is.
func TestRenameSegmentInUse(t *testing.T) {
	check := func(t *testing.T, old, name string, want []byte) {
		t.Helper()
		if _, err := ReuseSegment(old, name, 3*4096); !errors.Is(err, ErrLocked) {
			t.Fatalf("ReuseSegment of a held segment: %v, want ErrLocked", err)
		}
		s, err := OpenSegment(old)
		if err != nil {
			t.Fatalf("the held segment under its name after a refused rename: %v", err)
		}
		defer s.Close()
		if !bytes.Equal(s.Data(), want) {
			t.Fatal("a refused rename changed the segment's bytes")
		}
		if _, err := OpenSegment(name); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the new name after a refused rename: %v, want os.ErrNotExist", err)
		}
	}
	t.Run("this process", func(t *testing.T) {
		old, name, want := renameFixture(t)
		h, err := OpenSegment(old)
		if err != nil {
			t.Fatal(err)
		}
		check(t, old, name, want)
		h.Close()
		s, err := RenameSegment(old, name)
		if err != nil {
			t.Fatalf("rename once the holder closed: %v", err)
		}
		s.Close()
	})
	for _, hold := range []string{"segment", "map"} {
		t.Run("another process/"+hold, func(t *testing.T) {
			old, name, want := renameFixture(t)
			holder := startHolder(t, old, hold)
			check(t, old, name, want)
			kill(t, holder)
			s, err := RenameSegment(old, name)
			if err != nil {
				t.Fatalf("rename once the holder died: %v", err)
			}
			s.Close()
		})
	}
}

// An opener that comes while RenameSegment holds the file finds the old
// name gone, never the renamed (zeroed) segment under it.
func TestRenameSegmentOpenerMeanwhile(t *testing.T) {
	old, name, _ := renameFixture(t)
	got := make(chan error, 1)
	renameHook = func(step string) {
		go func() {
			s, err := OpenSegment(old)
			if err == nil {
				s.Close()
			}
			got <- err
		}()
		waitParked(t, 1, "syscall", "shm.openLocked(", "unix.Flock(")
	}
	defer func() { renameHook = nil }()
	s, err := ReuseSegment(old, name, 3*4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := <-got; !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an opener during the rename: %v, want os.ErrNotExist", err)
	}
}

func TestRenameSegmentRefusals(t *testing.T) {
	t.Run("name taken", func(t *testing.T) {
		old, name, want := renameFixture(t)
		taken, err := CreateSegment(name, 4096, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		if _, err := RenameSegment(old, name); !errors.Is(err, os.ErrExist) {
			t.Fatalf("rename onto a taken name: %v, want os.ErrExist", err)
		}
		s, err := OpenSegment(old)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !bytes.Equal(s.Data(), want) {
			t.Fatal("a refused rename (without zero) changed the segment")
		}
	})
	t.Run("name taken meanwhile", func(t *testing.T) {
		// Past the early check, the rename itself refuses to replace.
		old, name, _ := renameFixture(t)
		var taken *Segment
		renameHook = func(string) {
			var err error
			if taken, err = CreateSegment(name, 4096, nil); err != nil {
				t.Error(err)
			}
		}
		defer func() { renameHook = nil }()
		if _, err := ReuseSegment(old, name, 3*4096); !errors.Is(err, os.ErrExist) {
			t.Fatalf("reuse onto a name taken meanwhile: %v, want os.ErrExist", err)
		}
		if taken != nil {
			taken.Close()
		}
		s, err := OpenSegment(old)
		if err != nil {
			t.Fatalf("old after a refused reuse: %v", err)
		}
		defer s.Close()
		if !bytes.Equal(s.Data(), make([]byte, s.Size())) {
			t.Fatal("a reuse refused at the rename left old unzeroed")
		}
	})
	t.Run("another size", func(t *testing.T) {
		old, name, want := renameFixture(t)
		if _, err := ReuseSegment(old, name, 2*4096); err == nil {
			t.Fatal("a segment of 3 pages was reused as one of 2")
		}
		s, err := OpenSegment(old)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !bytes.Equal(s.Data(), want) {
			t.Fatal("a refused reuse changed the segment")
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, err := ReuseSegment(testName(t), testName(t)+"-new", 4096); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("rename of no segment: %v, want os.ErrNotExist", err)
		}
	})
	t.Run("bad names", func(t *testing.T) {
		if _, err := RenameSegment("../x", "y"); err == nil {
			t.Fatal("a bad old name was taken")
		}
		if _, err := RenameSegment(testName(t), "a/b"); err == nil {
			t.Fatal("a bad new name was taken")
		}
	})
}
