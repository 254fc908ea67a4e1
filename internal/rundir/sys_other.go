//go:build !unix

package rundir

import (
	"fmt"
	"io/fs"
	"runtime"
)

// Owner returns -1: this system does not say which uid owns a file.
func Owner(fi fs.FileInfo) int { return -1 }

// Lock fails: this system has no flock(2).
func Lock(path string) (unlock func(), err error) {
	return nil, fmt.Errorf("rundir: lock %s: file locks are not supported on %s", path, runtime.GOOS)
}
