//go:build unix

package rundir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// Owner returns the uid of the user that owns the file fi describes, or -1
// if the system does not say.
func Owner(fi fs.FileInfo) int {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return -1
	}
	return int(st.Uid)
}

// Lock takes an exclusive lock (flock) on the file at path, creating it
// with mode 0600, and returns the function that releases it. It waits while
// another process holds the lock. path must be in a directory only this
// user can write to (see Check), so that no other user can hold the lock.
func Lock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("rundir: lock: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("rundir: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing the last descriptor releases the lock
}
