//go:build !unix

package osproc

import (
	"errors"
	"os"
)

// ReadOwnHeader reports false on this system: it cannot tell a file's
// owner.
func ReadOwnHeader(path string, p []byte) bool { return false }

// Signaled says whether a signal ended the process state describes: on
// this system, whether it did not exit by itself.
func Signaled(state *os.ProcessState) bool { return !state.Exited() }

// Mkfifo is not supported on this system.
func Mkfifo(path string, mode uint32) error { return errors.ErrUnsupported }
