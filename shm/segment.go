//go:build linux

package shm

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NamePrefix starts the name of every named segment ubkit creates in /dev/shm.
const NamePrefix = "ubkit-"

// ShmDir is where named POSIX segments live.
var ShmDir = "/dev/shm"

// HeaderSize is the size of the header at the start of every segment. The
// data area that users see starts after it, page aligned.
const HeaderSize = 4096

const (
	segMagic   = 0x4745_5354_494b_4255 // "UBKITSEG" little endian
	segVersion = 1
)

// Segment header layout (little endian, first HeaderSize bytes):
//
//	0  magic    uint64
//	8  version  uint32
//	12 id       uint32  random, names the segment in pool handles
//	16 size     uint64  total size including the header
//	24 creator  uint64  pid<<32 | low 32 bits of the creator's start time
const (
	segOffMagic   = 0
	segOffVersion = 8
	segOffID      = 12
	segOffSize    = 16
	segOffCreator = 24
)

// openSegments counts segments mapped by this process; tests use it to find
// leaks.
var openSegments atomic.Int64

// SegmentConfig is the settings of a new segment (CreateSegment,
// CreateMemfd). The zero value is valid.
type SegmentConfig struct {
	// HugePages backs the segment with huge pages: MFD_HUGETLB for memfd
	// segments (needs pages reserved in /proc/sys/vm/nr_hugepages) and
	// transparent huge pages (madvise) for named segments.
	HugePages bool
	// Populate faults every page in at creation (MAP_POPULATE), so the first
	// pass over the segment does not pay a page fault per page.
	Populate bool
	// Keep leaves a named segment in /dev/shm when its creator closes it.
	// Someone must then Unlink it, or Sweep removes it once the creator has
	// died and no process has it mapped or open.
	Keep bool
}

// SegmentOptions is the old name of SegmentConfig.
//
// Deprecated: use SegmentConfig.
type SegmentOptions = SegmentConfig

// Segment is a mapped shared-memory segment: named (in /dev/shm) or anonymous
// (a memfd). The data area, Data, excludes the segment's own header.
//
// Ownership: the process that creates a named segment owns its name. Its
// Close unmaps the segment and unlinks the name (unless SegmentConfig.Keep),
// so peers that already mapped it keep working but nobody new can open it.
// A process that opened a segment by name, or received one over a unix
// socket, owns only its mapping: Close unmaps and closes the descriptor.
// Unlink removes the name at any time. A memfd segment has no name and
// disappears when the last process closes it. An open named Segment holds a
// shared flock(2) on its file, which tells Sweep that it is in use.
type Segment struct {
	name    string // the name it was created or opened by; empty for memfd
	file    string // its file in ShmDir (see CreateSegment); empty for memfd
	path    string // a file-backed segment's file (CreateFileSegment)
	fd      int
	mem     []byte
	created bool
	keep    bool
	adopted bool // its mapping was an idle one of a MapCache
	closed  atomic.Bool
}

