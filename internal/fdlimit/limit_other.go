//go:build !unix

package fdlimit

import (
	"fmt"
	"runtime"
)

// Limit fails: this system has no RLIMIT_NOFILE.
func Limit() (uint64, error) {
	return 0, fmt.Errorf("fdlimit: a limit on open file descriptors is not supported on %s", runtime.GOOS)
}

// SetLimit fails: this system has no RLIMIT_NOFILE.
func SetLimit(n uint64) error {
	return fmt.Errorf("fdlimit: a limit on open file descriptors is not supported on %s", runtime.GOOS)
}
