package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
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
	// HAProxy relaying to the redis-server.
	h, err := StartHAProxy(func(port int, dir string) (string, error) {
		return fmt.Sprintf("defaults\n\tmode tcp\n\ttimeout connect 5s\n\ttimeout client 1m\n\ttimeout server 1m\n"+
			"frontend f\n\tbind 127.0.0.1:%d\n\tdefault_backend b\nbackend b\n\tserver redis %s\n", port, r.Addr), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, c := range []struct{ network, addr, cmd, want string }{
		{"tcp", r.Addr, "PING\r\n", "+PONG\r\n"},
		{"unix", r.Socket, "PING\r\n", "+PONG\r\n"},
		{"tcp", m.Addr, "version\r\n", "VERSION"},
		{"tcp", h.Addr, "PING\r\n", "+PONG\r\n"},
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

// TestStartHAProxyBadConfig: a configuration HAProxy refuses, or one that
// could not be made, is an error that says so, not a hang.
func TestStartHAProxyBadConfig(t *testing.T) {
	_, err := StartHAProxy(func(port int, dir string) (string, error) {
		return fmt.Sprintf("frontend f\n\tbind 127.0.0.1:%d\n\tno-such-keyword\n", port), nil
	})
	if err == nil || !strings.Contains(err.Error(), "haproxy exited") || !strings.Contains(err.Error(), "no-such-keyword") {
		t.Errorf("a bad configuration: %v", err)
	}
	_, err = StartHAProxy(func(int, string) (string, error) { return "", errors.New("no certificate") })
	if err == nil || !strings.Contains(err.Error(), "configure haproxy: no certificate") {
		t.Errorf("a failed configuration: %v", err)
	}
}

// TestStartMissingServer: a server that is not installed fails naming its
// Debian package.
func TestStartMissingServer(t *testing.T) {
	_, err := start("ubkit-no-such-server", "ubkit-no-such-package", func(int, string) ([]string, error) { return nil, nil }, "")
	if err == nil || !strings.Contains(err.Error(), "ubkit-no-such-server is missing: install the Debian package ubkit-no-such-package") {
		t.Errorf("err = %v", err)
	}
}

// TestPymemcacheVersion: prereqs.sh installs the versions Pymemcache and
// Safetensors look for (a bump of one alone would send every run back to make prereqs).
func TestPymemcacheVersion(t *testing.T) {
	b, err := os.ReadFile("prereqs.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pymemcache_version=" + PymemcacheVersion + " ",
		"safetensors_version=" + SafetensorsVersion + " ", "numpy_version=" + NumpyVersion + " "} {
		if !strings.Contains(string(b), want) {
			t.Errorf("prereqs.sh does not set %q", want)
		}
	}
}

// TestRedisCluster: the cluster is up with every slot assigned, keys
// land on the master CLUSTER KEYSLOT names, and Close leaves nothing.
func TestRedisCluster(t *testing.T) {
	c, err := StartRedisCluster(3)
	if err != nil {
		t.Fatal(err)
	}
	dirs := make([]string, len(c.servers))
	for i, s := range c.servers {
		dirs[i] = s.dir
	}
	for _, addr := range c.Addrs {
		info, err := RedisCommand(addr, "CLUSTER", "INFO")
		if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3") {
			t.Errorf("%s: CLUSTER INFO %q %v", addr, info, err)
		}
	}
	// Slot 0 is the first master's, slot 16383 the last's.
	if _, err := RedisCommand(c.Addrs[0], "SET", "{06S}k", "v"); err != nil { // {06S} hashes to slot 0
		t.Errorf("a key of slot 0 on the first master: %v", err)
	}
	if _, err := RedisCommand(c.Addrs[1], "SET", "{06S}k", "v"); err == nil || !strings.HasPrefix(err.Error(), "MOVED 0 ") {
		t.Errorf("a key of slot 0 on the second master: %v, want MOVED", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", d, err)
		}
	}
}

// TestRedisClusterNeedsRedisCli: without redis-cli, StartRedisCluster
// fails naming the package to install, before it starts anything.
func TestRedisClusterNeedsRedisCli(t *testing.T) {
	server, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is missing: install the Debian package redis-server")
	}
	dir := t.TempDir()
	if err := os.Symlink(server, filepath.Join(dir, "redis-server")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	c, err := StartRedisCluster(3)
	if err == nil {
		c.Close()
		t.Fatal("a cluster started without redis-cli")
	}
	if !strings.Contains(err.Error(), "redis-cli") || !strings.Contains(err.Error(), "redis-tools") {
		t.Errorf("the error does not name redis-cli and its package: %v", err)
	}
}
