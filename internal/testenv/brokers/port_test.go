package brokers

import (
	"net"
	"testing"
)

// freePort is a loopback port nothing listens on (as far as anyone can
// tell a moment later).
func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
