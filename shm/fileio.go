//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// What the fs package needs from the kernel to load large files: a file's
// identity and file system, read-ahead and paging hints, O_DIRECT, and
// the last holder of a shared copy removing it. The system calls live
// here, as every other one of ubkit's (see STYLE.md).

// StatFile returns f's identity, size, times and file system type.
func StatFile(f *os.File) (FileStat, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return FileStat{}, &os.PathError{Op: "fstat", Path: f.Name(), Err: err}
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return FileStat{}, &os.PathError{Op: "fstatfs", Path: f.Name(), Err: err}
	}
	return FileStat{
		Dev: uint64(st.Dev), Ino: st.Ino, Size: st.Size,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(),
		Mode: st.Mode, FSType: int64(fs.Type),
	}, nil
}

// Advise gives the kernel hint a for b, memory this process mapped
// (a segment's Data or a file mapping); b must start on a page.
func Advise(b []byte, a Advice) error {
	if len(b) == 0 {
		return nil
	}
	adv := -1
	switch a {
	case AdviseNormal:
		adv = unix.MADV_NORMAL
	case AdviseSequential:
		adv = unix.MADV_SEQUENTIAL
	case AdviseRandom:
		adv = unix.MADV_RANDOM
	case AdviseWillNeed:
		adv = unix.MADV_WILLNEED
	case AdviseDontNeed:
		adv = unix.MADV_DONTNEED
	case AdviseHugePage:
		adv = unix.MADV_HUGEPAGE
	case AdvisePopulateRead:
		adv = unix.MADV_POPULATE_READ
	case AdvisePopulateWrite:
		adv = unix.MADV_POPULATE_WRITE
	}
	if adv < 0 {
		return fmt.Errorf("shm: madvise %v: not a hint for memory", a)
	}
	if err := unix.Madvise(b, adv); err != nil {
		if (a == AdvisePopulateRead || a == AdvisePopulateWrite) && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)) {
			return fmt.Errorf("shm: madvise %v: %w", a, errors.ErrUnsupported)
		}
		return fmt.Errorf("shm: madvise %v: %w", a, err)
	}
	return nil
}

// AdviseFile gives the kernel hint a for bytes [off, off+n) of f (n 0:
// to the end), posix_fadvise(2). AdviseDontNeed drops the range's clean
// pages from the page cache, which needs no privilege: it is how a cold
// read is measured without root.
func AdviseFile(f *os.File, off, n int64, a Advice) error {
	adv := -1
	switch a {
	case AdviseNormal:
		adv = unix.FADV_NORMAL
	case AdviseSequential:
		adv = unix.FADV_SEQUENTIAL
	case AdviseRandom:
		adv = unix.FADV_RANDOM
	case AdviseWillNeed:
		adv = unix.FADV_WILLNEED
	case AdviseDontNeed:
		adv = unix.FADV_DONTNEED
	case AdviseNoReuse:
		adv = unix.FADV_NOREUSE
	}
	if adv < 0 {
		return fmt.Errorf("shm: fadvise %v: not a hint for files", a)
	}
	if err := unix.Fadvise(int(f.Fd()), off, n, adv); err != nil {
		return &os.PathError{Op: "fadvise " + a.String(), Path: f.Name(), Err: err}
	}
	return nil
}

