//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// File-backed segments: the same Segment, with its header, mapped from a
// file in a directory of the caller's choice rather than from /dev/shm, so
// that its data outlives a reboot once it is synced (Sync, SyncAll).
// Writes through the mapping reach the page cache at once: every process
// that maps the file sees them, and they survive the death of every
// process; only a crash of the machine loses what was not synced.

// CheckDir checks that dir may hold file-backed segments: an existing
// directory (not a symbolic link) owned by the effective user that group
// and others cannot write to, so that nobody else can put, swap or remove
// files in it.
func CheckDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return &os.PathError{Op: "check segment directory", Path: dir, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("shm: %s is not a directory (a symbolic link is refused too: name the directory itself)", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("shm: directory %s belongs to uid %d, not to this user (%d): make one of your own for file-backed segments", dir, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return fmt.Errorf("shm: directory %s has mode %#o: group or others may write to it; chmod go-w it", dir, st.Mode&0o7777)
	}
	return nil
}

// CreateFileSegment creates a segment of at least size data bytes backed
// by a new file at path, mode 0600, made with O_EXCL and O_NOFOLLOW in a
// directory that passes CheckDir. It fails with an error wrapping
// os.ErrExist if the file exists. The file's blocks are allocated
// before it is mapped: a full disk is an error wrapping ENOSPC here, never
// a fault when the segment is written. The file stays when the segment is
// closed (opts.Keep is implied): Unlink removes it. A creator that dies
// before CreateFileSegment returns may leave a file without a header,
// which OpenFileSegment reports as ErrNoHeader. A relative or unclean
// path is made absolute and clean first (filepath.Abs): the segment keeps
// that (MappingOf's Path), which other processes can open.
func CreateFileSegment(path string, size int, opts *SegmentConfig) (*Segment, error) {
	path, err := absPath(path)
	if err != nil {
		return nil, err
	}
	if opts == nil {
		opts = &SegmentConfig{}
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	if err := CheckDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	total := pageAlign(HeaderSize + size)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, &os.PathError{Op: "create file segment", Path: path, Err: err}
	}
	// Locked while it is made: RepairFileSegment takes over a file
	// without a header only from a creator that holds no lock on it.
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			// A repairer took it over between our open and our lock.
			return nil, &os.PathError{Op: "create file segment", Path: path, Err: unix.EEXIST}
		}
		unix.Unlink(path)
		return nil, &os.PathError{Op: "lock file segment", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != 0 {
		// Taken over and made by a repairer before our lock.
		unix.Close(fd)
		return nil, &os.PathError{Op: "create file segment", Path: path, Err: unix.EEXIST}
	}
	if err := allocate(fd, total); err != nil {
		unix.Close(fd)
		unix.Unlink(path)
		return nil, &os.PathError{Op: "allocate file segment", Path: path, Err: err}
	}
	s, err := newNamed(fd, path, total, opts)
	if err != nil {
		return nil, err
	}
	s.name, s.path, s.created, s.keep = filepath.Base(path), path, true, true
	s.initHeader(total)
	s.commit()
	unix.Flock(s.fd, unix.LOCK_UN)
	return published(s, nil)
}

// RepairFileSegment is OpenFileSegment, but for a file without a header
// yet (ErrNoHeader) whose creator no longer makes it (a creator holds a
// lock on the file while it does; if one is held, ErrLocked): it makes
// the segment in that file as CreateFileSegment would have, with size
// data bytes allocated and this process as its creator. Nothing was ever
// written in such a segment. The caller must know that the file should be
// a segment (it was counted as made by a creator that died, say).
func RepairFileSegment(path string, size int, opts *SegmentConfig) (*Segment, error) {
	path, err := absPath(path)
	if err != nil {
		return nil, err
	}
	s, err := OpenFileSegment(path)
	if !errors.Is(err, ErrNoHeader) {
		return s, err
	}
	if opts == nil {
		opts = &SegmentConfig{}
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	fd, err := openChecked(path)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("shm: repair %s: its creator is making it: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("shm: repair %s: %w", path, err)
	}
	// Under the lock, look again: its creator may have finished.
	var magic [8]byte
	if n, _ := unix.Pread(fd, magic[:], segOffMagic); n == len(magic) && magic != [8]byte{} {
		unix.Close(fd)
		return OpenFileSegment(path)
	}
	total := pageAlign(HeaderSize + size)
	err = allocate(fd, total)
	if err == nil {
		err = unix.Ftruncate(fd, int64(total))
	}
	if err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "repair file segment", Path: path, Err: err}
	}
	s, err = mapSegment(fd, total, opts.HugePages, opts.Populate)
	if err != nil {
		return nil, err
	}
	s.name, s.path, s.created, s.keep = filepath.Base(path), path, true, true
	s.initHeader(total)
	s.commit()
	unix.Flock(s.fd, unix.LOCK_UN)
	return published(s, nil)
}

