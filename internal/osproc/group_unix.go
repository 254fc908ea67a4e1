//go:build unix

package osproc

import (
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// StopGroupOnCancel starts cmd in a process group of its own and makes
// the cancelling of its context (exec.CommandContext) send SIGTERM to the
// whole group, not only to cmd, so that a script's children (compilers,
// say) stop with it and the script's exit traps run; what of the group is
// still there grace later gets SIGKILL. Call the returned function once
// cmd's Wait has returned: it stops that escalation (the group's id could
// be another's by then).
func StopGroupOnCancel(cmd *exec.Cmd, grace time.Duration) (waited func()) {
	attrs(cmd).Setpgid = true
	var mu sync.Mutex
	var kill *time.Timer
	done := false
	cmd.Cancel = func() error {
		pgid := -cmd.Process.Pid
		mu.Lock()
		defer mu.Unlock()
		if !done {
			kill = time.AfterFunc(grace, func() {
				mu.Lock()
				defer mu.Unlock()
				if !done {
					syscall.Kill(pgid, syscall.SIGKILL)
				}
			})
		}
		return syscall.Kill(pgid, syscall.SIGTERM)
	}
	// exec kills cmd itself if its output is still open after this.
	cmd.WaitDelay = grace + time.Second
	return func() {
		mu.Lock()
		defer mu.Unlock()
		done = true
		if kill != nil {
			kill.Stop()
		}
	}
}
