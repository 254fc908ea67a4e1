//go:build !linux

package osproc

import "os/exec"

// DieWithParent does nothing on this system, which has no parent-death
// signal: a child of a test or benchmark killed midway keeps running. On
// Linux it makes the child get SIGKILL when its parent ends.
func DieWithParent(cmd *exec.Cmd) {}
