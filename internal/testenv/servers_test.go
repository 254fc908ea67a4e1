package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
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

// TestPymemcacheVersion: prereqs.sh installs the version Pymemcache looks
// for (a bump of one alone would send every run back to make prereqs).
func TestPymemcacheVersion(t *testing.T) {
	b, err := os.ReadFile("prereqs.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := "pymemcache_version=" + PymemcacheVersion + " "; !strings.Contains(string(b), want) {
		t.Errorf("prereqs.sh does not set %q", want)
	}
}
