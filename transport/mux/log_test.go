package mux

import (
	"context"
	"io"
	"net"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
)

// TestSessionLogs: what a session learns and no call returns goes to
// Config.Logger: a stream of the peer's it refused (Debug), a peer that
// broke the protocol (Warn), and why a session ended (Debug).
func TestSessionLogs(t *testing.T) {
	log, rec := testenv.NewLogRecorder()
	c, s := pair(t, &Config{KeepaliveInterval: -1, MaxStreams: 1, Logger: log})
	first, err := c.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := s.Accept(context.Background()); err != nil {
		t.Fatal(err)
	}
	second, err := c.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	rec.WaitFor(t, "level=DEBUG", "mux: refused a stream", "max=1")
	c.Close()
	rec.WaitFor(t, "level=DEBUG", "mux: session ended")

	// A frame for stream 0 is a protocol error.
	a, b := net.Pipe()
	bad := Server(a, &Config{KeepaliveInterval: -1, Logger: log})
	defer bad.Close()
	go io.Copy(io.Discard, b)
	var h [headerSize]byte
	header{typ: typeData, stream: 0}.encode(h[:])
	b.Write(h[:])
	rec.WaitFor(t, "level=WARN", "mux: the peer broke the protocol")
	b.Close()
}
