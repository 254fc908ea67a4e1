package shm

import "syscall"

// Errors of the operating system that ubkit's connections report the way
// package net does, so that callers match them with errors.Is against
// these or against the syscall package's values alike. They live here so
// that the layers above shm need not import syscall.
var (
	// ErrConnReset reports a peer that went away mid-connection
	// (ECONNRESET).
	ErrConnReset error = syscall.ECONNRESET
	// ErrBrokenPipe reports a write to a peer that no longer reads
	// (EPIPE).
	ErrBrokenPipe error = syscall.EPIPE
	// ErrConnRefused reports a dial that nothing listened to
	// (ECONNREFUSED).
	ErrConnRefused error = syscall.ECONNREFUSED
	// ErrAddrInUse reports a listen on an address that is taken
	// (EADDRINUSE).
	ErrAddrInUse error = syscall.EADDRINUSE
	// ErrNoSpace reports a file system that is full (ENOSPC): a file
	// segment that could not be allocated.
	ErrNoSpace error = syscall.ENOSPC
	// ErrIO reports a device that failed a read or a write (EIO), such
	// as a flush of a file segment to disk.
	ErrIO error = syscall.EIO
)