// CreateSegment creates a named segment of at least size data bytes in
// ShmDir (/dev/shm) with mode 0600. It fails with an error wrapping
// os.ErrExist if this user already has a segment of that name.
//
// Names are per user: the segment's file is NamePrefix+"<euid>-"+name, made
// with O_EXCL and O_NOFOLLOW. /dev/shm is writable by everyone, so another
// user can make that file first; then, rather than failing, CreateSegment
// makes the segment under a file name nobody can predict (the name, "~" and
// 16 random hex digits) and records it in this user's runtime directory,
// where OpenSegment finds it (see names.go). Either way Name returns name.
func CreateSegment(name string, size int, opts *SegmentConfig) (*Segment, error) {
	if opts == nil {
		opts = &SegmentConfig{}
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	total := pageAlign(HeaderSize + size)
	file := userPrefix() + name
	path := filepath.Join(ShmDir, file)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EACCES) {
			return nil, &os.PathError{Op: "create segment", Path: path, Err: err}
		}
		// EACCES too: with fs.protected_regular, O_CREAT on another
		// user's file in a sticky directory fails so, even with O_EXCL.
		var st unix.Stat_t
		if lerr := unix.Lstat(path, &st); lerr != nil {
			return nil, &os.PathError{Op: "create segment", Path: path, Err: err}
		}
		if ownRegular(&st) {
			return nil, &os.PathError{Op: "create segment", Path: path, Err: unix.EEXIST}
		}
		return published(createAlt(name, total, opts, fmt.Sprintf("%s belongs to uid %d", path, st.Uid)))
	}
	// A creator of the same name that found another user's file in the way
	// (createAlt) waits on this lock for our decision: the segment is ours
	// unless a record names another file for it now. Held until the magic
	// is written: RepairSegment makes a file without a header in place
	// only if no creator holds its lock.
	if err := lockNew(fd, path); err != nil {
		unix.Close(fd)
		if !errors.Is(err, unix.EEXIST) {
			unix.Unlink(path)
		}
		return nil, err
	}
	if alt, ok := liveAlt(name); ok {
		unix.Unlink(path)
		unix.Close(fd)
		return nil, &os.PathError{Op: "create segment", Path: filepath.Join(ShmDir, alt), Err: unix.EEXIST}
	}
	if createHook != nil {
		createHook("checked")
	}
	s, err := newNamed(fd, path, total, opts)
	if err != nil {
		return nil, err
	}
	s.name, s.file, s.created, s.keep = name, file, true, opts.Keep
	s.initHeader(total)
	s.commit()
	if err := holdLock(s); err != nil {
		return nil, err
	}
	return published(s, nil)
}

// lockNew locks the file just created at path, open as fd, exclusively
// for its creator. Until it does, a RepairSegment may take the empty file
// over (its creator looks dead to it): then the lock is the repairer's, or
// the file is sized, and lockNew fails with an error wrapping EEXIST (the
// segment is made, by another). Anyone else holds the lock briefly (an
// opener that finds no header, createAlt reading the magic).
func lockNew(fd int, path string) error {
	var b Backoff
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err != nil && !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("shm: lock new segment %s: %w", path, err)
		}
		var st, now unix.Stat_t
		if ferr := unix.Fstat(fd, &st); ferr != nil {
			return fmt.Errorf("shm: lock new segment %s: %w", path, ferr)
		}
		if st.Size != 0 || unix.Lstat(path, &now) != nil || statID(&now) != statID(&st) {
			return &os.PathError{Op: "create segment", Path: path, Err: unix.EEXIST}
		}
		if err == nil {
			return nil
		}
		b.Pause()
	}
}

// RepairSegment is OpenSegment for a segment that must exist because a
// creator counted it as made (package mq's made count, say) and that
// creator may have died before it finished: if this user's segment name
// has a header, it is opened; if there is none, it is created (O_EXCL, as
// CreateSegment; a creator that races and wins makes RepairSegment open
// its segment); if this user's file for it exists without a header (shorter
// than one, or no magic) and no creator holds its lock, the segment is
// made in that file in place, with size data bytes and this process as its
// creator, as CreateSegment would have (nothing was ever written in such a
// segment). If a creator holds the lock, the error wraps ErrLocked: it is
// making the segment this moment, and the caller waits and tries again.
// Another user's file in the way is neither trusted nor touched: the
// segment is made in an alternative file then (see CreateSegment). A file
// of this user with a damaged header (a magic that is not ubkit's) is
// ErrCorrupt, and left alone.
func RepairSegment(name string, size int, opts *SegmentConfig) (*Segment, error) {
	s, err := OpenSegment(name)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, os.ErrNotExist):
		s, err = CreateSegment(name, size, opts)
		if errors.Is(err, os.ErrExist) {
			// Another creator or repairer won; it may be making it.
			s, err = OpenSegment(name)
			if errors.Is(err, ErrCorrupt) || errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("shm: repair segment %s: made by another this moment: %w (%v)", name, ErrLocked, err)
			}
		}
		return published(s, err)
	case !errors.Is(err, ErrCorrupt):
		return nil, err
	}
	if opts == nil {
		opts = &SegmentConfig{}
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	// The file OpenSegment found without a header: a live record's, if one
	// names the segment (CreateSegment gives up its predictable file then),
	// else the predictable one.
	file, alt := userPrefix()+name, false
	if a, ok := liveAlt(name); ok {
		file, alt = a, true
	}
	return published(repairNamed(name, file, alt, size, opts))
}

