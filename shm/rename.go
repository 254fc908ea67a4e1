//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// RenameSegment gives this user's named segment old the name name, if no
// open Segment holds it, in this process or any other, and returns it
// open under its new name. Every open Segment holds its file locked
// shared for as long as it is open (see Segment); RenameSegment takes the
// lock exclusively, without waiting: if anyone holds it, it fails with an
// error wrapping ErrLocked and changes nothing. So no mapping of the
// segment exists while it is renamed, and whoever opens old after it
// finds none (os.ErrNotExist): a name never comes to name other bytes
// for a holder that found the segment under it. (Only Segments that hold
// the lock count: one made by CreateSegment, OpenSegment, RepairSegment
// or this function. A segment file mapped otherwise, say with
// OpenFileSegment on a path in ShmDir, or one whose UnlinkIfLast found
// other holders, holds none.)
//
// name must be free: taken (or made under another file, see
// CreateSegment), the error wraps os.ErrExist and old keeps its name. old
// must be at its own file, not one made because another user's file was
// in the way; such a segment is never renamed (an error wrapping
// ErrLocked). A missing old wraps os.ErrNotExist.
func RenameSegment(old, name string) (*Segment, error) {
	return renameSegment(old, name, 0, nil)
}

// ReuseSegment is RenameSegment that makes old, a segment of size data
// bytes (as CreateSegment(old, size) made it; another size is an error
// and changes nothing), what CreateSegment(name, size) would make: its
// data zeroed and its header made anew (a new ID, this process its
// creator), all before the new name is given, without the kernel
// allocating and zeroing pages again. That is its use: a segment nobody
// needs any more made a new one. (Like a segment created with
// SegmentConfig.Keep, its Close does not unlink it.) If the rename fails
// after the zeroing,
// old keeps its name, zeroed: a crash never leaves old bytes under name.
func ReuseSegment(old, name string, size int) (*Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	return renameSegment(old, name, size, nil)
}

// renameSegment is RenameSegment, and ReuseSegment if size > 0, with an
// idle mapping of old's file from c if it has one (c may be nil).
func renameSegment(old, name string, size int, c *MapCache) (*Segment, error) {
	if err := checkName(old); err != nil {
		return nil, err
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if _, ok := liveAlt(old); ok {
		return nil, fmt.Errorf("shm: rename segment %s: made in another file: %w", old, ErrLocked)
	}
	if _, ok := liveAlt(name); ok {
		return nil, &os.PathError{Op: "rename segment", Path: name, Err: unix.EEXIST}
	}
	file := userPrefix() + old
	path := filepath.Join(ShmDir, file)
	newFile := userPrefix() + name
	newPath := filepath.Join(ShmDir, newFile)
	if _, err := os.Lstat(newPath); err == nil {
		// Taken (checked again, atomically, by the rename itself).
		return nil, &os.PathError{Op: "rename segment", Path: newPath, Err: unix.EEXIST}
	}
	// A fresh open file description holds no lock of ours: taking it
	// exclusively fails if any Segment (any descriptor, this process's
	// too) holds the file, and blocks nobody for long (only openers,
	// which then find the name gone or another file under it).
	s, err := openLocked(path, unix.LOCK_EX|unix.LOCK_NB, c)
	if errors.Is(err, errReplaced) {
		// Renamed or removed by another before we held it.
		return nil, &os.PathError{Op: "rename segment", Path: path, Err: unix.ENOENT}
	}
	if err != nil {
		return nil, fmt.Errorf("shm: rename segment %s: %w", old, err)
	}
	if size > 0 {
		if total := pageAlign(HeaderSize + size); len(s.mem) != total {
			s.Close()
			return nil, fmt.Errorf("shm: reuse segment %s of %d bytes as one of %d", old, len(s.mem)-HeaderSize, total-HeaderSize)
		}
		// Fault the pages in for writing in one call (they exist: no
		// allocation, no zeroing by the kernel), then zero them. An
		// idle mapping from c has them.
		if !s.adopted {
			_ = unix.Madvise(s.mem, unix.MADV_POPULATE_WRITE)
		}
		clear(s.mem[HeaderSize:])
		s.initHeader(len(s.mem))
		s.commit()
	}
	if renameHook != nil {
		renameHook("held")
	}
	if err := unix.Renameat2(unix.AT_FDCWD, path, unix.AT_FDCWD, newPath, unix.RENAME_NOREPLACE); err != nil {
		s.Close()
		return nil, &os.PathError{Op: "rename segment", Path: newPath, Err: err}
	}
	// Shared again, as every holder. flock(2) does not promise that a
	// conversion is atomic; Linux removes the exclusive lock and adds
	// the shared one under the file's lock list's lock, so no other
	// lock comes between.
	if err := unix.Flock(s.fd, unix.LOCK_SH); err != nil {
		s.Close()
		return nil, fmt.Errorf("shm: rename segment %s: lock: %w", newPath, err)
	}
	s.name, s.file = name, newFile
	return published(s, nil)
}

// renameHook, if set, is called by RenameSegment while it holds the file
// exclusively, before the rename: tests open the old name there.
var renameHook func(step string)
