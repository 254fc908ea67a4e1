//go:build linux

package shm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestFileSegment(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	s, err := CreateFileSegment(path, 10000, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Size() < HeaderSize+10000 {
		t.Errorf("mode %v size %d, want 0600 and at least %d", st.Mode().Perm(), st.Size(), HeaderSize+10000)
	}
	if _, err := CreateFileSegment(path, 100, nil); !errors.Is(err, os.ErrExist) {
		t.Errorf("second create: %v, want ErrExist", err)
	}
	copy(s.Data()[5000:], "durable")
	if err := s.Sync(5000, 7); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncAll(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][2]int{{-1, 1}, {0, -1}, {s.Size() - 3, 4}, {s.Size() + 1, 0}} {
		if err := s.Sync(bad[0], bad[1]); err == nil {
			t.Errorf("Sync(%d, %d) outside the segment passed", bad[0], bad[1])
		}
	}
	// Another mapping sees the bytes; the file holds them after Close.
	o, err := OpenFileSegment(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(o.Data()[5000:5007], []byte("durable")) || o.ID() != s.ID() {
		t.Errorf("second mapping reads %q, id %x, want %x", o.Data()[5000:5007], o.ID(), s.ID())
	}
	o.Close()
	s.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw[HeaderSize+5000:HeaderSize+5007], []byte("durable")) {
		t.Error("the file does not hold what was written through the mapping")
	}
	// Close kept the file; Unlink removes it.
	o, err = OpenFileSegment(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Unlink(); err != nil {
		t.Fatal(err)
	}
	o.Close()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Unlink: %v", err)
	}
}

// TestFileSegmentRefused: files and directories someone else could have
// made or could change are refused.
func TestFileSegmentRefused(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	s, err := CreateFileSegment(good, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	open := func(name string) error {
		s, err := OpenFileSegment(filepath.Join(dir, name))
		if err == nil {
			s.Close()
		}
		return err
	}
	if err := open("good"); err != nil {
		t.Fatalf("a good file: %v", err)
	}
	if err := os.Symlink(good, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := open("link"); err == nil {
		t.Error("a symbolic link was opened")
	}
	if err := os.Link(good, filepath.Join(dir, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := open("hard"); !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNoHeader) {
		t.Errorf("a file with two names: %v, want ErrCorrupt, not ErrNoHeader", err)
	}
	os.Remove(filepath.Join(dir, "hard"))
	if err := os.Chmod(good, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := open("good"); !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNoHeader) {
		t.Errorf("a file of mode 0644: %v, want ErrCorrupt, not ErrNoHeader", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk"), make([]byte, 2*HeaderSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open("junk"); !errors.Is(err, ErrNoHeader) {
		t.Errorf("a file without a header: %v, want ErrNoHeader", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "short"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open("short"); !errors.Is(err, ErrNoHeader) {
		t.Errorf("a one-byte file: %v, want ErrNoHeader", err)
	}
	bad := make([]byte, 2*HeaderSize)
	bad[0] = 1 // a magic, not ubkit's
	if err := os.WriteFile(filepath.Join(dir, "badmagic"), bad, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := open("badmagic"); !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNoHeader) {
		t.Errorf("a file with a wrong magic: %v, want ErrCorrupt, not ErrNoHeader", err)
	}
	if err := open("missing"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v, want ErrNotExist", err)
	}

	open777 := filepath.Join(dir, "shared")
	if err := os.Mkdir(open777, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open777, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateFileSegment(filepath.Join(open777, "seg"), 100, nil); err == nil {
		t.Error("a segment was made in a directory everyone may write to")
	}
	if err := CheckDir(filepath.Join(dir, "link")); err == nil {
		t.Error("CheckDir passed a symbolic link to a file")
	}
	if err := os.Symlink(dir, filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := CheckDir(filepath.Join(dir, "dirlink")); err == nil {
		t.Error("CheckDir passed a symbolic link to a directory")
	}
	if err := CheckDir(dir); err != nil {
		t.Errorf("CheckDir of a private directory: %v", err)
	}
	if err := SyncDir(dir); err != nil {
		t.Errorf("SyncDir: %v", err)
	}
}

func TestLockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := LockFile(a); err != nil {
		t.Fatal(err)
	}
	if err := TryLockFile(b); !errors.Is(err, ErrLocked) {
		t.Fatalf("exclusive lock beside a shared one: %v, want ErrLocked", err)
	}
	a.Close()
	if err := TryLockFile(b); err != nil {
		t.Fatalf("exclusive lock once the shared one went: %v", err)
	}
	// The holder may turn its exclusive lock into a shared one.
	if err := LockFile(b); err != nil {
		t.Fatal(err)
	}
}

func TestPrivateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "conf")
	if err := WritePrivateFile(path, []byte("config")); err != nil {
		t.Fatal(err)
	}
	if err := WritePrivateFile(path, []byte("again")); !errors.Is(err, os.ErrExist) {
		t.Errorf("second write: %v, want ErrExist", err)
	}
	f, err := OpenPrivateFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 16)
	n, _ := f.Read(b)
	f.Close()
	if string(b[:n]) != "config" {
		t.Errorf("read %q", b[:n])
	}
	os.Chmod(path, 0o640)
	if _, err := OpenPrivateFile(path); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a file of mode 0640: %v, want ErrCorrupt", err)
	}
	os.Symlink(path, filepath.Join(dir, "link"))
	if f, err := OpenPrivateFile(filepath.Join(dir, "link")); err == nil {
		f.Close()
		t.Error("a symbolic link was opened")
	}
}

// TestFileSegmentRemovedWhileOpening: a file removed between its open and
// its checks (retention dropping a segment under a reader) is a file
// that does not exist, not a corrupt one: its one name is gone, and the
// one-name check used to say ErrCorrupt ("with 0 names"), which callers
// do not read as a dropped segment.
func TestFileSegmentRemovedWhileOpening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	s, err := CreateFileSegment(path, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	hook := func(p string) {
		if err := os.Remove(p); err != nil {
			t.Error(err)
		}
	}
	testFileOpened.Store(&hook)
	defer testFileOpened.Store(nil)
	s, err = OpenFileSegment(path)
	if err == nil {
		s.Close()
		t.Fatal("a removed file opened")
	}
	if !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("a file removed while opening: %v, want ErrNotExist", err)
	}
}

// TestRepairFileSegment: a file without a header is made a segment in
// place only if no creator holds its lock (one that is making it does);
// a good segment is opened as it is.
func TestRepairFileSegment(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seg")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A live creator, between its open and its header: it holds the lock.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if s, err := RepairFileSegment(path, 100, nil); !errors.Is(err, ErrLocked) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("repairing a file its creator is making: %v, want ErrLocked", err)
	}
	f.Close() // the creator died
	s, err := RepairFileSegment(path, 100, nil)
	if err != nil {
		t.Fatalf("repairing a file whose creator died: %v", err)
	}
	copy(s.Data(), "kept")
	s.Close()
	s, err = RepairFileSegment(path, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Data()[:4]) != "kept" {
		t.Fatalf("a good segment repaired again: %q", s.Data()[:4])
	}
	s.Close()
	if _, err := CreateFileSegment(path, 100, nil); !errors.Is(err, os.ErrExist) {
		t.Fatalf("creating over a repaired segment: %v, want ErrExist", err)
	}
}

// TestFileSegmentPathAbsolute: a file-backed segment made or opened by a
// relative or unclean path keeps its absolute, clean path, which another
// process (with a working directory of its own) can open, and Unlink
// removes the right file after a change of directory.
func TestFileSegmentPathAbsolute(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, p := range []string{"seg", "./x/../seg2", dir + "//seg3"} {
		want := filepath.Join(dir, filepath.Base(p))
		s, err := CreateFileSegment(p, 4096, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		o, err := OpenFileSegment(p)
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		for what, seg := range map[string]*Segment{"created": s, "opened": o} {
			m, err := MappingOf(seg.Data())
			if err != nil {
				t.Fatal(err)
			}
			if m.Path != want {
				t.Errorf("%s by %q: Path %q, want %q", what, p, m.Path, want)
			}
		}
	}
	// x does not exist: "./x/../seg2" is cleaned lexically, as
	// filepath.Abs does, before it is opened.
	s, err := OpenFileSegment("seg")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Chdir(t.TempDir())
	if err := s.Unlink(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "seg")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Unlink after a change of directory left the file: %v", err)
	}
}
