// Command shmipc-bench is a two-process baseline benchmark of
// github.com/cloudwego/shmipc-go, used by `ubctl bench` to compare ubkit's
// numbers against an established Go shared-memory IPC library.
//
// Usage:
//
//	shmipc-bench -case <pingpong-64B|stream-64B|stream-1MiB> -duration <dur> [-batch N]
//
// The program re-executes itself as the server process (selected by the
// SHMIPC_BENCH_ROLE environment variable), runs the client in the original
// process and prints exactly one JSON line with the result on stdout.
// Everything else goes to stderr.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	shmipc "github.com/cloudwego/shmipc-go"
)

const (
	envRole   = "SHMIPC_BENCH_ROLE"
	envSock   = "SHMIPC_BENCH_SOCK"
	envCase   = "SHMIPC_BENCH_CASE"
	envBatch  = "SHMIPC_BENCH_BATCH"
	envShmCap = "SHMIPC_BENCH_SHMCAP"
	envVerb   = "SHMIPC_BENCH_VERBOSE"
	envProcs  = "SHMIPC_BENCH_GOMAXPROCS"

	readyLine = "ready"
)

// resultOut is the process's original stdout. File descriptor 1 itself is
// redirected to stderr at startup so that nothing else (in particular
// shmipc-go's internal logger, which writes to os.Stdout) can pollute the
// single JSON line the caller parses.
var resultOut *os.File

var verbose bool

func logf(format string, args ...any) {
	if verbose {
		fmt.Fprintf(os.Stderr, "shmipc-bench[%d]: "+format+"\n", append([]any{os.Getpid()}, args...)...)
	}
}

func main() {
	if err := protectStdout(); err != nil {
		fmt.Fprintf(os.Stderr, "shmipc-bench: %v\n", err)
		os.Exit(1)
	}
	// shmipc-go logs at Warn level to stdout by default; silence it unless
	// the user explicitly asked for its logs via its own env knob.
	if os.Getenv("SHMIPC_LOG_LEVEL") == "" {
		shmipc.SetLogLevel(5) // levelNoPrint
	}
	if os.Getenv(envRole) == "server" {
		if n, err := strconv.Atoi(os.Getenv(envProcs)); err == nil && n > 0 {
			runtime.GOMAXPROCS(n)
		}
		os.Exit(serverMain())
	}
	os.Exit(parentMain())
}

