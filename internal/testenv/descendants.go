package testenv

import (
	"bufio"
	"fmt"
	"github.com/ubkit-io/ubkit/internal/osproc"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/ubkit-io/ubkit/shm"
)

// Main tells the segments its run left from other processes' by their
// creator (shm.Segment.Creator). Its own are easy; those of the processes
// it started are told by a file that every process of the test binary
// started under the Main, by any route (Child, a provider's conformance
// peers, benchmark peers), writes its identity to when it starts: the
// environment names it, and children inherit it. A process that cannot
// write it (another user's) makes no segments of this user.

func init() {
	if path := os.Getenv(descendantsEnv); path != "" {
		recordSelf(path)
	}
}

// recordSelf appends this process's identity to the file at path. One
// short write in append mode does not interleave with other writers'.
func recordSelf(path string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	me := shm.Self()
	fmt.Fprintf(f, "%d %d\n", me.PID, me.Start)
	f.Close()
}

// readDescendants returns the identities recorded in the file at path.
func readDescendants(path string) ([]shm.Process, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []shm.Process
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pidText, startText, ok := strings.Cut(sc.Text(), " ")
		pid, perr := strconv.ParseUint(pidText, 10, 32)
		start, serr := strconv.ParseUint(startText, 10, 64)
		if !ok || perr != nil || serr != nil {
			return nil, fmt.Errorf("testenv: %s: bad line %q", path, sc.Text())
		}
		out = append(out, shm.Process{PID: uint32(pid), Start: start})
	}
	return out, sc.Err()
}

// sameProcess reports whether creator, an identity read back from a
// segment (which keeps the low 32 bits of the start time), is p.
func sameProcess(creator, p shm.Process) bool {
	return creator.PID == p.PID && creator.Start == p.Start&0xffffffff
}

// killedChildren holds the pids of children started with Child or its
// variants that a signal ended. A process killed on purpose leaves its
// segments behind, as a crashed one does; Main removes those with
// shm.Sweep instead of counting them as leaks.
var killedChildren = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// noteKilled records cmd's pid if a signal ended it.
func noteKilled(cmd *exec.Cmd) {
	if cmd.ProcessState == nil {
		return
	}
	if osproc.Signaled(cmd.ProcessState) {
		killedChildren.Lock()
		killedChildren.pids[cmd.Process.Pid] = true
		killedChildren.Unlock()
	}
}

func killed(pid uint32) bool {
	killedChildren.Lock()
	defer killedChildren.Unlock()
	return killedChildren.pids[int(pid)]
}
