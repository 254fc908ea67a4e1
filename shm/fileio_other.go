//go:build !linux

package shm

import "os"

// FileStat is what identifies an open file's content (see the Linux
// build); StatFile fails here.
type FileStat struct {
	Dev, Ino     uint64
	Size         int64
	Mtime, Ctime int64
	Mode         uint32
	FSType       int64
}

// File system types of FileStat.FSType.
const (
	FSTmpfs     = 0x01021994
	FSRamfs     = 0x858458f6
	FSHugetlbfs = 0x958458f6
	FSNFS       = 0x6969
	FSFuse      = 0x65735546
	FSCIFS      = 0xff534d42
	FSSMB2      = 0xfe534d42
	FSCeph      = 0x00c36400
	FS9P        = 0x01021997
	FSOverlay   = 0x794c7630
	FSExt4      = 0xef53
	FSXFS       = 0x58465342
	FSBtrfs     = 0x9123683e
)

// StatFile fails: it needs Linux.
func StatFile(f *os.File) (FileStat, error) { return FileStat{}, errUnsupported }

// IsRegular reports false: StatFile fails here.
func (s FileStat) IsRegular() bool { return false }

// Advice is a paging hint (see the Linux build).
type Advice int

// Hints.
const (
	AdviseNormal Advice = iota
	AdviseSequential
	AdviseRandom
	AdviseWillNeed
	AdviseDontNeed
	AdviseNoReuse
	AdviseHugePage
	AdvisePopulateRead
)

func (a Advice) String() string {
	return [...]string{"normal", "sequential", "random", "willneed", "dontneed", "noreuse", "hugepage", "populate-read"}[a]
}

// Advise fails: it needs Linux.
func Advise(b []byte, a Advice) error { return errUnsupported }

// AdviseFile fails: it needs Linux.
func AdviseFile(f *os.File, off, n int64, a Advice) error { return errUnsupported }

// OpenDirect fails: it needs Linux.
func OpenDirect(path string) (*os.File, error) { return nil, errUnsupported }

// ProtectReadOnly fails: it needs Linux.
func ProtectReadOnly(b []byte) error { return errUnsupported }

// UnlinkIfLast fails: segments need Linux.
func (s *Segment) UnlinkIfLast() (bool, error) { return false, errUnsupported }

// OpenNonblock is O_NONBLOCK where there is one (0 here).
const OpenNonblock = 0

// RemoveUnheld fails: segments need Linux.
func RemoveUnheld(prefix string, n int, removable func(head []byte) bool) ([]string, error) {
	return nil, errUnsupported
}

// FreeSpace fails: segments need Linux.
func FreeSpace() (int64, error) { return 0, errUnsupported }
