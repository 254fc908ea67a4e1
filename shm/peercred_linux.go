package shm

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Credentials identify the process at the other end of a unix socket.
type Credentials struct {
	PID, UID, GID int
}

// PeerCredentials returns the credentials of the process at the other end
// of conn, as the kernel recorded them when that process connected or
// listened (SO_PEERCRED): the peer cannot lie about them.
func PeerCredentials(conn *net.UnixConn) (Credentials, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return Credentials{}, fmt.Errorf("shm: peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Credentials{}, fmt.Errorf("shm: peer credentials: %w", err)
	}
	if cerr != nil {
		return Credentials{}, fmt.Errorf("shm: peer credentials (SO_PEERCRED): %w", cerr)
	}
	return Credentials{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid)}, nil
}
