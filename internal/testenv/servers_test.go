package testenv

import (
	"bufio"
	"fmt"
	"net"
	"testing"
)

func TestServers(t *testing.T) {
	r, err := StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := StartMemcached()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, c := range []struct{ network, addr, cmd, want string }{
		{"tcp", r.Addr, "PING\r\n", "+PONG\r\n"},
		{"unix", r.Socket, "PING\r\n", "+PONG\r\n"},
		{"tcp", m.Addr, "version\r\n", "VERSION"},
	} {
		conn, err := net.Dial(c.network, c.addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(conn, c.cmd)
		line, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil || len(line) < len(c.want) || line[:len(c.want)] != c.want {
			t.Errorf("%s %s: %q %v", c.network, c.addr, line, err)
		}
	}
}