// errHeader is repairNamed's finding that the file holds a header now.
var errHeader = errors.New("the segment has a header")

// repairNamed makes segment name in place in file, a name in ShmDir, if
// the file is this user's, private, without a header, and unlocked; alt
// says file is the name's alternative file.
func repairNamed(name, file string, alt bool, size int, opts *SegmentConfig) (*Segment, error) {
	path := filepath.Join(ShmDir, file)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			// Removed since: a creator's that gave up, or by Unlink.
			return nil, fmt.Errorf("shm: repair segment %s: %s went away: %w", name, path, ErrLocked)
		}
		return nil, &os.PathError{Op: "repair segment", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: repair %s: %w", path, err)
	}
	if !ownRegular(&st) || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: repair %s: uid %d, %d names, mode %#o; only this user's regular files with one name and mode 0600 are made segments: %w", path, st.Uid, st.Nlink, st.Mode&0o7777, ErrCorrupt)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("shm: repair %s: its creator is making it: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("shm: repair %s: %w", path, err)
	}
	// Under the lock, look again: the name may have gone or been reused,
	// its creator may have finished, a record may have appeared.
	herr := func() error {
		var now unix.Stat_t
		if unix.Lstat(path, &now) != nil || statID(&now) != statID(&st) {
			return fmt.Errorf("shm: repair segment %s: %s was replaced: %w", name, path, ErrLocked)
		}
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("shm: repair %s: %w", path, err)
		}
		var magic [8]byte
		if n, _ := unix.Pread(fd, magic[:], segOffMagic); n == len(magic) && magic != [8]byte{} {
			if binary.LittleEndian.Uint64(magic[:]) == segMagic {
				return errHeader
			}
			return fmt.Errorf("shm: repair %s: %w", path, corruptf("not a ubkit segment (bad magic)"))
		}
		if !alt {
			if _, ok := liveAlt(name); ok {
				return fmt.Errorf("shm: repair segment %s: a creator records another file for it: %w", name, ErrLocked)
			}
		} else if committed, err := primaryCommitted(name); err != nil || committed {
			if err != nil {
				return fmt.Errorf("shm: repair segment %s: %w", name, err)
			}
			return errHeader
		}
		return nil
	}()
	if herr != nil {
		unix.Close(fd)
		if errors.Is(herr, errHeader) {
			return OpenSegment(name)
		}
		return nil, herr
	}
	total := pageAlign(HeaderSize + size)
	if err := unix.Ftruncate(fd, int64(total)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: repair: size segment %s to %d bytes: %w (is /dev/shm full?)", path, total, err)
	}
	s, err := mapSegment(fd, total, opts.HugePages, opts.Populate)
	if err != nil {
		return nil, err
	}
	s.name, s.file, s.created, s.keep = name, file, true, opts.Keep
	s.initHeader(total)
	s.commit()
	if err := holdLock(s); err != nil {
		return nil, err
	}
	return s, nil
}

// holdLock turns the lock on a new segment's file into the shared lock that
// every holder keeps for as long as its Segment is open: Sweep removes only
// a file it can lock exclusively. On failure it closes and removes the
// segment.
func holdLock(s *Segment) error {
	if err := unix.Flock(s.fd, unix.LOCK_SH); err != nil {
		s.keep = false
		s.Close()
		return fmt.Errorf("shm: lock segment %s: %w", filepath.Join(ShmDir, s.file), err)
	}
	return nil
}

