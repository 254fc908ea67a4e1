//go:build !unix

package osproc

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
)

// RunAs fails on this system: running a process as another user by its
// uid needs a Unix system.
func RunAs(cmd *exec.Cmd, uid, gid int) error {
	return fmt.Errorf("osproc: running a process as uid %d is not supported on %s", uid, runtime.GOOS)
}

// NotifyStart does nothing on this system, which has no signal one
// process can send another to start it: SignalStart fails.
func NotifyStart(c chan<- os.Signal) {}

// SignalStart fails on this system, which has no signal one process can
// send another to start it.
func SignalStart(pid int) error {
	return fmt.Errorf("osproc: signalling process %d to start is not supported on %s", pid, runtime.GOOS)
}