func protectStdout() error {
	fd, err := syscall.Dup(1)
	if err != nil {
		return fmt.Errorf("dup stdout: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.Dup3(2, 1, 0); err != nil {
		return fmt.Errorf("redirect stdout to stderr: %w", err)
	}
	resultOut = os.NewFile(uintptr(fd), "stdout")
	return nil
}

type options struct {
	spec          caseSpec
	duration      time.Duration
	batch         int
	memfd         bool
	shmCap        uint32
	window        int
	gomaxprocs    int
	allowFallback bool
	copyIn        bool
}

type result struct {
	Case   string   `json:"case"`
	Unit   string   `json:"unit"`
	Better string   `json:"better"`
	Value  float64  `json:"value"`
	P50    *float64 `json:"p50,omitempty"`
	P99    *float64 `json:"p99,omitempty"`
	Ops    uint64   `json:"ops"`
}

func parentMain() int {
	fs := flag.NewFlagSet("shmipc-bench", flag.ContinueOnError)
	caseName := fs.String("case", "", "benchmark case: pingpong-64B, stream-64B or stream-1MiB")
	duration := fs.Duration("duration", time.Second, "measured duration (a warm-up of 10% runs first)")
	copyIn := fs.Bool("copy", false, "stream-1MiB: produce each payload in private memory and copy it into the shared buffer (the copy path, like ubkit's stream-1MiB-copy)")
	batch := fs.Int("batch", 64, "stream-64B: messages written into the stream buffer per Flush")
	memmap := fs.String("memmap", "memfd", "shmipc-go MemMapType: memfd (anonymous memory, fds passed over the unix socket; nothing to leak) or devshm (files in a private dir under /dev/shm)")
	shmMiB := fs.Int("shm-mib", 64, "shmipc-go ShareMemoryBufferCap in MiB")
	window := fs.Int("window", 0, "stream cases: max flushes in flight before waiting for the server's ack (0 = auto)")
	gomaxprocs := fs.Int("gomaxprocs", 1, "GOMAXPROCS for both the client and the server process, as in shmipc-go's own examples (0 = Go default)")
	allowFallback := fs.Bool("allow-fallback", false, "do not fail if shmipc-go fell back to sending data over the unix socket")
	fs.BoolVar(&verbose, "v", false, "diagnostics on stderr")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	spec, ok := cases[*caseName]
	if !ok {
		fmt.Fprintf(os.Stderr, "shmipc-bench: unknown or missing -case %q (want pingpong-64B, stream-64B or stream-1MiB)\n", *caseName)
		return 2
	}
	if *duration <= 0 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -duration must be positive\n")
		return 2
	}
	if *batch < 1 || *batch > 1<<16 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -batch must be in [1, 65536]\n")
		return 2
	}
	if *memmap != "devshm" && *memmap != "memfd" {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -memmap must be devshm or memfd\n")
		return 2
	}
	if *shmMiB < 8 || *shmMiB > 4000 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -shm-mib must be in [8, 4000]\n")
		return 2
	}
	if *gomaxprocs < 0 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -gomaxprocs must be >= 0\n")
		return 2
	}
	if *window < 0 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -window must be >= 0\n")
		return 2
	}
	opts := options{
		spec:          spec,
		duration:      *duration,
		batch:         *batch,
		memfd:         *memmap == "memfd",
		shmCap:        uint32(*shmMiB) << 20,
		window:        *window,
		gomaxprocs:    *gomaxprocs,
		allowFallback: *allowFallback,
		copyIn:        *copyIn,
	}
	if !spec.pingpong && slicesAvailable(spec, opts.batch, opts.shmCap) < 4 {
		fmt.Fprintf(os.Stderr, "shmipc-bench: -shm-mib %d is too small for -batch %d (need room for at least 4 flushes)\n", *shmMiB, *batch)
		return 2
	}

	if opts.gomaxprocs > 0 {
		runtime.GOMAXPROCS(opts.gomaxprocs)
	}
	res, err := runParent(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "shmipc-bench: %s: %v\n", spec.name, err)
		return 1
	}
	line, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintf(os.Stderr, "shmipc-bench: %v\n", err)
		return 1
	}
	line = append(line, '\n')
	if _, err := resultOut.Write(line); err != nil {
		fmt.Fprintf(os.Stderr, "shmipc-bench: write result: %v\n", err)
		return 1
	}
	return 0
}

// cleanup collects what must be undone when the parent exits, including on
// SIGINT/SIGTERM: the server child and the temporary directories.
type cleanup struct {
	mu        sync.Mutex
	child     *exec.Cmd
	childDone chan struct{} // closed once child.Wait has returned (child reaped)
	dirs      []string
	done      bool
}

func (c *cleanup) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	if c.child != nil {
		select {
		case <-c.childDone:
		default:
			_ = c.child.Process.Kill()
			select {
			case <-c.childDone: // reaped by the waiter goroutine: no zombie
			case <-time.After(5 * time.Second):
			}
		}
	}
	for i := len(c.dirs) - 1; i >= 0; i-- {
		_ = os.RemoveAll(c.dirs[i])
	}
}