// newNamed sizes and maps a new named segment's file, path, open as fd;
// on failure it removes the file.
func newNamed(fd int, path string, total int, opts *SegmentConfig) (*Segment, error) {
	if err := unix.Ftruncate(fd, int64(total)); err != nil {
		unix.Close(fd)
		unix.Unlink(path)
		return nil, fmt.Errorf("shm: size segment %s to %d bytes: %w (is /dev/shm full?)", path, total, err)
	}
	s, err := mapSegment(fd, total, opts.HugePages, opts.Populate)
	if err != nil {
		unix.Unlink(path)
		return nil, err
	}
	return s, nil
}

// OpenSegment maps this user's segment name, made by CreateSegment in any
// process, after checking its header. It opens the file with O_NOFOLLOW and
// refuses one that is not owned by the effective user, has another name (a
// hard link), or grants group or others any permission: /dev/shm is writable by everyone, and another user
// could have made it, or could change it under us. If the predictable file
// (see CreateSegment) is another user's, it is ignored and the segment is
// looked up in this user's records; if there is none, the error wraps
// os.ErrNotExist, as for a name that was never created.
func OpenSegment(name string) (*Segment, error) { return openSegment(name, nil) }

// openSegment is OpenSegment, with an idle mapping of the file from c if
// it has one (c may be nil).
func openSegment(name string, c *MapCache) (*Segment, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	s, err := openNamed(userPrefix()+name, c)
	if err != nil {
		// Another user's file, none, or ours but not (yet) a segment: a
		// record may name the segment.
		if alt, ok := liveAlt(name); ok && (errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrCorrupt)) {
			switch as, aerr := openNamed(alt, c); {
			case aerr == nil:
				s, err = as, nil
			case !errors.Is(aerr, os.ErrNotExist):
				// EMFILE, say: not "no segment", which would make a
				// create-or-open caller make a second one.
				err = aerr
			}
		}
	}
	if err != nil {
		return nil, err
	}
	s.name = name
	return published(s, nil)
}

// openNamed maps the segment in file, a name in ShmDir, if it is this
// user's and private. It holds the file locked shared (flock) while the
// Segment is open, so that Sweep leaves it alone, and checks, once it holds
// that lock, that the name still refers to the file: a Sweep that held the
// file before us has removed it then.
func openNamed(file string, c *MapCache) (*Segment, error) {
	path := filepath.Join(ShmDir, file)
	for try := 0; ; try++ {
		s, err := openLocked(path, unix.LOCK_SH, c)
		if !errors.Is(err, errReplaced) || try == 3 {
			if err != nil {
				return nil, err
			}
			s.file = file
			return s, nil
		}
	}
}

// errReplaced is openLocked's error for a file that was removed or
// replaced while it waited for its lock.
var errReplaced = errors.New("the file was removed or replaced while it was opened")

// openLocked maps the segment file at path, this user's and private,
// once it holds it locked as how says (flock(2): LOCK_SH, waiting for a
// creator or a Sweep; LOCK_EX|LOCK_NB, for RenameSegment, failing with
// an error wrapping ErrLocked if anyone holds it) and has checked that
// path still names the file (errReplaced if not). It uses an idle
// mapping of the file from c if there is one (c may be nil).
func openLocked(path string, how int, c *MapCache) (*Segment, error) {
	// O_NONBLOCK: another user's FIFO in the way must not block us.
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		var st unix.Stat_t
		if !errors.Is(err, unix.ENOENT) && unix.Lstat(path, &st) == nil && int(st.Uid) != os.Geteuid() {
			return nil, &foreignError{path, st.Uid, st.Mode, uint64(st.Nlink)}
		}
		return nil, &os.PathError{Op: "open segment", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	switch {
	case int(st.Uid) != os.Geteuid() || st.Nlink != 1:
		// Another name for the file may be another user's.
		unix.Close(fd)
		return nil, &foreignError{path, st.Uid, st.Mode, uint64(st.Nlink)}
	case st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o077 != 0:
		unix.Close(fd)
		return nil, fmt.Errorf("shm: open %s: a file of this user with mode %#o; ubkit opens only regular files of mode 0600 as segments (remove it if no one uses it)", path, st.Mode&0o7777)
	}
	// LOCK_SH blocks while a creator writes the header or a Sweep
	// decides.
	if err := unix.Flock(fd, how); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("shm: lock %s: in use: %w", path, ErrLocked)
		}
		return nil, fmt.Errorf("shm: lock %s: %w", path, err)
	}
	var now unix.Stat_t
	if err := unix.Lstat(path, &now); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.ENOENT) {
			return nil, &os.PathError{Op: "open segment", Path: path, Err: err}
		}
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	if statID(&now) != statID(&st) {
		unix.Close(fd)
		return nil, errReplaced
	}
	s, err := mapExistingVia(fd, c)
	if err != nil {
		return nil, fmt.Errorf("shm: open %s: %w", path, err)
	}
	return s, nil
}