// absPath is path made absolute and clean, as a file-backed segment
// keeps it: what another process (whose working directory is its own)
// opens, and what Unlink removes after a change of directory.
func absPath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", &os.PathError{Op: "file segment", Path: path, Err: err}
	}
	return abs, nil
}

// openChecked opens the file at path for a file segment (O_NOFOLLOW), if
// it is a regular file of the effective user with one name and mode
// 0600; a file removed since its open is os.ErrNotExist.
func openChecked(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open file segment", Path: path, Err: err}
	}
	if f := testFileOpened.Load(); f != nil {
		(*f)(path)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("shm: open %s: %w", path, err)
	}
	switch {
	case st.Nlink == 0:
		// Removed since it was opened: as if the open had come later.
		unix.Close(fd)
		return -1, &os.PathError{Op: "open file segment", Path: path, Err: unix.ENOENT}
	case int(st.Uid) != os.Geteuid() || st.Nlink != 1:
		unix.Close(fd)
		return -1, fmt.Errorf("shm: open %s: owned by uid %d with %d names; ubkit maps only this user's files with one name: %w", path, st.Uid, st.Nlink, ErrCorrupt)
	case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o077 != 0:
		unix.Close(fd)
		return -1, fmt.Errorf("shm: open %s: mode %#o; ubkit maps only regular files of mode 0600: %w", path, st.Mode&0o7777, ErrCorrupt)
	}
	return fd, nil
}

// allocate gives the file fd its total bytes of disk now (fallocate), so
// that a full disk is an error here rather than a SIGBUS (fatal in Go) at
// the first write to a page of a sparse file through the mapping. A file
// system without fallocate gets zeros written instead.
func allocate(fd, total int) error {
	err := unix.Fallocate(fd, 0, 0, int64(total))
	if !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	zero := make([]byte, 64<<10)
	for off := 0; off < total; off += len(zero) {
		n := min(len(zero), total-off)
		if _, err := unix.Pwrite(fd, zero[:n], int64(off)); err != nil {
			return err
		}
	}
	return nil
}

