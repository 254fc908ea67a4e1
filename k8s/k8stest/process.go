package k8stest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
)

// process is one program of the cluster, its output in a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	waitErr error
}

// startProcess runs bin with args, its output going to <dir>/<name>.log.
// The process dies with this one.
func startProcess(name, bin, dir string, args []string) (*process, error) {
	p := &process{name: name, logPath: filepath.Join(dir, name+".log"), exited: make(chan struct{})}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.Dir = dir
	osproc.DieWithParent(p.cmd)
	err = p.cmd.Start()
	log.Close() // the child has its own copy
	if err != nil {
		return nil, fmt.Errorf("k8stest: start %s (%s): %w", name, bin, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop kills the process and waits for it: nothing it holds outlives a
// test (the data is in the test's temporary directory), so it is not
// asked to shut down gracefully.
func (p *process) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.exited
}

// logTail is the end of the process's log, for error messages.
func (p *process) logTail() string {
	const max = 4 << 10
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
		b = append([]byte("...\n"), b...)
	}
	return string(bytes.TrimSpace(b))
}

// failed describes why the process did not become healthy.
func (p *process) failed(err error) error {
	tail := p.logTail()
	if strings.Contains(tail, "address already in use") {
		err = fmt.Errorf("%w (%w)", err, errPortTaken)
	}
	return fmt.Errorf("k8stest: %s did not start: %w\n--- last lines of %s:\n%s", p.name, err, p.logPath, tail)
}

// errPortTaken marks a start that failed because a process could not
// bind its port: another program took it after freePorts chose it.
var errPortTaken = errors.New("its port was taken")

// running returns nil if the process has not exited, and its failure
// with its log if it has.
func (p *process) running() error {
	select {
	case <-p.exited:
		return p.failed(fmt.Errorf("it exited (%v)", p.waitErr))
	default:
		return nil
	}
}

// checkEtcdName checks that the etcd answering at url is this process,
// by its member name: another program may hold the port (then this etcd
// could not bind it). Any failure here counts as that, so that the start
// is tried again on other ports.
func (p *process) checkEtcdName(ctx context.Context, url, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	taken := func(err error) error {
		if exited := p.running(); exited != nil {
			return fmt.Errorf("%w (%w)", exited, errPortTaken)
		}
		return p.failed(fmt.Errorf("%w: the etcd at %s: %w", errPortTaken, url, err))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v3/cluster/member/list", strings.NewReader("{}"))
	if err != nil {
		return p.failed(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return taken(fmt.Errorf("its member list: %w", err))
	}
	defer resp.Body.Close()
	var list struct {
		Members []struct {
			Name string `json:"name"`
		} `json:"members"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return taken(fmt.Errorf("its member list (%s): %w", resp.Status, err))
	}
	if len(list.Members) != 1 || list.Members[0].Name != name {
		return taken(fmt.Errorf("its members are %+v, not %s alone", list.Members, name))
	}
	return nil
}

// waitHealthy polls url (a health endpoint: nothing else tells when a
// component is ready) until it answers 200, the process exits or timeout
// passes.
func (p *process) waitHealthy(ctx context.Context, client *http.Client, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer client.CloseIdleConnections()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return p.failed(err)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
		}
		last = err
		select {
		case <-p.exited:
			return p.failed(fmt.Errorf("it exited (%v)", p.waitErr))
		case <-ctx.Done():
			return p.failed(fmt.Errorf("not healthy within %v: %w", timeout, last))
		case <-tick.C:
		}
	}
}

// healthClient is an HTTPS client that trusts the cluster's CA and, when
// cert is given, presents it.
func healthClient(caPEM []byte, cert *tls.Certificate, insecure bool) *http.Client {
	pool := newCertPool(caPEM)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if insecure {
		// The controller-manager and scheduler serve with certificates
		// they make themselves; their /healthz is open to anyone.
		cfg.InsecureSkipVerify = true //nolint:gosec // a local test process's health endpoint
	}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// freePorts returns n distinct loopback ports that were free a moment
// ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("k8stest: a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func hostPort(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
