//go:build linux

package shm_test

import (
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// TestMain is in package shm_test because internal/testenv imports shm:
// package shm's own tests get testenv's child processes through
// shm.UseTestenv.
func TestMain(m *testing.M) {
	shm.UseTestenv(testenv.RegisterChild, testenv.Child, testenv.WaitParked)
	testenv.Main(m)
}
