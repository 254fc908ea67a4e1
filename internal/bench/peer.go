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
	done   chan error
	stdout io.Reader
}

// StartPeerPipe is StartPeer with the peer's standard output connected to
// Stdout, for peers that report something (descriptors, results) there.
func StartPeerPipe(role string, args any) (*Peer, error) {
	return startPeer(role, args, true)
}

// Stdout is the peer's standard output, for peers started with
// StartPeerPipe.
func (p *Peer) Stdout() io.Reader { return p.stdout }

// StartPeer re-executes this program as the peer role with args encoded as
// JSON. The peer dies with its parent.
func StartPeer(role string, args any) (*Peer, error) {
	return startPeer(role, args, false)
}

func startPeer(role string, args any, pipe bool) (*Peer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: find own executable: %w", err)
	}
	a, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envRole+"="+role, envArgs+"="+string(a))
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	osproc.DieWithParent(cmd)
	var stdout io.Reader
	if pipe {
		cmd.Stdout = nil
		r, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		stdout = r
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start peer %s: %w", role, err)
	}
	p := &Peer{cmd: cmd, done: make(chan error, 1), stdout: stdout}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// Done is closed-over by a receive when the peer exits; it yields its exit
// error.
func (p *Peer) Done() <-chan error { return p.done }

// Wait waits for the peer to exit and returns its error.
func (p *Peer) Wait() error {
	err := <-p.done
	p.done <- err
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
