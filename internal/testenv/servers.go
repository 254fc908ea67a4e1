package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/ubkit-io/ubkit/internal/osproc"
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
	return start("redis-server", "redis-server", func(port int, dir string) ([]string, error) {
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--unixsocket", filepath.Join(dir, "redis.sock"), "--unixsocketperm", "700", "--dir", dir,
			"--protected-mode", "no"}, nil
	}, "redis.sock")
}

// StartMemcached starts memcached (Debian package memcached) on a free
// loopback port.
func StartMemcached(extra ...string) (*Server, error) {
	return start("memcached", "memcached", func(port int, dir string) ([]string, error) {
		args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "256"}
		if os.Geteuid() == 0 {
			args = append(args, "-u", "root")
		}
		return append(args, extra...), nil
	}, "")
}

// StartHAProxy starts haproxy (Debian package haproxy) in the foreground
// with the configuration config returns for the free loopback port it is
// to listen on (Addr) and the server's own directory, in which config may
// write the files the configuration names (certificates, keys). The
// configuration must bind that port and nothing else that could be taken.
func StartHAProxy(config func(port int, dir string) (string, error)) (*Server, error) {
	return start("haproxy", "haproxy", func(port int, dir string) ([]string, error) {
		cfg, err := config(port, dir)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "haproxy.cfg")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return nil, err
		}
		// -db: stay in the foreground, so that killing the process ends it.
		return []string{"-db", "-f", path}, nil
	}, "")
}

// start runs command with the arguments args returns for a free loopback
// port and a fresh directory, and waits until it listens there. A port
// another process took meanwhile makes the server exit; start then tries
// again with another, up to 5 times.
func start(command, pkg string, args func(port int, dir string) ([]string, error), socket string) (*Server, error) {
	path, err := lookCommand(command)
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
		argv, err := args(port, dir)
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("testenv: configure %s: %w", command, err)
		}
		s.cmd = exec.Command(path, argv...)
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		// The server dies with the process that started it, even one
		// killed before it could stop the server.
		osproc.DieWithParent(s.cmd)
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

// lookCommand finds command in $PATH, or in the sbin directories a
// minimal $PATH may lack (Debian installs haproxy in /usr/sbin).
func lookCommand(command string) (string, error) {
	path, err := exec.LookPath(command)
	if err == nil {
		return path, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, command)
		if info, statErr := os.Stat(p); statErr == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