func runParent(opts options) (*result, error) {
	cl := &cleanup{}
	defer cl.run()

	sigCh := make(chan os.Signal, 1)
	signal.Notify(sigCh, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigCh)
	go func() {
		sig, ok := <-sigCh
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "shmipc-bench: interrupted by %v\n", sig)
		cl.run()
		os.Exit(130)
	}()

	// Unix socket in a private temp dir (short path: sun_path is 108 bytes).
	tmpBase := os.TempDir()
	if len(tmpBase) > 64 {
		tmpBase = "/tmp"
	}
	sockDir, err := os.MkdirTemp(tmpBase, "shmipc-bench-")
	if err != nil {
		return nil, fmt.Errorf("create socket dir: %w", err)
	}
	cl.mu.Lock()
	cl.dirs = append(cl.dirs, sockDir)
	cl.mu.Unlock()
	sock := filepath.Join(sockDir, "s.sock")

	// Shared memory: with devshm, shmipc-go creates <prefix>_<pid>_buffer and
	// <prefix>_<pid>_queue_0; put them in a private directory under /dev/shm
	// so that concurrent runs never collide and everything is removed at exit.
	var prefix, shmDir string
	if opts.memfd {
		prefix = "shmipc-bench" // memfd name only; shmipc-go appends the pid
	} else {
		shmDir, err = os.MkdirTemp("/dev/shm", "shmipc-bench-")
		if err != nil {
			return nil, fmt.Errorf("create shm dir: %w", err)
		}
		cl.mu.Lock()
		cl.dirs = append(cl.dirs, shmDir)
		cl.mu.Unlock()
		prefix = filepath.Join(shmDir, "shm")
	}

	child, readyR, stdinW, err := startServer(opts, sock)
	if err != nil {
		return nil, err
	}
	waitCh := make(chan error, 1)
	childDone := make(chan struct{})
	cl.mu.Lock()
	cl.child = child
	cl.childDone = childDone
	cl.mu.Unlock()
	go func() {
		err := child.Wait()
		_ = stdinW.Close()
		close(childDone)
		waitCh <- err
	}()

	if err := waitReady(readyR, waitCh, 15*time.Second); err != nil {
		_ = child.Process.Kill()
		<-waitCh
		return nil, err
	}

	res, clientErr := runClient(opts, sock, prefix)

	// Stop the server: on success it exits by itself after the client's quit
	// frame and the session close; otherwise kill it.
	if clientErr != nil {
		_ = child.Process.Kill()
	}
	var childErr error
	select {
	case childErr = <-waitCh:
	case <-time.After(15 * time.Second):
		_ = child.Process.Kill()
		<-waitCh
		childErr = errors.New("server process did not exit in time (killed)")
	}
	if clientErr != nil {
		return nil, clientErr
	}
	if childErr != nil {
		return nil, fmt.Errorf("server process: %w", childErr)
	}

	if shmDir != "" {
		// shmipc-go unlinks its files asynchronously after Session.Close;
		// give it a moment, then remove whatever is left ourselves.
		deadline := time.Now().Add(time.Second)
		for {
			ents, _ := os.ReadDir(shmDir)
			if len(ents) == 0 || time.Now().After(deadline) {
				if len(ents) != 0 {
					logf("removing %d shm file(s) shmipc-go left in %s", len(ents), shmDir)
				}
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return res, nil
}

func startServer(opts options, sock string) (*exec.Cmd, *os.File, *os.File, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find own executable: %w", err)
	}
	// readiness pipe (child's stdout) and watchdog pipe (child's stdin: EOF
	// means the parent is gone).
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		readyR.Close()
		readyW.Close()
		return nil, nil, nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(),
		envRole+"=server",
		envSock+"="+sock,
		envCase+"="+opts.spec.name,
		envBatch+"="+strconv.Itoa(opts.batch),
		envShmCap+"="+strconv.FormatUint(uint64(opts.shmCap), 10),
		envVerb+"="+strconv.FormatBool(verbose),
		envProcs+"="+strconv.Itoa(opts.gomaxprocs),
	)
	cmd.Stdin = stdinR
	cmd.Stdout = readyW
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	readyW.Close()
	stdinR.Close()
	if err != nil {
		readyR.Close()
		stdinW.Close()
		return nil, nil, nil, fmt.Errorf("start server process: %w", err)
	}
	return cmd, readyR, stdinW, nil
}

func waitReady(r *os.File, waitCh chan error, timeout time.Duration) error {
	lineCh := make(chan error, 1)
	go func() {
		defer r.Close()
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			lineCh <- fmt.Errorf("server process did not report readiness: %w", err)
			return
		}
		if line != readyLine+"\n" {
			lineCh <- fmt.Errorf("unexpected readiness line from server: %q", line)
			return
		}
		lineCh <- nil
	}()
	select {
	case err := <-lineCh:
		return err
	case err := <-waitCh:
		waitCh <- err // let the caller's later receive see it too
		return fmt.Errorf("server process exited before listening: %v", err)
	case <-time.After(timeout):
		return errors.New("timed out waiting for server process to listen")
	}
}
