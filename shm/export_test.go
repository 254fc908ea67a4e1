//go:build linux

package shm

import (
	"os/exec"
	"testing"
)

// For the tests in package shm_test, which need internal/testenv (and
// internal/testenv imports shm).

// RegisterChild adds a child function for StartChild and for the test
// binary run as another user (see TestMain).
func RegisterChild(name string, f func(args []string) error) { children[name] = f }

// StartChild is startChild.
func StartChild(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	return startChild(t, name, args...)
}

// ChildEnv is the environment that makes the test binary run child
// function name with args.
func ChildEnv(name string, args ...string) []string { return childEnv(name, args...) }

// UserPrefix is userPrefix.
func UserPrefix() string { return userPrefix() }

// File is the segment's file name in ShmDir.
func (s *Segment) File() string { return s.file }
