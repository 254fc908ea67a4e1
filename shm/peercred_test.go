//go:build linux

package shm

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func init() {
	// The dialer of TestPeerCredentials: it connects and waits for the
	// listener to hang up.
	children["peercred-dial"] = func(args []string) error {
		c, err := net.Dial("unix", args[0])
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = io.Copy(io.Discard, c)
		return err
	}
}

// TestPeerCredentials: a listener learns the dialing process's pid, user
// and group, and a closed connection gives an error.
func TestPeerCredentials(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	child := startChild(t, "peercred-dial", path)
	l.SetDeadline(time.Now().Add(time.Minute))
	uc, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	got, err := PeerCredentials(uc)
	if err != nil {
		t.Fatal(err)
	}
	want := Credentials{PID: child.Process.Pid, UID: os.Geteuid(), GID: os.Getegid()}
	if got != want {
		t.Errorf("the dialer's credentials: %+v, want %+v", got, want)
	}
	uc.Close()
	if err := child.Wait(); err != nil {
		t.Errorf("the dialer: %v", err)
	}
	if _, err := PeerCredentials(uc); err == nil {
		t.Error("PeerCredentials of a closed connection succeeded")
	}
}
