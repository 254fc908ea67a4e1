//go:build !unix

package osproc

import (
	"fmt"
	"runtime"
)

// StopSelf fails: stopping a process by signal needs a Unix system.
func StopSelf() error {
	return fmt.Errorf("osproc: stopping a process is not supported on %s", runtime.GOOS)
}