// OpenFileSegment maps the file-backed segment at path after the checks
// OpenSegment makes: the file is opened with O_NOFOLLOW and must be a
// regular file of the effective user with one name and mode 0600 (no
// permission for group or others), and its header must be valid (a
// file without one yet is ErrNoHeader).
func OpenFileSegment(path string) (*Segment, error) {
	path, err := absPath(path)
	if err != nil {
		return nil, err
	}
	fd, err := openChecked(path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	var magic [8]byte
	if st.Size < HeaderSize {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: %d bytes: %w", path, st.Size, ErrNoHeader)
	}
	if n, err := unix.Pread(fd, magic[:], segOffMagic); err != nil || n != len(magic) {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: reading its magic: %d bytes, %v: %w", path, n, err, ErrCorrupt)
	}
	if magic == [8]byte{} {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: %w", path, ErrNoHeader)
	}
	s, err := mapExisting(fd)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	s.name, s.path = filepath.Base(path), path
	return published(s, nil)
}

// testFileOpened, if set, is called by OpenFileSegment between the open
// and the checks: a test removes the file there.
var testFileOpened atomic.Pointer[func(path string)]

// ErrNoHeader is the error of OpenFileSegment on a file of this user, with
// one name and mode 0600, that holds no header yet: shorter than one, or
// with no magic (zero). Its creator is writing it this moment, or died
// before it finished (nothing was ever written in such a segment). It
// wraps ErrCorrupt; any other ErrCorrupt of OpenFileSegment is about a
// file ubkit would not have made so (another owner or mode, a second
// name, a damaged header).
var ErrNoHeader = fmt.Errorf("%w: a segment file without a header yet", ErrCorrupt)

// Sync writes the data bytes [off, off+n) of a file-backed segment to its
// file and waits for the disk (msync MS_SYNC, from the page that holds off;
// with the file's size, as fdatasync does). On a segment in /dev/shm it
// costs a system call and does nothing more.
func (s *Segment) Sync(off, n int) error {
	d := s.Data()
	if off < 0 || n < 0 || off > len(d)-n {
		return fmt.Errorf("shm: sync of [%d, %d) outside a segment of %d bytes", off, off+n, len(d))
	}
	if n == 0 {
		return nil
	}
	start := (HeaderSize + off) &^ (os.Getpagesize() - 1)
	if err := unix.Msync(s.mem[start:HeaderSize+off+n], unix.MS_SYNC); err != nil {
		return fmt.Errorf("shm: msync %s: %w", s.name, err)
	}
	return nil
}

// SyncAll writes the whole segment, header included, to its file and
// waits for the disk (fdatasync).
func (s *Segment) SyncAll() error {
	if err := unix.Fdatasync(s.fd); err != nil {
		return fmt.Errorf("shm: fdatasync %s: %w", s.name, err)
	}
	return nil
}

// SyncDir makes the names in dir durable (fsync of the directory): a
// file created or removed there survives a crash of the machine only after
// it.
func SyncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return &os.PathError{Op: "sync directory", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return &os.PathError{Op: "sync directory", Path: dir, Err: err}
	}
	return nil
}

// ErrLocked is the error of TryLockFile on a file another holder locks.
var ErrLocked = errors.New("shm: file locked by another process")

// LockFile takes a shared lock (flock) on f, waiting while someone holds
// it exclusively. The lock goes when f is closed, or when its process
// dies.
func LockFile(f *os.File) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		return fmt.Errorf("shm: lock %s: %w", f.Name(), err)
	}
	return nil
}

// TryLockFile takes an exclusive lock (flock) on f without waiting: it
// fails with ErrLocked if any other open file description holds a lock on
// it, which tells the caller that a live process uses the file.
func TryLockFile(f *os.File) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("shm: lock %s: %w", f.Name(), ErrLocked)
		}
		return fmt.Errorf("shm: lock %s: %w", f.Name(), err)
	}
	return nil
}

// TryLockFileShared takes a shared lock (flock) on f without waiting: it
// fails with ErrLocked if another open file description holds it
// exclusively.
func TryLockFileShared(f *os.File) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("shm: lock %s: %w", f.Name(), ErrLocked)
		}
		return fmt.Errorf("shm: lock %s: %w", f.Name(), err)
	}
	return nil
}

// UnlockFile drops f's lock.
func UnlockFile(f *os.File) error {
	if err := unix.Flock(int(f.Fd()), unix.LOCK_UN); err != nil {
		return fmt.Errorf("shm: unlock %s: %w", f.Name(), err)
	}
	return nil
}

// WritePrivateFile creates the file path (O_EXCL, O_NOFOLLOW, mode 0600)
// in a directory that passes CheckDir, writes data to it and makes both
// the file and its name durable (fsync of the file and the directory). It
// fails with an error wrapping os.ErrExist if the file exists; on any
// other failure it removes what it made.
func WritePrivateFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := CheckDir(dir); err != nil {
		return err
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return &os.PathError{Op: "create", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = SyncDir(dir)
	}
	if err != nil {
		unix.Unlink(path)
		return fmt.Errorf("shm: write %s: %w", path, err)
	}
	return nil
}

// OpenPrivateFile opens path for reading with O_NOFOLLOW, and returns it
// only if it is a regular file of the effective user with one name and
// mode 0600 (else an error wrapping ErrCorrupt).
func OpenPrivateFile(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() || st.Nlink != 1 || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: uid %d, %d names, mode %#o; only this user's regular files with one name and mode 0600 are trusted: %w", path, st.Uid, st.Nlink, st.Mode, ErrCorrupt)
	}
	return os.NewFile(uintptr(fd), path), nil
}
