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

// repairOK repairs segment name and checks that it has a header and at
// least size data bytes; it removes the segment when the test ends.
func repairOK(t *testing.T, name string, size int) *Segment {
	t.Helper()
	s, err := RepairSegment(name, size, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatalf("RepairSegment(%q): %v", name, err)
	}
	t.Cleanup(func() { s.Unlink(); s.Close() })
	if s.Size() < size || s.Name() != name {
		t.Fatalf("repaired segment %q of %d bytes, want %q of %d", s.Name(), s.Size(), name, size)
	}
	o, err := OpenSegment(name)
	if err != nil {
		t.Fatalf("OpenSegment(%q) after its repair: %v", name, err)
	}
	defer o.Close()
	if o.ID() != s.ID() || o.Creator() != Self() {
		t.Fatalf("opened segment %x by %v, repaired %x by %v", o.ID(), o.Creator(), s.ID(), Self())
	}
	return s
}

// plantOwn makes this user's predictable file for name with data, as a
// creator that died in CreateSegment leaves it.
func plantOwn(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(ShmDir, userPrefix()+name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	return path
}

func TestRepairSegmentMissing(t *testing.T) {
	name := testName(t)
	s := repairOK(t, name, 5000)
	copy(s.Data(), "kept")
	again := repairOK(t, name, 5000)
	if again.ID() != s.ID() || string(again.Data()[:4]) != "kept" {
		t.Fatalf("a good segment repaired again: id %x (was %x), %q", again.ID(), s.ID(), again.Data()[:4])
	}
	if _, err := CreateSegment(name, 5000, nil); !errors.Is(err, os.ErrExist) {
		t.Fatalf("creating over a repaired segment: %v, want ErrExist", err)
	}
}

func TestRepairSegmentEmpty(t *testing.T) {
	name := testName(t)
	plantOwn(t, name, nil)
	if _, err := OpenSegment(name); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("opening an empty file: %v, want ErrCorrupt", err)
	}
	repairOK(t, name, 100)
}

func TestRepairSegmentSizedWithoutHeader(t *testing.T) {
	name := testName(t)
	// Sized (ftruncate) and the rest of the header, but no magic yet.
	data := make([]byte, 2*HeaderSize)
	data[segOffVersion] = segVersion
	plantOwn(t, name, data)
	repairOK(t, name, HeaderSize)
}

func TestRepairSegmentLeavesDamagedHeader(t *testing.T) {
	name := testName(t)
	data := bytes.Repeat([]byte{0xa5}, 2*HeaderSize)
	path := plantOwn(t, name, data)
	if s, err := RepairSegment(name, 100, nil); !errors.Is(err, ErrCorrupt) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("repairing a file with a foreign magic: %v, want ErrCorrupt", err)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the damaged file was changed (%v)", err)
	}
}

func TestRepairSegmentErrLocked(t *testing.T) {
	name := testName(t)
	path := plantOwn(t, name, nil)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	// Past OpenSegment (which waits for the lock): the repair itself.
	if s, err := repairNamed(name, userPrefix()+name, false, 100, &SegmentConfig{}); !errors.Is(err, ErrLocked) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("repairing a file its creator is making: %v, want ErrLocked", err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 0 {
		t.Fatalf("the creator's file after a refused repair: %v, %v", st, err)
	}
}

// A creator between its O_EXCL open and its lock that finds the file
// repaired by then gives up with ErrExist and leaves the segment alone.
func TestCreateSegmentAfterRepairTookOver(t *testing.T) {
	name := testName(t)
	path := plantOwn(t, name, nil)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0) // the slow creator's
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	s := repairOK(t, name, 100)
	if err := lockNew(fd, path); !errors.Is(err, os.ErrExist) {
		t.Fatalf("the slow creator's lock: %v, want ErrExist", err)
	}
	o := repairOK(t, name, 100)
	if o.ID() != s.ID() {
		t.Fatalf("segment %x after the slow creator, want %x", o.ID(), s.ID())
	}
}

// Another user's file in the way, without a header: it is neither
// repaired nor trusted; the segment is made in an alternative file.
func TestRepairSegmentForeignFile(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	squat := plantForeign(t, name)
	before, err := os.ReadFile(squat)
	if err != nil {
		t.Fatal(err)
	}
	s := repairOK(t, name, 100)
	if s.file == userPrefix()+name {
		t.Fatalf("repaired in the other user's file %s", s.file)
	}
	var st unix.Stat_t
	if err := unix.Lstat(squat, &st); err != nil || st.Uid != foreignUID || st.Size != int64(len(before)) {
		t.Fatalf("the other user's file: owner %d, %d bytes, %v", st.Uid, st.Size, err)
	}
	if after, err := os.ReadFile(squat); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the other user's file was changed (%v)", err)
	}
}
