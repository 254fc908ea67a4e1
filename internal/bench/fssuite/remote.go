package fssuite

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/fs"
	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/transport"
	_ "github.com/ubkit-io/ubkit/ub/provider/tcpprov" // the ub path between the namespaces
)

// remote-1GiB: a file on node n0, in one network namespace, read from
// node n1 in another (two hosts joined by a veth pair), by OpenRemote over
// transport's ub path with the tcp provider, against a plain TCP copy of
// the file between the same two namespaces (the server sends it with
// io.Copy, which is sendfile; the client reads it into memory). Both sum
// every byte.

// netnsReady reports whether this process can make network namespaces
// (root and `ip`), which remote-1GiB needs.
func netnsReady() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("remote-1GiB needs root for its two network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		if _, err2 := os.Stat("/usr/sbin/ip"); err2 != nil {
			return fmt.Errorf("remote-1GiB needs the ip command (Debian package iproute2)")
		}
	}
	return nil
}

// remoteEnv is remote-1GiB's two hosts, made on first use.
type remoteEnv struct {
	once    sync.Once
	err     error
	pair    *testenv.NetnsPair
	dir     string
	envB    []string
	file    string // the file's name in the export
	tcpAddr string // the plain TCP server's address
	peers   []*bench.Peer
}

func (e *Env) remoteSetup() (*remoteEnv, error) {
	r := &e.remote
	r.once.Do(func() { r.err = r.setup(e) })
	return r, r.err
}

func (r *remoteEnv) setup(e *Env) error {
	path, err := e.rawFile(e.gib)
	if err != nil {
		return err
	}
	if r.pair, err = testenv.OpenNetnsPair(); err != nil {
		return err
	}
	if r.dir, err = os.MkdirTemp("", "ubkit-bench-fs-remote-"); err != nil {
		return err
	}
	topo, err := testenv.TwoHostTopology(r.dir, "sn1", r.pair.AddrA, r.pair.AddrB)
	if err != nil {
		return err
	}
	ca, err := testenv.NewNodeCA(r.dir, "ca")
	if err != nil {
		return err
	}
	env := func(node, addr string) ([]string, error) {
		id, err := ca.Issue("sn1", node)
		return append(id, "UB_TOPOLOGY="+topo, "UB_NODE="+node, "UB_PROVIDER=tcp", "UB_TCP_LISTEN="+addr+":0",
			"UBKIT_RUNTIME_DIR="+filepath.Join(r.dir, node)), err
	}
	envA, err := env("n0", r.pair.AddrA)
	if err != nil {
		return err
	}
	if r.envB, err = env("n1", r.pair.AddrB); err != nil {
		return err
	}
	r.file = filepath.Base(path)
	wrapA := []string{"ip", "netns", "exec", r.pair.A}
	exp, err := bench.StartPeerWrapped(wrapA, "fs-export", serveArgs{Dir: filepath.Dir(path)}, envA...)
	if err != nil {
		return err
	}
	r.peers = append(r.peers, exp)
	if line, err := bufio.NewReader(exp.Stdout()).ReadString('\n'); err != nil || line != "listening\n" {
		return fmt.Errorf("export in %s: %q, %v", r.pair.A, line, err)
	}
	srv, err := bench.StartPeerWrapped(wrapA, "fs-tcp-serve", serveArgs{Path: path, Addr: r.pair.AddrA})
	if err != nil {
		return err
	}
	r.peers = append(r.peers, srv)
	line, err := bufio.NewReader(srv.Stdout()).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening ") {
		return fmt.Errorf("TCP server in %s: %q, %v", r.pair.A, line, err)
	}
	r.tcpAddr = strings.TrimSpace(strings.TrimPrefix(line, "listening "))
	return nil
}

func (r *remoteEnv) close() {
	for _, p := range r.peers {
		p.Kill()
	}
	if r.pair != nil {
		r.pair.Close()
	}
	if r.dir != "" {
		os.RemoveAll(r.dir)
	}
}

// serveArgs tell the serving peers what to serve.
type serveArgs struct {
	Dir  string `json:"dir,omitempty"`
	Path string `json:"path,omitempty"`
	Addr string `json:"addr,omitempty"`
}

func init() {
	bench.RegisterPeer("fs-export", func(raw json.RawMessage) error {
		var a serveArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		ex, err := fs.Export(a.Dir, nil)
		if err != nil {
			return err
		}
		l, err := transport.Listen(context.Background(), "ub://n0/models")
		if err != nil {
			return err
		}
		fmt.Println("listening")
		return ex.Serve(l)
	})
	bench.RegisterPeer("fs-tcp-serve", func(raw json.RawMessage) error {
		var a serveArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		l, err := net.Listen("tcp", net.JoinHostPort(a.Addr, "0"))
		if err != nil {
			return err
		}
		fmt.Println("listening", l.Addr())
		for {
			c, err := l.Accept()
			if err != nil {
				return err
			}
			go func() {
				defer c.Close()
				f, err := os.Open(a.Path)
				if err != nil {
					return
				}
				defer f.Close()
				io.Copy(c, f) // sendfile
			}()
		}
	})
}

// remoteRun is a remote-1GiB contender: a fresh process in the second
// namespace loads the file the kind way ("remote" or "tcp-copy").
func (e *Env) remoteRun(kind string) func(time.Duration) (bench.Measurement, error) {
	return func(time.Duration) (bench.Measurement, error) {
		r, err := e.remoteSetup()
		if err != nil {
			return bench.Measurement{}, err
		}
		a := loadArgs{Kind: kind, Path: "ub://n0/models/" + r.file, Size: e.gib}
		if kind == "tcp-copy" {
			a.Path = r.tcpAddr
		}
		p, err := bench.StartPeerWrapped([]string{"ip", "netns", "exec", r.pair.B}, "fs-load", a, r.envB...)
		if err != nil {
			return bench.Measurement{}, err
		}
		var rep loadReport
		line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
		if err == nil {
			err = json.Unmarshal([]byte(line), &rep)
		}
		if werr := p.Wait(); err == nil {
			err = werr
		}
		if err != nil {
			return bench.Measurement{}, fmt.Errorf("%s: %q: %v", kind, line, err)
		}
		if err := e.checkSum("remote", rep); err != nil {
			return bench.Measurement{}, fmt.Errorf("%s: %w", kind, err)
		}
		return bench.Measurement{Value: gbps(rep.Size, time.Duration(rep.Seconds*float64(time.Second)))}, nil
	}
}

// loadRemote is the fs-load peer's "remote" and "tcp-copy" kinds: it
// returns the bytes read (and what releases them), and when the attempt
// that read them began.
func loadRemote(a loadArgs) ([]byte, func(), time.Time, error) {
	start := time.Now()
	switch a.Kind {
	case "remote":
		// The export's registry may not listen yet on the first run:
		// polled, with a deadline; the time counts from the attempt that
		// succeeded.
		var f *fs.File
		var err error
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(20 * time.Second); ; <-tick.C {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			start = time.Now()
			f, err = fs.OpenRemote(ctx, a.Path, nil)
			cancel()
			if err == nil || time.Now().After(end) {
				break
			}
		}
		if err != nil {
			return nil, nil, start, err
		}
		return f.Bytes(), func() { f.Close() }, start, nil
	default: // tcp-copy
		c, err := net.Dial("tcp", a.Path)
		if err != nil {
			return nil, nil, start, err
		}
		defer c.Close()
		b := make([]byte, a.Size)
		if _, err := io.ReadFull(c, b); err != nil {
			return nil, nil, start, err
		}
		return b, func() {}, start, nil
	}
}
