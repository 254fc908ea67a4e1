package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// RedisCluster is a real Redis Cluster of masters (no replicas), each a
// redis-server on free loopback ports.
type RedisCluster struct {
	// Addrs are the masters' host:port, in the order they were started;
	// redis-cli gives them the slots in that order (the first holds
	// 0-5460 of three).
	Addrs   []string
	servers []*Server
}

// StartRedisCluster starts masters redis-servers with cluster mode on
// (Debian package redis-server), joins them with `redis-cli --cluster
// create` (Debian package redis-tools) and waits until every node reports
// cluster_state:ok and knows every other. Close stops them all.
func StartRedisCluster(masters int) (*RedisCluster, error) {
	if masters < 3 {
		return nil, fmt.Errorf("testenv: a Redis Cluster needs at least 3 masters (redis-cli refuses fewer), not %d", masters)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, errors.New("testenv: redis-cli is missing: install the Debian package redis-tools (make test does)")
	}
	c := &RedisCluster{}
	for range masters {
		s, err := startClusterNode()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.servers = append(c.servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		c.Close()
		return nil, fmt.Errorf("testenv: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitOK(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// startClusterNode starts one redis-server in cluster mode. Its cluster
// bus gets a free port of its own (--cluster-port): the default, the
// client port plus 10000, may be taken or past 65535.
func startClusterNode() (*Server, error) {
	return start("redis-server", "redis-server", func(port int, dir string) ([]string, error) {
		bus, err := freePort()
		if err != nil {
			bus = port + 10000 // the default; start retries if it fails
		}
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no",
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000"}, nil
	}, "")
}

// waitOK polls CLUSTER INFO on every node until each says the cluster is
// ok with every slot assigned and every node known.
func (c *RedisCluster) waitOK(ctx context.Context) error {
	want := []string{"cluster_state:ok", "cluster_slots_assigned:16384",
		"cluster_known_nodes:" + strconv.Itoa(len(c.Addrs))}
	var last string
	for _, addr := range c.Addrs {
		for {
			info, err := RedisCommand(addr, "CLUSTER", "INFO")
			if err == nil && containsAll(info, want) {
				break
			}
			last = fmt.Sprintf("%s: %v %q", addr, err, info)
			select {
			case <-ctx.Done():
				return fmt.Errorf("testenv: the Redis Cluster did not reach cluster_state:ok: %s", last)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Close stops every node and removes their files.
func (c *RedisCluster) Close() error {
	var first error
	for _, s := range c.servers {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
	}
	c.servers = nil
	return first
}

// RedisCommand sends one command to the Redis server at addr in RESP2 and
// returns its reply: a status, integer or bulk string as text; an error
// reply as an error; an array is not read.
func RedisCommand(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("testenv: an empty reply from " + addr)
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 {
			return "", fmt.Errorf("testenv: a bad bulk length from %s: %q", addr, line)
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("testenv: a reply RedisCommand does not read from %s: %q", addr, line)
}
