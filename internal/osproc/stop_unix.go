//go:build unix

package osproc

import "syscall"

// StopSelf stops this process (SIGSTOP) until it gets SIGCONT or is
// killed: for test children that must be caught at a precise point.
func StopSelf() error { return syscall.Kill(syscall.Getpid(), syscall.SIGSTOP) }