// CreateMemfd creates an anonymous segment backed by a memfd. name is only a
// label shown in /proc/<pid>/fd. Pass it to another process with
// SendSegment after Seal.
func CreateMemfd(name string, size int, opts *SegmentConfig) (*Segment, error) {
	if opts == nil {
		opts = &SegmentConfig{}
	}
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	total := pageAlign(HeaderSize + size)
	if opts.HugePages {
		flags |= unix.MFD_HUGETLB
		total = (HeaderSize + size + hugePageSize - 1) &^ (hugePageSize - 1)
	}
	fd, err := unix.MemfdCreate(NamePrefix+name, flags)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(total)); err != nil {
		unix.Close(fd)
		hint := ""
		if opts.HugePages {
			hint = " (huge pages: reserve some with echo N > /proc/sys/vm/nr_hugepages)"
		}
		return nil, fmt.Errorf("shm: size memfd to %d bytes: %w%s", total, err, hint)
	}
	s, err := mapSegment(fd, total, false, opts.Populate)
	if err != nil {
		if opts.HugePages {
			err = fmt.Errorf("%w (huge pages: reserve some with echo N > /proc/sys/vm/nr_hugepages)", err)
		}
		return nil, err
	}
	s.created = true
	s.initHeader(total)
	s.commit()
	return s, nil
}

const hugePageSize = 2 << 20

func pageAlign(n int) int {
	p := os.Getpagesize()
	return (n + p - 1) &^ (p - 1)
}

func checkName(name string) error {
	if name == "" || len(name) > 200 {
		return fmt.Errorf("shm: segment name %q must be 1 to 200 characters", name)
	}
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("shm: segment name %q may only hold letters, digits, '-', '_' and '.'", name)
		}
	}
	if name == "." || name == ".." {
		return fmt.Errorf("shm: segment name %q is not allowed", name)
	}
	return nil
}

func mapSegment(fd, total int, huge, populate bool) (*Segment, error) {
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	mem, err := unix.Mmap(fd, 0, total, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: mmap %d bytes: %w", total, err)
	}
	if huge {
		// Best effort: shmem THP depends on
		// /sys/kernel/mm/transparent_hugepage/shmem_enabled.
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	}
	openSegments.Add(1)
	return &Segment{fd: fd, mem: mem}, nil
}

// mapExisting maps a segment made by someone else and validates its header.
// It takes ownership of fd.
func mapExisting(fd int) (*Segment, error) { return mapExistingVia(fd, nil) }

// mapExistingVia is mapExisting with an idle mapping of the file from c
// if it has one (c may be nil).
func mapExistingVia(fd int, c *MapCache) (*Segment, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if st.Size < HeaderSize || st.Size > 1<<46 {
		unix.Close(fd)
		return nil, corruptf("segment size %d is not a valid ubkit segment", st.Size)
	}
	var s *Segment
	if mem := c.take(fd, &st); mem != nil {
		openSegments.Add(1)
		s = &Segment{fd: fd, mem: mem, adopted: true}
	} else {
		var err error
		if s, err = mapSegment(fd, int(st.Size), false, false); err != nil {
			return nil, err
		}
	}
	h := s.mem[:HeaderSize]
	if binary.LittleEndian.Uint64(h[segOffMagic:]) != segMagic {
		s.Close()
		return nil, corruptf("not a ubkit segment (bad magic)")
	}
	if v := binary.LittleEndian.Uint32(h[segOffVersion:]); v != segVersion {
		s.Close()
		return nil, fmt.Errorf("shm: segment version %d, this ubkit speaks %d", v, segVersion)
	}
	if sz := binary.LittleEndian.Uint64(h[segOffSize:]); sz != uint64(st.Size) {
		s.Close()
		return nil, corruptf("segment header says %d bytes, file has %d", sz, st.Size)
	}
	return s, nil
}