// OpenDirect opens path for reading with O_DIRECT: reads bypass the page
// cache, and need buffers, offsets and lengths aligned to the device's
// block (page-aligned memory such as a segment's Data, and multiples of
// 4 KiB, do). File systems without O_DIRECT (tmpfs) fail with EINVAL.
func OpenDirect(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open O_DIRECT", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// CachedPages says how many of the pages of f's first n bytes are in
// the page cache, and how many pages that is (cachestat(2), Linux 6.5
// and later; older kernels fail with ENOSYS).
func CachedPages(f *os.File, n int64) (cached, pages int64, err error) {
	if n <= 0 {
		return 0, 0, nil
	}
	var st unix.Cachestat_t
	if err := unix.Cachestat(uint(f.Fd()), &unix.CachestatRange{Off: 0, Len: uint64(n)}, &st, 0); err != nil {
		return 0, 0, &os.PathError{Op: "cachestat", Path: f.Name(), Err: err}
	}
	p := int64(os.Getpagesize())
	return int64(st.Cache), (n + p - 1) / p, nil
}

// ProtectReadOnly makes b, memory of a segment this process mapped,
// read-only in this process (mprotect): a write to it then faults
// instead of changing what other processes read. b must start on a page;
// its last page is protected whole.
func ProtectReadOnly(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.Mprotect(b, unix.PROT_READ); err != nil {
		return fmt.Errorf("shm: mprotect: %w", err)
	}
	return nil
}

// UnlinkIfLast removes the segment's name if no other open Segment in
// any process holds it (each holds a shared lock on its file, see
// Segment), and reports whether it did. Openers that found the file
// meanwhile wait for the decision and then, finding it removed, get an
// error wrapping os.ErrNotExist, as if it had never been there: a
// reference count across processes that a dying process cannot leak.
// The Segment stays mapped; Close it after. Whatever the answer, it no
// longer holds its shared lock.
func (s *Segment) UnlinkIfLast() (bool, error) {
	if s.closed.Load() || s.fd < 0 {
		return false, errors.New("shm: UnlinkIfLast on a closed segment")
	}
	if err := unix.Flock(s.fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("shm: lock %s: %w", s.name, err)
	}
	if err := s.Unlink(); err != nil {
		return false, err
	}
	// The lock goes with Close; until then openers blocked on it wait,
	// and find the name gone.
	return true, nil
}

// OpenNonblock is O_NONBLOCK for os.OpenFile and os.Root.OpenFile: an
// open of a FIFO or a device that would wait does not (a server opening
// names a client gave checks, after, that it opened a regular file).
const OpenNonblock = unix.O_NONBLOCK

// RemoveUnheld removes this user's named segments whose names start with
// prefix and that no open Segment holds (each holds a shared lock on its
// file while open), if removable approves the first bytes of the
// segment's data area (up to n, read while this holds the file locked
// exclusively, so that no opener gets in meanwhile: one that was waiting
// finds the name gone). It returns the names it removed. It is for
// segments that are meant to live only while held (a host-wide copy of a
// file's content) and whose last holder died instead of removing them;
// removable tells a segment whose creator is still setting it up (no
// lock yet) from an abandoned one.
func RemoveUnheld(prefix string, n int, removable func(head []byte) bool) ([]string, error) {
	if err := checkName(prefix); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(ShmDir)
	if err != nil {
		return nil, err
	}
	own := userPrefix()
	var removed []string
	for _, e := range entries {
		file := e.Name()
		if !strings.HasPrefix(file, own+prefix) {
			continue
		}
		path := filepath.Join(ShmDir, file)
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		var st, now unix.Stat_t
		if unix.Fstat(fd, &st) == nil && ownRegular(&st) && unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil &&
			unix.Lstat(path, &now) == nil && statID(&now) == statID(&st) {
			head := make([]byte, n)
			k, _ := unix.Pread(fd, head, HeaderSize)
			var magic [8]byte
			if m, _ := unix.Pread(fd, magic[:], segOffMagic); m == len(magic) && binary.LittleEndian.Uint64(magic[:]) == segMagic &&
				removable(head[:max(k, 0)]) && unix.Unlink(path) == nil {
				removed = append(removed, strings.TrimPrefix(file, own))
			}
		}
		unix.Close(fd)
	}
	return removed, nil
}

// FreeSpace is the room left in ShmDir (statfs: blocks available to
// this user): a segment larger than it would fail, once touched, with
// SIGBUS.
func FreeSpace() (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(ShmDir, &st); err != nil {
		return 0, &os.PathError{Op: "statfs", Path: ShmDir, Err: err}
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
