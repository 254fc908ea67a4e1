package transport

import (
	"context"
	"net"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/ubkit-io/ubkit/transport/mux"
)

// TestMuxStreamsOverShm runs the net.Conn conformance tests on multiplexed
// streams carried by a same-host connection.
func TestMuxStreamsOverShm(t *testing.T) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c1, c2, stop := pipe(t)
		a, b := mux.Client(c1, nil), mux.Server(c2, nil)
		s1, err := a.Open()
		if err != nil {
			return nil, nil, nil, err
		}
		s2, err := b.Accept(context.Background())
		if err != nil {
			return nil, nil, nil, err
		}
		return s1, s2, func() { a.Close(); b.Close(); stop() }, nil
	})
}
