package transport

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/ubkit-io/ubkit/internal/rundir"
)

// ensureRegistryDirs is ensureDirs: it makes dir and dir/node (see
// rundir.Ensure) and checks that the latter leaves room for sockets.
func ensureRegistryDirs(dir, node string) error {
	if err := rundir.Ensure(dir, node); err != nil {
		return runtimeDirError(err)
	}
	return checkNodeDir(filepath.Join(dir, node))
}

// runtimeDirError is ensureDirs' error for a registry directory that is
// missing and cannot be made, or is not this user's private directory.
func runtimeDirError(err error) error {
	if errors.Is(err, rundir.ErrNotPrivate) {
		return fmt.Errorf("transport: runtime directory: %w (another user may have made it: "+
			"set %s, or Config.RuntimeDir, to a directory of your own)", err, rundir.Env)
	}
	return fmt.Errorf("transport: runtime directory: %w", err)
}

// minServiceLen is the shortest service name a node's directory must leave
// room for in a socket path.
const minServiceLen = 16

// checkNodeDir fails if a node's registry directory is so long that a
// socket for a service of minServiceLen characters would not fit in a unix
// socket's address.
func checkNodeDir(dir string) error {
	probe := filepath.Join(dir, fmt.Sprintf("%0*d.sock", minServiceLen, 0))
	if err := rundir.CheckSocketPath(probe); err != nil {
		return fmt.Errorf("transport: runtime directory %s is too long for the sockets of its services: %w", dir, err)
	}
	return nil
}
