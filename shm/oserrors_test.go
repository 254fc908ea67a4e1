//go:build linux

package shm

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestOSErrors: each sentinel matches what the kernel reports in its case,
// as package net and package os return it.
func TestOSErrors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Listen("unix", path); !errors.Is(err, ErrAddrInUse) {
		t.Errorf("a second listen on %s: %v, want ErrAddrInUse", path, err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if c, err := net.Dial("unix", path); !errors.Is(err, ErrConnRefused) {
		if c != nil {
			c.Close()
		}
		t.Errorf("a dial to a socket nobody listens on: %v, want ErrConnRefused", err)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer w.Close()
	if _, err := w.Write([]byte{1}); !errors.Is(err, ErrBrokenPipe) {
		t.Errorf("a write to a pipe without a reader: %v, want ErrBrokenPipe", err)
	}

	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	c, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, err := tl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c.(*net.TCPConn).SetLinger(0) // close with a reset
	c.Close()
	if _, err := s.Read(make([]byte, 1)); !errors.Is(err, ErrConnReset) {
		t.Errorf("a read after the peer reset: %v, want ErrConnReset", err)
	}
}