func (s *Segment) initHeader(total int) {
	var id [4]byte
	_, _ = io.ReadFull(rand.Reader, id[:])
	h := s.mem[:HeaderSize]
	binary.LittleEndian.PutUint32(h[segOffVersion:], segVersion)
	binary.LittleEndian.PutUint32(h[segOffID:], binary.LittleEndian.Uint32(id[:])|1)
	binary.LittleEndian.PutUint64(h[segOffSize:], uint64(total))
	binary.LittleEndian.PutUint64(h[segOffCreator:], Self().word())
}

// commit writes the magic, after the rest of the header (initHeader),
// atomically, so a concurrent opener or Sweep never takes a half-written
// header for a valid one.
func (s *Segment) commit() {
	(*atomic.Uint64)(unsafe.Pointer(&s.mem[segOffMagic])).Store(segMagic)
}

// Name returns the name the segment was created or opened by (whatever its
// file in ShmDir is called), or "" for a memfd.
func (s *Segment) Name() string { return s.name }

// ID returns the random identifier written into the segment at creation. Pool
// handles carry it so a handle for one segment is refused by another.
func (s *Segment) ID() uint32 { return binary.LittleEndian.Uint32(s.mem[segOffID:]) }

// Creator returns the process that created the segment, as recorded in its
// header.
func (s *Segment) Creator() Process {
	return processFromWord(binary.LittleEndian.Uint64(s.mem[segOffCreator:]))
}

// Size returns the length of the data area.
func (s *Segment) Size() int { return len(s.mem) - HeaderSize }

// Data returns the data area: the mapped memory after the segment header,
// shared with every process that maps the segment. Other processes may change
// it at any time.
func (s *Segment) Data() []byte { return s.mem[HeaderSize:] }

