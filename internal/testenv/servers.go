package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Server is a real server process started on a free loopback port.
type Server struct {
	// Addr is host:port on loopback; Socket a unix socket path, if the
	// server listens on one.
	Addr, Socket string
	cmd          *exec.Cmd
	dir          string
	out          *bytes.Buffer
	exited       chan struct{}
}

// Close stops the server and removes its files.
func (s *Server) Close() error {
	s.cmd.Process.Kill()
	<-s.exited
	return os.RemoveAll(s.dir)
}

// StartRedis starts redis-server (Debian package redis-server) with no
// persistence on a free loopback port and a unix socket.
func StartRedis() (*Server, error) {
	return start("redis-server", "redis-server", func(port int, dir string) []string {
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--unixsocket", filepath.Join(dir, "redis.sock"), "--unixsocketperm", "700", "--dir", dir,
			"--protected-mode", "no"}
	}, "redis.sock")
}

// StartMemcached starts memcached (Debian package memcached) on a free
// loopback port.
func StartMemcached(extra ...string) (*Server, error) {
	return start("memcached", "memcached", func(port int, dir string) []string {
		args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "256"}
		if os.Geteuid() == 0 {
			args = append(args, "-u", "root")
		}
		return append(args, extra...)
	}, "")
}

func start(command, pkg string, args func(port int, dir string) []string, socket string) (*Server, error) {
	path, err := exec.LookPath(command)
	if err != nil {
		return nil, fmt.Errorf("testenv: %s is missing: install the Debian package %s (make test does)", command, pkg)
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		dir, err := os.MkdirTemp("", "ubkit-"+command+"-")
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, out: &bytes.Buffer{}}
		if socket != "" {
			s.Socket = filepath.Join(dir, socket)
		}
		s.cmd = exec.Command(path, args(port, dir)...)
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		if err := s.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: start %s: %w", command, err)
		}
		s.exited = make(chan struct{})
		go func() {
			s.cmd.Wait()
			close(s.exited)
		}()
		if lastErr = s.waitReady(); lastErr == nil {
			return s, nil
		}
		s.Close()
	}
	return nil, lastErr
}

// waitReady waits until the server accepts connections (and its socket
// exists), or it exits.
func (s *Server) waitReady() error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("testenv: %s exited: %s", s.cmd.Path, strings.TrimSpace(s.out.String()))
		default:
		}
		if c, err := net.DialTimeout("tcp", s.Addr, 200*time.Millisecond); err == nil {
			c.Close()
			if s.Socket == "" {
				return nil
			}
			if _, err := os.Stat(s.Socket); err == nil {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("testenv: " + s.cmd.Path + " did not start listening within 10 s")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
