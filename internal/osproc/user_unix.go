//go:build unix

package osproc

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

// RunAs makes cmd's process, once started, run as user uid and group gid
// without supplementary groups. Starting it needs the privilege to change
// users (root).
func RunAs(cmd *exec.Cmd, uid, gid int) error {
	if uid < 0 || gid < 0 {
		return fmt.Errorf("osproc: run as uid %d, gid %d: ids are not negative", uid, gid)
	}
	attrs(cmd).Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}
	return nil
}

// NotifyStart relays to c the signal SignalStart sends (SIGUSR1).
func NotifyStart(c chan<- os.Signal) { signal.Notify(c, syscall.SIGUSR1) }

// SignalStart sends process pid the signal that NotifyStart relays: a
// benchmark starts its warmed-up peers with it at one moment.
func SignalStart(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGUSR1); err != nil {
		return fmt.Errorf("osproc: signal process %d to start: %w", pid, err)
	}
	return nil
}
