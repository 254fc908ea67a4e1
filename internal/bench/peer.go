package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/internal/osproc"
)

const (
	envRole = "UBKIT_BENCH_PEER"
	envArgs = "UBKIT_BENCH_ARGS"
	// EnvProfileDir, when set, makes every peer process write a CPU profile
	// of its first seconds into that directory (`ubctl bench -cpuprofile`).
	EnvProfileDir = "UBKIT_BENCH_PROFILE_DIR"
)

// profileFor starts a CPU profile into path and stops it after
// peerProfileWindow or when the returned function runs, whichever is first.
func profileFor(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	var once sync.Once
	stop := func() { once.Do(func() { pprof.StopCPUProfile(); f.Close() }) }
	time.AfterFunc(peerProfileWindow, stop)
	return stop, nil
}

const peerProfileWindow = 3 * time.Second

var stopProfile = func() {}

// PeerFinished tells the harness a peer has done its measured work and will
// only wait to be killed: its profile, if any, is written now.
func PeerFinished() { stopProfile() }

var peers = map[string]func(args json.RawMessage) error{}

// RegisterPeer names a function a peer process can run. Call it from init.
func RegisterPeer(role string, f func(args json.RawMessage) error) {
	if _, dup := peers[role]; dup {
		panic("bench: peer role registered twice: " + role)
	}
	peers[role] = f
}

// RunPeerIfChild runs the peer role this process was started for, if any,
// and exits. It returns when the process is not a benchmark peer.
func RunPeerIfChild() {
	role := os.Getenv(envRole)
	if role == "" {
		return
	}
	f, ok := peers[role]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench peer: unknown role %q\n", role)
		os.Exit(2)
	}
	if dir := os.Getenv(EnvProfileDir); dir != "" {
		// Peers exit through os.Exit or are killed; profile for a fixed
		// window instead of until exit.
		stop, err := profileFor(filepath.Join(dir, fmt.Sprintf("peer-%s-%d.prof", role, os.Getpid())))
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench peer: %v\n", err)
		} else {
			stopProfile = stop
			defer stop()
		}
	}
	if err := f(json.RawMessage(os.Getenv(envArgs))); err != nil {
		fmt.Fprintf(os.Stderr, "bench peer %s: %v\n", role, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Peer is a running peer process.
type Peer struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the peer exited, err set
	err    error
	// stdout is the read end of the peer's standard output, for peers
	// started with StartPeerPipe. It is this package's own pipe, not
	// exec's, which closes its pipe as soon as the process exits: a peer
	// that prints its result and exits would race the read.
	stdout    *os.File
	closeOnce sync.Once
}

// StartPeerPipe is StartPeer with the peer's standard output connected to
// Stdout, for peers that report something (descriptors, results) there.
func StartPeerPipe(role string, args any) (*Peer, error) {
	return startPeer(role, args, true)
}

// Stdout is the peer's standard output, for peers started with
// StartPeerPipe. What the peer wrote stays readable after it exited, until
// Wait or Kill.
func (p *Peer) Stdout() io.Reader { return p.stdout }

// StartPeer re-executes this program as the peer role with args encoded as
// JSON. The peer dies with its parent.
func StartPeer(role string, args any) (*Peer, error) {
	return startPeer(role, args, false)
}

// StartPeerWrapped is StartPeerPipe for a peer run through wrap (a
// command and its arguments that run the rest, such as `ip netns exec
// NS`), with env added to its environment.
func StartPeerWrapped(wrap []string, role string, args any, env ...string) (*Peer, error) {
	return startPeerWith(wrap, env, role, args, true)
}

func startPeer(role string, args any, pipe bool) (*Peer, error) {
	return startPeerWith(nil, nil, role, args, pipe)
}

func startPeerWith(wrap, env []string, role string, args any, pipe bool) (*Peer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: find own executable: %w", err)
	}
	a, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	argv := append(append([]string{}, wrap...), exe)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), env...), envRole+"="+role, envArgs+"="+string(a))
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	osproc.DieWithParent(cmd)
	var r, w *os.File
	if pipe {
		if r, w, err = os.Pipe(); err != nil {
			return nil, err
		}
		cmd.Stdout = w
	}
	err = cmd.Start()
	if w != nil {
		w.Close() // the peer holds its own copy
	}
	if err != nil {
		if r != nil {
			r.Close()
		}
		return nil, fmt.Errorf("bench: start peer %s: %w", role, err)
	}
	p := &Peer{cmd: cmd, exited: make(chan struct{}), stdout: r}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// Done is closed once the peer has exited; Err then says how.
func (p *Peer) Done() <-chan struct{} { return p.exited }

// Err is the peer's exit error, once Done is closed.
func (p *Peer) Err() error {
	<-p.exited
	return p.err
}

// Wait waits for the peer to exit, closes its standard output and returns
// its error.
func (p *Peer) Wait() error {
	<-p.exited
	err := p.err
	p.closeOnce.Do(func() {
		if p.stdout != nil {
			p.stdout.Close()
		}
	})
	if err != nil {
		return fmt.Errorf("bench peer: %w", err)
	}
	return nil
}

// Kill stops the peer and waits for it.
func (p *Peer) Kill() {
	p.cmd.Process.Kill()
	p.Wait()
}

// PID returns the peer's process id.
func (p *Peer) PID() int { return p.cmd.Process.Pid }
