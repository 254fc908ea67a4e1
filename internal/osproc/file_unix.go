//go:build unix

package osproc

import (
	"os"
	"syscall"
)

// ReadOwnHeader reads the first len(p) bytes of the regular file at path
// if this user owns it, without following a symbolic link, blocking on a
// FIFO, mapping the file or locking it (either would make a segment in use
// for another process's Sweep). It reports whether p was filled.
func ReadOwnHeader(path string, p []byte) bool {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd)
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG || int(st.Uid) != os.Geteuid() {
		return false
	}
	n, _ := syscall.Pread(fd, p, 0)
	return n == len(p)
}

// Signaled says whether a signal ended the process state describes.
func Signaled(state *os.ProcessState) bool {
	ws, ok := state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// Mkfifo makes a FIFO at path with mode.
func Mkfifo(path string, mode uint32) error { return syscall.Mkfifo(path, mode) }
