// Package fdlimit names running out of file descriptors in errors: a
// system call that fails with EMFILE or ENFILE says only "too many open
// files", and a layer above that falls back to something else (another
// address, a peer that gave up) can turn it into an error about that
// instead. It also reads and sets the limit, for tests that run out on
// purpose. It is for ubkit's own packages.
package fdlimit

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// The errors of running out of file descriptors, for errors.Is: this
// process reached its limit (EMFILE), or the system its open-file table
// (ENFILE).
var (
	ErrProcessLimit error = syscall.EMFILE
	ErrSystemLimit  error = syscall.ENFILE
)

// Hint returns err with the cause spelled out and what to do about it
// when err says this process (EMFILE) or the system (ENFILE) ran out of
// file descriptors; any other error, nil, or an error that already
// carries the hint comes back unchanged. The result still matches the
// system error with errors.Is.
func Hint(err error) error {
	errno, ok := Errno(err)
	if !ok {
		return err
	}
	var done *limitError
	if errors.As(err, &done) {
		return err
	}
	e := &limitError{err: err, errno: errno, pid: os.Getpid()}
	if limit, err := Limit(); err == nil {
		e.limit = limit
	}
	return e
}

// Peer returns the cause of a peer's refusal whose errno number (as the
// peer sent it) says the peer ran out of file descriptors, EMFILE or
// ENFILE, and nil for any other number. The cause matches the errno with
// errors.Is, and Hint leaves an error that wraps it alone, since the limit
// reached is the peer's and the peer's own words name it.
func Peer(errno int) error {
	e := syscall.Errno(errno)
	if e != syscall.EMFILE && e != syscall.ENFILE {
		return nil
	}
	return &limitError{err: e, errno: e, peer: true}
}

// Errno returns EMFILE or ENFILE when err is one of them.
func Errno(err error) (syscall.Errno, bool) {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE} {
		if errors.Is(err, errno) {
			return errno, true
		}
	}
	return 0, false
}

// limitError is an error that ran out of file descriptors, with the hint.
type limitError struct {
	err   error
	errno syscall.Errno
	pid   int    // the process it happened in: the error may travel to a peer
	limit uint64 // its RLIMIT_NOFILE then (0: unknown)
	peer  bool   // it happened in a peer (Peer)
}

func (e *limitError) Error() string {
	if e.peer {
		return fmt.Sprintf("the peer ran out of file descriptors (%v)", e.errno)
	}
	if e.errno == syscall.ENFILE {
		return e.err.Error() + " (the system's open-file table is full: close descriptors, or raise fs.file-max)"
	}
	limit := ""
	if e.limit > 0 {
		limit = fmt.Sprintf(" of %d", e.limit)
	}
	return fmt.Sprintf("%v (process %d reached its fd limit%s, RLIMIT_NOFILE: close connections, or raise it with ulimit -n)", e.err, e.pid, limit)
}

func (e *limitError) Unwrap() error { return e.err }
