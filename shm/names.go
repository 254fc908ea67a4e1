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
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ubkit-io/ubkit/internal/rundir"
)

// Segment names are per user. User u's segment "x" lives in ShmDir as
// NamePrefix+"<u>-x", the predictable file, unless another user's file held
// that name when it was created. Then it lives in an alternative file,
// NamePrefix+"<u>-x~"+16 random hex digits, and this user's runtime
// directory (internal/rundir, which no other user can write to) holds a
// record of it: in recordDir, a symbolic link "x"+recordExt to the file's
// name. recordLock serialises changes of records. Neither '@' nor '~' can
// be in a segment name, nor in a node name of package transport, which
// shares the directory.
const (
	recordDir  = "@shm"
	recordExt  = ".seg"
	recordLock = "lock"
	altSep     = "~"
	altHexLen  = 16
)

// Two creators of one name can race: one finds the predictable file free
// (CreateSegment), the other found another user's file there, which went
// away meanwhile (createAlt). Exactly one of them makes the segment: the
// first holds its new file locked (flock) from creating it until its
// header's magic is written, and gives up if a record of the name exists by
// then; the second writes the record first, then waits for that lock and
// gives up if the predictable file holds a segment.

// altHook, if set (by tests), runs at the steps of createAlt named by its
// argument: "created" (the file made, no record yet) and "linked". createHook
// runs in CreateSegment once it holds its new predictable file locked and
// found no record ("checked"), before it writes the magic.
var altHook, createHook func(step string)

// createAlt creates segment name in an alternative file because another
// user's file holds the predictable one (why says whose), and records it.
func createAlt(name string, total int, opts *SegmentConfig, why string) (*Segment, error) {
	fail := func(err error) (*Segment, error) {
		return nil, fmt.Errorf("shm: create segment %s: %s, and its record cannot be kept: %w", name, why, err)
	}
	dir, err := rundir.Dir()
	if err == nil {
		err = rundir.Ensure(dir, recordDir)
	}
	if err != nil {
		return fail(err)
	}
	records := filepath.Join(dir, recordDir)
	unlock, err := rundir.Lock(filepath.Join(records, recordLock))
	if err != nil {
		return fail(err)
	}
	defer unlock()
	rec := filepath.Join(records, name+recordExt)
	if alt, ok := readRecord(rec, name); ok && ownFile(filepath.Join(ShmDir, alt)) {
		return nil, &os.PathError{Op: "create segment", Path: filepath.Join(ShmDir, alt), Err: unix.EEXIST}
	}
	// Whatever is there now is stale: its file is gone.
	if err := os.Remove(rec); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	var fd int
	var file, path string
	for try := 0; ; try++ {
		var r [altHexLen / 2]byte
		if _, err := io.ReadFull(rand.Reader, r[:]); err != nil {
			return fail(err)
		}
		file = fmt.Sprintf("%s%s%s%x", userPrefix(), name, altSep, r)
		path = filepath.Join(ShmDir, file)
		fd, err = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
		if err == nil {
			// Held while the segment is open (see holdLock).
			if err = unix.Flock(fd, unix.LOCK_SH); err == nil {
				break
			}
			unix.Close(fd)
			unix.Unlink(path)
			return nil, fmt.Errorf("shm: lock new segment %s: %w", path, err)
		}
		if !errors.Is(err, unix.EEXIST) || try == 3 {
			return nil, &os.PathError{Op: "create segment", Path: path, Err: err}
		}
	}
	s, err := newNamed(fd, path, total, opts)
	if err != nil {
		return nil, err
	}
	s.name, s.file, s.created, s.keep = name, file, true, opts.Keep
	// The header without its magic until the race above is decided:
	// openers take the segment for one being created.
	s.initHeader(total)
	// Not through Unlink and Close, which would take the lock we hold.
	undo := func() {
		os.Remove(rec)
		unix.Unlink(path)
		s.created = false
		s.Close()
	}
	if altHook != nil {
		altHook("created")
	}
	if err := os.Symlink(file, rec); err != nil {
		undo()
		return fail(err)
	}
	if altHook != nil {
		altHook("linked")
	}
	committed, err := primaryCommitted(name)
	if err != nil {
		undo()
		return nil, fmt.Errorf("shm: create segment %s: %s, and whether this user's predictable file holds the segment by now cannot be told: %w", name, why, err)
	}
	if committed {
		undo()
		return nil, &os.PathError{Op: "create segment", Path: filepath.Join(ShmDir, userPrefix()+name), Err: unix.EEXIST}
	}
	s.commit()
	return s, nil
}

