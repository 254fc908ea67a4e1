//go:build linux

package shm

import (
	"os/exec"
	"testing"
)

// For the tests in package shm_test, which need internal/testenv (and
// internal/testenv imports shm).

// RegisterChild adds a child function for StartChild and for the test
// binary run as another user (testenv.User.Child, with ChildArgs).
func RegisterChild(name string, f func(args []string) error) { children[name] = f }

// UseTestenv hands package shm's tests what package testenv gives: it
// registers the child functions as child roles with register
// (testenv.RegisterChild), has startChild start them with child
// (testenv.Child), and makes parked waitParked (testenv.WaitParked).
func UseTestenv(register func(role string, f func() int), child func(t testing.TB, role string, env ...string) *exec.Cmd,
	parked func(t testing.TB, n int, state string, fns ...string)) {
	for name, f := range children {
		register(name, runChild(name, f))
	}
	childCommand, waitParked = child, parked
}

// StartChild is startChild.
func StartChild(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	return startChild(t, name, args...)
}

// ChildArgs is the environment entry that gives a child function args.
func ChildArgs(args ...string) string { return childArgs(args...) }

// UserPrefix is userPrefix.
func UserPrefix() string { return userPrefix() }

// File is the segment's file name in ShmDir.
func (s *Segment) File() string { return s.file }
