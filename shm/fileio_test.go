//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"
)

func TestUnlinkIfLast(t *testing.T) {
	name := testName(t)
	a, err := CreateSegment(name, 4096, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	// b holds the file: a is not the last.
	if last, err := a.UnlinkIfLast(); err != nil || last {
		t.Fatalf("UnlinkIfLast with another holder: %v, %v; want false", last, err)
	}
	a.Close()
	c, err := OpenSegment(name)
	if err != nil {
		t.Fatalf("the name went although another holder had it: %v", err)
	}
	if last, err := c.UnlinkIfLast(); err != nil || last {
		t.Fatalf("UnlinkIfLast with b open: %v, %v; want false", last, err)
	}
	c.Close()
	if last, err := b.UnlinkIfLast(); err != nil || !last {
		t.Fatalf("UnlinkIfLast of the last holder: %v, %v; want true", last, err)
	}
	if _, err := OpenSegment(name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open after the last holder removed it: %v, want ErrNotExist", err)
	}
	b.Close()
}

func TestStatFileAndAdvise(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, make([]byte, 3*4096), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := StatFile(f)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	if st.Size != 3*4096 || !st.IsRegular() || st.Ino == 0 || st.Mtime != fi.ModTime().UnixNano() || st.FSType == 0 {
		t.Errorf("StatFile = %+v, file %v", st, fi)
	}
	for _, a := range []Advice{AdviseSequential, AdviseWillNeed, AdviseDontNeed, AdviseNoReuse} {
		if err := AdviseFile(f, 0, 0, a); err != nil {
			t.Errorf("AdviseFile %v: %v", a, err)
		}
	}
	if err := AdviseFile(f, 0, 0, AdviseHugePage); err == nil {
		t.Error("AdviseFile took a hint for memory")
	}
}

func TestProtectReadOnly(t *testing.T) {
	s, err := CreateMemfd("ro", 2*4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := s.Data()
	d[0] = 7
	if err := Advise(d, AdviseWillNeed); err != nil {
		t.Fatal(err)
	}
	if err := Advise(d, AdvisePopulateRead); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		t.Fatal(err)
	}
	if err := Advise(d, AdvisePopulateWrite); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		t.Fatal(err)
	}
	if d[0] != 7 || d[4096] != 0 {
		t.Fatalf("read %d and %d after populating, want 7 and 0", d[0], d[4096])
	}
	if err := Advise(d, AdviseNoReuse); err == nil {
		t.Error("Advise took a hint for files")
	}
	if err := ProtectReadOnly(d); err != nil {
		t.Fatal(err)
	}
	if d[0] != 7 {
		t.Fatalf("read %d after protecting, want 7", d[0])
	}
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	faulted := func() (f bool) {
		defer func() { f = recover() != nil }()
		d[1] = 1
		return false
	}()
	if !faulted {
		t.Fatal("a write to protected memory did not fault")
	}
}

func TestRemoveUnheld(t *testing.T) {
	name := testName(t)
	held, err := CreateSegment(name+"-held", 4096, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { held.Unlink(); held.Close() }()
	for _, n := range []string{"-yes", "-no"} {
		s, err := CreateSegment(name+n, 4096, &SegmentConfig{Keep: true})
		if err != nil {
			t.Fatal(err)
		}
		copy(s.Data(), n)
		s.Close() // kept, held by nobody
	}
	removed, err := RemoveUnheld(name, 4, func(head []byte) bool { return string(head) == "-yes" })
	if err != nil || len(removed) != 1 || removed[0] != name+"-yes" {
		t.Fatalf("RemoveUnheld = %v, %v; want only %s-yes", removed, err, name)
	}
	for n, want := range map[string]bool{"-held": true, "-no": true, "-yes": false} {
		s, err := OpenSegment(name + n)
		if (err == nil) != want {
			t.Errorf("%s: open %v, want it there: %v", n, err, want)
		}
		if err == nil {
			if n == "-no" {
				s.Unlink()
			}
			s.Close()
		}
	}
}
