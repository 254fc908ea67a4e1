//go:build !unix

package osproc

import (
	"os/exec"
	"time"
)

// StopGroupOnCancel leaves cmd's cancelling as exec has it on this
// system, which has no process groups: cmd alone is killed, not its
// children. On Unix it stops cmd's whole process group.
func StopGroupOnCancel(cmd *exec.Cmd, grace time.Duration) (waited func()) {
	cmd.WaitDelay = grace
	return func() {}
}
