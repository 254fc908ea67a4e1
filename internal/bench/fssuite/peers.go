package fssuite

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	mmap "github.com/edsrzf/mmap-go"

	"github.com/ubkit-io/ubkit/fs"
	"github.com/ubkit-io/ubkit/fs/safetensors"
	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// loadArgs tell a load peer what to load and how.
type loadArgs struct {
	Path string `json:"path"`
	Kind string `json:"kind"`
	Hold bool   `json:"hold"`           // print "ready", then wait to be killed
	Size int64  `json:"size,omitempty"` // tcp-copy: the file's size
}

// loadReport is a load peer's answer.
type loadReport struct {
	Seconds float64 `json:"seconds"`
	Size    int64   `json:"size"`
	Sum     uint64  `json:"sum"`
}

func init() {
	bench.RegisterPeer("fs-load", func(raw json.RawMessage) error {
		var a loadArgs
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		return loadPeer(a)
	})
}

// loadPeer loads a.Path the a.Kind way, sums every byte, and reports.
func loadPeer(a loadArgs) error {
	start := time.Now()
	var (
		sum     uint64
		size    int64
		release = func() {}
	)
	switch a.Kind {
	case "ubkit", "ubkit-copy":
		var o *fs.Options
		if a.Kind == "ubkit-copy" {
			o = &fs.Options{Method: fs.Copy}
		}
		f, err := fs.Open(context.Background(), a.Path, o)
		if err != nil {
			return err
		}
		sum, size, release = Sum(f.Bytes()), f.Size(), func() { f.Close() }
	case "safetensors":
		f, err := safetensors.Open(context.Background(), a.Path, nil)
		if err != nil {
			return err
		}
		for _, t := range f.Tensors {
			sum += Sum(t.Data)
			size += int64(len(t.Data))
		}
		release = func() { f.Close() }
	case "mmap-populate":
		f, err := os.Open(a.Path)
		if err != nil {
			return err
		}
		m, err := mmap.Map(f, mmap.RDONLY, 0)
		f.Close()
		if err != nil {
			return err
		}
		if err := shm.Advise(m, shm.AdvisePopulateRead); err != nil {
			return err
		}
		sum, size, release = Sum(m), int64(len(m)), func() { m.Unmap() }
	case "os-readfile", "independent":
		b, err := os.ReadFile(a.Path)
		if err != nil {
			return err
		}
		sum, size = Sum(b), int64(len(b))
		release = func() { _ = b[0] }
	case "read-loop":
		f, err := os.Open(a.Path)
		if err != nil {
			return err
		}
		buf := make([]byte, 1<<20)
		for {
			n, err := io.ReadFull(f, buf)
			sum += bench.Sum(buf[:n])
			size += int64(n)
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				break
			}
			if err != nil {
				f.Close()
				return err
			}
		}
		f.Close()
	case "remote", "tcp-copy":
		b, rel, began, err := loadRemote(a)
		if err != nil {
			return err
		}
		start = began
		sum, size, release = Sum(b), int64(len(b)), rel
	case "idle":
	default:
		return fmt.Errorf("fs-load: unknown kind %q", a.Kind)
	}
	took := time.Since(start)
	if err := json.NewEncoder(os.Stdout).Encode(loadReport{Seconds: took.Seconds(), Size: size, Sum: sum}); err != nil {
		return err
	}
	bench.PeerFinished() // its profile, if asked for, is written now
	if a.Hold {
		select {} // killed by the harness, holding what it loaded
	}
	release()
	return nil
}

// runLoad starts a load peer and returns its report.
func runLoad(a loadArgs) (*bench.Peer, loadReport, error) {
	p, err := bench.StartPeerPipe("fs-load", a)
	if err != nil {
		return nil, loadReport{}, err
	}
	var r loadReport
	line, err := bufio.NewReader(p.Stdout()).ReadString('\n')
	if err == nil {
		err = json.Unmarshal([]byte(line), &r)
	}
	if err != nil {
		p.Kill()
		return nil, r, fmt.Errorf("fs-load %s: %q: %v (%v)", a.Kind, line, err, p.Err())
	}
	return p, r, nil
}

