package fssuite

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ubkit-io/ubkit/fs"
	"github.com/ubkit-io/ubkit/internal/bench"
)

// DemoFigures are what `ubctl demo` shows of one way of loading a file in
// several processes.
type DemoFigures struct {
	// Loads are each process's load time, in the order they loaded.
	Loads []time.Duration
	// PSS is the processes' total proportional set size beyond an idle
	// process's each: the memory the file costs them.
	PSS int64
}

// Demo loads a file of size random bytes (made in a temporary directory
// and removed after) in procs processes at once, holding it, first with
// fs.Open's shared copy and then with os.ReadFile each, and returns both.
func Demo(size int64, procs int) (shared, private DemoFigures, err error) {
	dir, err := os.MkdirTemp("", "ubkit-demo-fs-")
	if err != nil {
		return shared, private, err
	}
	defer os.RemoveAll(dir)
	e := &Env{dir: filepath.Join(dir, "files"), files: map[string]string{}}
	path, err := e.rawFile(size)
	if err != nil {
		return shared, private, err
	}
	run := func(kind string) (DemoFigures, error) {
		var f DemoFigures
		var peers []*bench.Peer
		defer func() {
			for _, p := range peers {
				p.Kill()
			}
			fs.Sweep() // the copy its killed holders could not remove
		}()
		idle, _, err := runLoad(loadArgs{Kind: "idle", Hold: true})
		if err != nil {
			return f, err
		}
		peers = append(peers, idle)
		type started struct {
			p   *bench.Peer
			r   loadReport
			err error
		}
		ch := make(chan started, procs)
		for range procs {
			go func() {
				p, r, err := runLoad(loadArgs{Path: path, Kind: kind, Hold: true})
				ch <- started{p, r, err}
			}()
		}
		var firstErr error
		for range procs {
			s := <-ch
			if s.err != nil {
				firstErr = s.err
				continue
			}
			peers = append(peers, s.p)
			if s.r.Size != size {
				firstErr = fmt.Errorf("a process loaded %d bytes of %d", s.r.Size, size)
			}
			f.Loads = append(f.Loads, time.Duration(s.r.Seconds*float64(time.Second)))
		}
		if firstErr != nil {
			return f, firstErr
		}
		base, err := pss(idle.PID())
		if err != nil {
			return f, err
		}
		for _, p := range peers[1:] {
			v, err := pss(p.PID())
			if err != nil {
				return f, err
			}
			f.PSS += v - base
		}
		return f, nil
	}
	if shared, err = run("ubkit-copy"); err != nil {
		return shared, private, err
	}
	private, err = run("independent")
	return shared, private, err
}
