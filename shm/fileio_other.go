//go:build !linux

package shm

import "os"

// StatFile fails: it needs Linux.
func StatFile(f *os.File) (FileStat, error) { return FileStat{}, errUnsupported }

// Advise fails: it needs Linux.
func Advise(b []byte, a Advice) error { return errUnsupported }

// AdviseFile fails: it needs Linux.
func AdviseFile(f *os.File, off, n int64, a Advice) error { return errUnsupported }

// OpenDirect fails: it needs Linux.
func OpenDirect(path string) (*os.File, error) { return nil, errUnsupported }

// CachedPages fails: it needs Linux.
func CachedPages(f *os.File, n int64) (cached, pages int64, err error) {
	return 0, 0, errUnsupported
}

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
