package osproc

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process, once started, get SIGKILL when its
// parent ends (Linux's parent-death signal, sent when the thread that
// started it exits), so that a test or benchmark killed midway leaves no
// peer running. On other systems the child is not tied to its parent.
func DieWithParent(cmd *exec.Cmd) { attrs(cmd).Pdeathsig = syscall.SIGKILL }