// checkSum keeps the first sum reported for path and fails a run whose
// sum differs: every contender must have read the same bytes.
func (e *Env) checkSum(key string, r loadReport) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sums == nil {
		e.sums = map[string]loadReport{}
	}
	want, ok := e.sums[key]
	if !ok {
		e.sums[key] = r
		return nil
	}
	if want.Sum != r.Sum || want.Size != r.Size {
		return fmt.Errorf("read %d bytes summing to %#x; another contender read %d summing to %#x", r.Size, r.Sum, want.Size, want.Sum)
	}
	return nil
}

// loadRun is a contender that loads the file of the kind way once per
// run, after dropping it from the page cache if cold.
func (e *Env) loadRun(kind string, file func() (string, error), cold bool) func(time.Duration) (bench.Measurement, error) {
	return func(time.Duration) (bench.Measurement, error) {
		path, err := file()
		if err != nil {
			return bench.Measurement{}, err
		}
		if cold {
			if err := fs.Evict(path); err != nil {
				return bench.Measurement{}, err
			}
		}
		p, r, err := runLoad(loadArgs{Path: path, Kind: kind})
		if err != nil {
			return bench.Measurement{}, err
		}
		if err := p.Wait(); err != nil {
			return bench.Measurement{}, err
		}
		if err := e.checkSum(path+"/"+map[bool]string{true: "tensors", false: "whole"}[kind == "safetensors"], r); err != nil {
			return bench.Measurement{}, fmt.Errorf("%s: %w", kind, err)
		}
		return bench.Measurement{Value: gbps(r.Size, time.Duration(r.Seconds*float64(time.Second)))}, nil
	}
}

// sharedRun is shared-4proc's contender: four processes load the file the
// kind way and hold it; the value is their total PSS beyond an idle
// process's each, in file sizes.
func (e *Env) sharedRun(file func() (string, error), kind string) func(time.Duration) (bench.Measurement, error) {
	return func(time.Duration) (bench.Measurement, error) {
		path, err := file()
		if err != nil {
			return bench.Measurement{}, err
		}
		var peers []*bench.Peer
		defer func() {
			for _, p := range peers {
				p.Kill()
			}
			fs.Sweep() // a shared copy its killed holders could not remove
		}()
		idle, _, err := runLoad(loadArgs{Kind: "idle", Hold: true})
		if err != nil {
			return bench.Measurement{}, err
		}
		peers = append(peers, idle)
		var size int64
		for range 4 {
			p, r, err := runLoad(loadArgs{Path: path, Kind: kind, Hold: true})
			if err != nil {
				return bench.Measurement{}, err
			}
			peers = append(peers, p)
			size = r.Size
		}
		base, err := pss(idle.PID())
		if err != nil {
			return bench.Measurement{}, err
		}
		var total int64
		for _, p := range peers[1:] {
			v, err := pss(p.PID())
			if err != nil {
				return bench.Measurement{}, err
			}
			total += v - base
		}
		return bench.Measurement{Value: float64(total) / float64(size)}, nil
	}
}

// pss is a process's proportional set size in bytes (/proc/PID/smaps_rollup).
func pss(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "Pss:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no Pss in smaps_rollup")
}

// pythonLoad is run by python3 with safetensors and numpy: it loads argv[1]
// with load_file or safe_open (argv[2]), sums every tensor's bytes as
// little-endian 8-byte words (a tail byte by byte, as Sum does), and
// prints the time it took and the sum as JSON.
const pythonLoad = `
import json, sys, time
import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open

def tsum(a):
    b = a.reshape(-1).view(np.uint8)
    n8 = len(b) // 8 * 8
    s = int(b[:n8].view(np.uint64).sum(dtype=np.uint64)) if n8 else 0
    return s + int(b[n8:].sum(dtype=np.uint64)), len(b)

path, mode = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
total, size = 0, 0
if mode == "load_file":
    for a in load_file(path).values():
        s, n = tsum(a)
        total, size = total + s, size + n
else:
    with safe_open(path, framework="np") as f:
        for k in f.keys():
            s, n = tsum(f.get_tensor(k))
            total, size = total + s, size + n
t1 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "size": size, "sum": total % (1 << 64)}))
`

