//go:build unix

package osproc

import (
	"os/exec"
	"syscall"
	"time"
)

// StopGroupOnCancel starts cmd in a process group of its own and makes
// the cancelling of its context (exec.CommandContext) send SIGTERM to the
// whole group, not only to cmd, so that a script's children (compilers,
// say) stop with it and the script's exit traps run; cmd is killed if it
// has not exited grace later.
func StopGroupOnCancel(cmd *exec.Cmd, grace time.Duration) {
	attrs(cmd).Setpgid = true
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = grace
}
