// Package osproc holds the operating system's process controls that
// ubkit's tests, benchmarks and commands use, so that they need not import
// syscall themselves: a child process that dies with its parent or runs as
// another user, the signals that ask a command to stop, and the signal
// that starts a benchmark's peer processes together. It is for ubkit's own
// packages; Linux gets all of it, other systems what they support, and a
// clear error for the rest.
package osproc

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// NotifyStop relays to c the signals that ask a command to stop: an
// interrupt (Ctrl-C) and SIGTERM. Undo it with signal.Stop(c).
func NotifyStop(c chan<- os.Signal) { signal.Notify(c, os.Interrupt, syscall.SIGTERM) }

// StopContext is a context of parent that ends when the command is asked
// to stop (the signals of NotifyStop); stop undoes the relay.
func StopContext(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// Terminate asks process p to stop with SIGTERM (on Windows, where no
// signal but a kill can be sent, it fails).
func Terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

// attrs returns cmd's system attributes, made if it has none.
func attrs(cmd *exec.Cmd) *syscall.SysProcAttr {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	return cmd.SysProcAttr
}