// pythonWrite writes argv[1], a safetensors file of about argv[2] bytes in
// tensors of several dtypes and sizes, with Python's safetensors.
const pythonWrite = `
import sys
import numpy as np
from safetensors.numpy import save_file
path, total = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(19)
tensors, size, i = {}, 0, 0
kinds = [(np.float16, 8 << 20), (np.float32, 16 << 20), (np.uint8, 3 << 20), (np.float32, 4096), (np.int64, 24 << 10)]
while size < total:
    dt, nbytes = kinds[i % len(kinds)]
    nbytes = min(nbytes, total - size)
    n = max(1, nbytes // np.dtype(dt).itemsize)
    tensors["model.layers.%d.w" % i] = rng.integers(0, 255, size=n * np.dtype(dt).itemsize, dtype=np.uint8).view(dt)
    size += n * np.dtype(dt).itemsize
    i += 1
save_file(tensors, path, metadata={"written_by": "ubctl bench fs"})
`

// pythonEnv returns the python3 and PYTHONPATH with safetensors and numpy
// (installed by make prereqs under the cache directory).
func (e *Env) pythonEnv() (string, string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.pyReady {
		return e.python, e.pyPath, e.pyErr
	}
	e.pyReady = true
	e.python, e.pyPath, e.pyErr = testenv.Safetensors()
	return e.python, e.pyPath, e.pyErr
}

// safetensorsFile returns the suite's 1 GiB safetensors file, written by
// Python's safetensors once.
func (e *Env) safetensorsFile() (string, error) {
	size := e.gib
	path := filepath.Join(e.dir, fmt.Sprintf("model-%d.safetensors", size))
	e.mu.Lock()
	_, made := e.files[path]
	e.mu.Unlock()
	if made {
		return path, nil
	}
	if _, err := os.Stat(path); err != nil {
		python, pypath, err := e.pythonEnv()
		if err != nil {
			return "", err
		}
		if err := os.MkdirAll(e.dir, 0o755); err != nil {
			return "", err
		}
		fmt.Fprintf(os.Stderr, "fs suite: writing a %d MiB safetensors file with Python's safetensors (once)\n", size>>20)
		tmp := path + ".tmp"
		if out, err := e.python3(python, pypath, pythonWrite, tmp, strconv.FormatInt(size, 10)); err != nil {
			os.Remove(tmp)
			return "", fmt.Errorf("writing %s: %v: %s", path, err, out)
		}
		if err := os.Rename(tmp, path); err != nil {
			return "", err
		}
	}
	e.mu.Lock()
	e.files[path] = path
	e.mu.Unlock()
	return path, nil
}

// python3 runs script with args.
func (e *Env) python3(python, pypath, script string, args ...string) ([]byte, error) {
	cmd := exec.Command(python, append([]string{"-c", script}, args...)...)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pypath)
	cmd.Stderr = os.Stderr
	return cmd.Output()
}

// pythonRun is a contender that loads the safetensors file with Python's
// safetensors (mode load_file or safe_open) and sums every tensor.
func (e *Env) pythonRun(mode string, cold bool) func(time.Duration) (bench.Measurement, error) {
	return func(time.Duration) (bench.Measurement, error) {
		path, err := e.safetensorsFile()
		if err != nil {
			return bench.Measurement{}, err
		}
		python, pypath, err := e.pythonEnv()
		if err != nil {
			return bench.Measurement{}, err
		}
		if cold {
			if err := fs.Evict(path); err != nil {
				return bench.Measurement{}, err
			}
		}
		out, err := e.python3(python, pypath, pythonLoad, path, mode)
		if err != nil {
			return bench.Measurement{}, fmt.Errorf("python %s: %v", mode, err)
		}
		var r loadReport
		if err := json.Unmarshal(out, &r); err != nil {
			return bench.Measurement{}, fmt.Errorf("python %s said %q: %v", mode, out, err)
		}
		if err := e.checkSum(path+"/tensors", r); err != nil {
			return bench.Measurement{}, fmt.Errorf("python %s: %w", mode, err)
		}
		return bench.Measurement{Value: gbps(r.Size, time.Duration(r.Seconds*float64(time.Second)))}, nil
	}
}
