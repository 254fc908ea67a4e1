//go:build !linux

package shm

import (
	"errors"
	"fmt"
	"os"
)

// CheckDir fails: file-backed segments need Linux.
func CheckDir(dir string) error { return errUnsupported }

// CreateFileSegment fails: file-backed segments need Linux.
func CreateFileSegment(path string, size int, opts *SegmentConfig) (*Segment, error) {
	return nil, errUnsupported
}

// OpenFileSegment fails: file-backed segments need Linux.
func OpenFileSegment(path string) (*Segment, error) { return nil, errUnsupported }

func (s *Segment) Sync(off, n int) error { return errUnsupported }
func (s *Segment) SyncAll() error        { return errUnsupported }

// SyncDir fails: file-backed segments need Linux.
func SyncDir(dir string) error { return errUnsupported }

// ErrLocked is the error of TryLockFile on a file another holder locks.
var ErrLocked = errors.New("shm: file locked by another process")

// LockFile fails: file locks are used only with file-backed segments.
func LockFile(f *os.File) error { return errUnsupported }

// TryLockFile fails: file locks are used only with file-backed segments.
func TryLockFile(f *os.File) error { return errUnsupported }

// WritePrivateFile fails: it is used only with file-backed segments.
func WritePrivateFile(path string, data []byte) error { return errUnsupported }

// OpenPrivateFile fails: it is used only with file-backed segments.
func OpenPrivateFile(path string) (*os.File, error) { return nil, errUnsupported }

// RepairFileSegment fails: file-backed segments need Linux.
func RepairFileSegment(path string, size int, opts *SegmentConfig) (*Segment, error) {
	return nil, errUnsupported
}

// ErrNoHeader is the error of OpenFileSegment on a file without a header
// yet (on Linux).
var ErrNoHeader = fmt.Errorf("%w: a segment file without a header yet", ErrCorrupt)

// TryLockFileShared fails: file locks are used only with file-backed
// segments.
func TryLockFileShared(f *os.File) error { return errUnsupported }

// UnlockFile fails: file locks are used only with file-backed segments.
func UnlockFile(f *os.File) error { return errUnsupported }
