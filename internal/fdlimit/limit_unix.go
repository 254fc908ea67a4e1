//go:build unix

package fdlimit

import (
	"fmt"
	"syscall"
)

// Limit returns this process's limit on open file descriptors (the soft
// RLIMIT_NOFILE).
func Limit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, fmt.Errorf("fdlimit: read RLIMIT_NOFILE: %w", err)
	}
	return rl.Cur, nil
}

// SetLimit sets this process's limit on open file descriptors (the soft
// RLIMIT_NOFILE) to n, which must not exceed the hard limit. Tests lower
// it to run out of descriptors on purpose, and restore it after.
func SetLimit(n uint64) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("fdlimit: read RLIMIT_NOFILE: %w", err)
	}
	rl.Cur = n
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("fdlimit: set RLIMIT_NOFILE to %d (hard limit %d): %w", n, rl.Max, err)
	}
	return nil
}