// ReadAt copies from the data area at off, with bounds checks.
func (s *Segment) ReadAt(p []byte, off int64) (int, error) {
	d := s.Data()
	if off < 0 || off > int64(len(d)) {
		return 0, fmt.Errorf("shm: read at %d outside segment of %d bytes", off, len(d))
	}
	n := copy(p, d[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt copies into the data area at off, with bounds checks.
func (s *Segment) WriteAt(p []byte, off int64) (int, error) {
	d := s.Data()
	if off < 0 || off > int64(len(d)) || int64(len(p)) > int64(len(d))-off {
		return 0, fmt.Errorf("shm: write of %d bytes at %d outside segment of %d bytes", len(p), off, len(d))
	}
	return copy(d[off:], p), nil
}

// Seal forbids changing the size of a memfd segment and further sealing, so
// a receiver can map it without fear of a peer shrinking it under its feet
// (which would fault on access).
func (s *Segment) Seal() error {
	if s.file != "" {
		return errors.New("shm: only memfd segments can be sealed")
	}
	_, err := unix.FcntlInt(uintptr(s.fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	if err != nil {
		return fmt.Errorf("shm: seal memfd: %w", err)
	}
	return nil
}

// Sealed reports whether the segment's size can no longer change.
func (s *Segment) Sealed() bool {
	seals, err := unix.FcntlInt(uintptr(s.fd), unix.F_GET_SEALS, 0)
	return err == nil && seals&unix.F_SEAL_SHRINK != 0 && seals&unix.F_SEAL_GROW != 0
}

// Unlink removes the segment's name: its file in ShmDir (or a file-backed
// segment's file), and its record if it has one (see CreateSegment).
// Mappings stay valid. A segment created
// under the name since (after another Unlink) is not this one and is left
// alone.
func (s *Segment) Unlink() error {
	if s.path != "" {
		if sameFile(s.fd, s.path) {
			if err := unix.Unlink(s.path); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("shm: unlink %s: %w", s.path, err)
			}
		}
		return nil
	}
	if s.file == "" {
		return nil
	}
	var errs []error
	// The record first: while it names the file, no creator replaces it.
	if strings.Contains(s.file, altSep) {
		errs = append(errs, removeRecord(s.name, s.file))
	}
	path := filepath.Join(ShmDir, s.file)
	if sameFile(s.fd, path) {
		if err := unix.Unlink(path); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("shm: unlink %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}

// Close unmaps the segment and closes its descriptor; the creator of a named
// segment also unlinks it unless it was created with Keep. Memory obtained
// from Data must not be used after Close. Close is idempotent.
func (s *Segment) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	var errs []error
	if s.created && !s.keep {
		errs = append(errs, s.Unlink())
	}
	// Out of the table before the memory goes: MappingOf never finds
	// memory that is unmapped.
	s.unpublish()
	if err := unix.Munmap(s.mem); err != nil {
		errs = append(errs, fmt.Errorf("shm: munmap: %w", err))
	}
	if err := unix.Close(s.fd); err != nil {
		errs = append(errs, fmt.Errorf("shm: close: %w", err))
	}
	openSegments.Add(-1)
	return errors.Join(errs...)
}

// Sweep removes named ubkit segments from /dev/shm whose creating process is
// dead and that no live process holds (an open Segment), has mapped or has
// open (as /proc shows to the caller: root sees every process, another user
// its own), ubkit-named files with no valid header that are older than a
// minute and that no process uses, and rings' bells no process listens on,
// with the records of this user's segments it removes (see CreateSegment).
// Run by root it takes every user's files; run by another user, only that
// user's own (the sticky /dev/shm forbids removing the rest). It returns the
// names of what it removed: for this user's segments and bells, the
// segment's name (with the bell's suffix); for other users', the file name
// without NamePrefix. Segments of live processes are left alone.
func Sweep() ([]string, error) {
	entries, err := os.ReadDir(ShmDir)
	if err != nil {
		return nil, fmt.Errorf("shm: sweep: %w", err)
	}
	var removed []string
	var errs []error
	// Candidates are held locked exclusively (see holdLock) from before
	// /proc is scanned until they are removed: a process that opens one
	// after the scan waits for the lock, then finds the name gone.
	var held []sweepCandidate
	sweep := func() bool {
		defer func() {
			for _, c := range held {
				unix.Close(c.fd)
			}
			held = held[:0]
		}()
		if sweepHook != nil {
			sweepHook("scan")
		}
		used, err := scanInUse(held)
		if err != nil {
			errs = append(errs, err)
			return false
		}
		if sweepHook != nil {
			sweepHook("scanned")
		}
		for _, c := range held {
			if used[c.id] {
				continue
			}
			// Still the file we hold: not one made under the name since.
			var now unix.Stat_t
			if unix.Lstat(c.path, &now) != nil || statID(&now) != c.id {
				continue
			}
			file := filepath.Base(c.path)
			if name, ok := segmentName(file); ok && strings.Contains(file, altSep) {
				if err := removeRecord(name, file); err != nil {
					errs = append(errs, err)
					continue
				}
			}
			if err := unix.Unlink(c.path); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("shm: sweep %s: %w", c.path, err))
				continue
			}
			removed = append(removed, sweptName(file))
		}
		return true
	}
	var bells []string
	for _, e := range entries {
		if e.Type()&os.ModeNamedPipe != 0 {
			bells = append(bells, e.Name())
			continue
		}
		if !strings.HasPrefix(e.Name(), NamePrefix) || !e.Type().IsRegular() {
			continue
		}
		c, ok := sweepable(filepath.Join(ShmDir, e.Name()))
		if !ok {
			continue
		}
		held = append(held, c)
		if len(held) == sweepBatch && !sweep() {
			return removed, errors.Join(errs...)
		}
	}
	if len(held) > 0 {
		sweep()
	}
	// After the segments: the bells of those removed are orphans now.
	for _, name := range bells {
		gone, err := sweepBell(name)
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			removed = append(removed, sweptName(name))
		}
	}
	return removed, errors.Join(errs...)
}

// sweepBatch is how many candidates Sweep holds open at a time.
const sweepBatch = 64

// sweepHook, if set (by tests), runs in Sweep just before it scans /proc
// ("scan") and just after ("scanned").
var sweepHook func(step string)

// A sweepCandidate is a file Sweep may remove, open and locked exclusively.
type sweepCandidate struct {
	path string
	fd   int
	id   fileID
}

// sweptName is how Sweep reports the removal of file, a name in ShmDir.
func sweptName(file string) string {
	rest, ok := strings.CutPrefix(file, userPrefix())
	if !ok {
		return strings.TrimPrefix(file, NamePrefix)
	}
	seg, bell, isBell := strings.Cut(rest, bellSuffix)
	if i := strings.Index(seg, altSep); i >= 0 {
		seg = seg[:i]
	}
	if isBell {
		return seg + bellSuffix + bell
	}
	return seg
}

// sweepable reports whether the file at path is a stale segment (its
// creator dead) or leftover (no valid header for a minute) that no Segment
// holds and the caller may remove (its own, or any if root), and returns it
// open and locked exclusively.
func sweepable(path string) (sweepCandidate, bool) {
	// O_NOFOLLOW and O_NONBLOCK: the file may have been replaced by a
	// symbolic link or a FIFO since it was listed.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return sweepCandidate{}, false
	}
	var st unix.Stat_t
	// Only root may remove another user's file from the sticky /dev/shm.
	if unix.Fstat(fd, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFREG ||
		(os.Geteuid() != 0 && int(st.Uid) != os.Geteuid()) {
		unix.Close(fd)
		return sweepCandidate{}, false
	}
	var h [32]byte
	n, _ := unix.Pread(fd, h[:], 0)
	var stale bool
	if n < len(h) || binary.LittleEndian.Uint64(h[segOffMagic:]) != segMagic {
		// Not ours or being created right now: only stale leftovers go.
		stale = time.Since(time.Unix(st.Mtim.Unix())) > time.Minute
	} else {
		stale = !aliveWord(binary.LittleEndian.Uint64(h[segOffCreator:]))
	}
	// A Segment open anywhere holds a shared lock on its file.
	if !stale || unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		unix.Close(fd)
		return sweepCandidate{}, false
	}
	return sweepCandidate{path: path, fd: fd, id: statID(&st)}, true
}

// Uint64At returns an atomic view of the 8-byte word at offset off of the
// data area, after checking that it lies inside and is 8-byte aligned. The
// word is shared memory: other processes may change it at any time. It must
// not be used after Close.
func (s *Segment) Uint64At(off int) (*atomic.Uint64, error) {
	d := s.Data()
	if off < 0 || off > len(d)-8 {
		return nil, fmt.Errorf("shm: 8-byte word at %d outside a segment of %d bytes", off, len(d))
	}
	if off%8 != 0 {
		return nil, fmt.Errorf("shm: word offset %d is not 8-byte aligned", off)
	}
	return atomicU64(d, off), nil
}

// Uint32At is Uint64At for a 4-byte word (4-byte aligned).
func (s *Segment) Uint32At(off int) (*atomic.Uint32, error) {
	d := s.Data()
	if off < 0 || off > len(d)-4 {
		return nil, fmt.Errorf("shm: 4-byte word at %d outside a segment of %d bytes", off, len(d))
	}
	if off%4 != 0 {
		return nil, fmt.Errorf("shm: word offset %d is not 4-byte aligned", off)
	}
	return atomicU32(d, off), nil
}