// primaryCommitted reports whether this user's predictable file for name
// holds a segment, after waiting for its creator's decision (its lock).
// Only a missing file, or one that is not a regular file of this user,
// means no; an error that leaves it unknown (EMFILE, say) is returned.
func primaryCommitted(name string) (bool, error) {
	path := filepath.Join(ShmDir, userPrefix()+name)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		var st unix.Stat_t
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || (unix.Lstat(path, &st) == nil && !ownRegular(&st)) {
			return false, nil
		}
		return false, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if !ownRegular(&st) {
		return false, nil // another user's, whose lock we must not wait for
	}
	if err := unix.Flock(fd, unix.LOCK_SH); err != nil {
		return false, &os.PathError{Op: "lock", Path: path, Err: err}
	}
	var magic [8]byte
	n, err := unix.Pread(fd, magic[:], segOffMagic)
	if err != nil {
		return false, &os.PathError{Op: "read", Path: path, Err: err}
	}
	return n == len(magic) && binary.LittleEndian.Uint64(magic[:]) == segMagic, nil
}

// userPrefix starts the file name of every segment of this user.
func userPrefix() string { return NamePrefix + strconv.Itoa(os.Geteuid()) + "-" }

// readRecord returns the file the record rec names, if it is one that
// createAlt could have made for name.
func readRecord(rec, name string) (string, bool) {
	file, err := os.Readlink(rec)
	if err != nil {
		return "", false
	}
	random, ok := strings.CutPrefix(file, userPrefix()+name+altSep)
	if !ok || len(random) != altHexLen || strings.Trim(random, "0123456789abcdef") != "" {
		return "", false
	}
	return file, true
}

// recordPath is where name's record is, if this user has a private runtime
// directory for records; it creates nothing.
func recordPath(name string) (string, bool) {
	records := filepath.Join(rundir.Lookup(), recordDir)
	if rundir.Check(records) != nil {
		return "", false
	}
	return filepath.Join(records, name+recordExt), true
}

// liveAlt returns the alternative file of this user's segment name, if a
// record names one and it exists.
func liveAlt(name string) (string, bool) {
	rec, ok := recordPath(name)
	if !ok {
		return "", false
	}
	alt, ok := readRecord(rec, name)
	return alt, ok && ownFile(filepath.Join(ShmDir, alt))
}

// removeRecord removes name's record if it names file.
func removeRecord(name, file string) error {
	rec, ok := recordPath(name)
	if !ok {
		return nil
	}
	unlock, err := rundir.Lock(filepath.Join(filepath.Dir(rec), recordLock))
	if err != nil {
		return fmt.Errorf("shm: remove the record of segment %s: %w", name, err)
	}
	defer unlock()
	if alt, ok := readRecord(rec, name); ok && alt == file {
		if err := os.Remove(rec); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("shm: remove the record of segment %s: %w", name, err)
		}
	}
	return nil
}

// ownRegular reports whether st is a regular file of this user with one
// name: a file with another (a hard link) may be another user's too.
func ownRegular(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFREG && int(st.Uid) == os.Geteuid() && st.Nlink == 1
}

// ownFile reports whether path is a regular file of this user with one name.
func ownFile(path string) bool {
	var st unix.Stat_t
	return unix.Lstat(path, &st) == nil && ownRegular(&st)
}

// foreignError is openNamed's error for a file of another user, or one
// with more than one name. Like a missing segment's, it wraps
// os.ErrNotExist: this user has no segment there.
type foreignError struct {
	path  string
	uid   uint32
	mode  uint32
	nlink uint64
}

func (e *foreignError) Error() string {
	if int(e.uid) == os.Geteuid() {
		return fmt.Sprintf("shm: open segment %s: it has %d names (hard links), and another may be another user's, so it was "+
			"ignored, and this user has no segment of that name", e.path, e.nlink)
	}
	return fmt.Sprintf("shm: open segment %s: it belongs to uid %d (mode %#o), not to this user (uid %d), so it was "+
		"ignored, and this user has no segment of that name", e.path, e.uid, e.mode&0o7777, os.Geteuid())
}

func (e *foreignError) Unwrap() error { return os.ErrNotExist }

// segmentName returns the segment name that a file in ShmDir holds, if the
// file name is one of this user's segments' (predictable or alternative).
func segmentName(file string) (string, bool) {
	rest, ok := strings.CutPrefix(file, userPrefix())
	if !ok || strings.Contains(rest, bellSuffix) {
		return "", false
	}
	if i := strings.Index(rest, altSep); i >= 0 {
		if len(rest)-i-1 != altHexLen {
			return "", false
		}
		rest = rest[:i]
	}
	return rest, checkName(rest) == nil
}

// Segments returns the names of this user's named segments in ShmDir, for
// OpenSegment, sorted. Another user's files are not listed.
func Segments() ([]string, error) {
	entries, err := os.ReadDir(ShmDir)
	if err != nil {
		return nil, fmt.Errorf("shm: list segments: %w", err)
	}
	var names []string
	for _, e := range entries {
		name, ok := segmentName(e.Name())
		if !ok || !e.Type().IsRegular() || !ownFile(filepath.Join(ShmDir, e.Name())) {
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}
