//go:build linux

package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Process identifies a process across pid reuse: a pid and the kernel's start
// time of that process (field 22 of /proc/<pid>/stat, in clock ticks).
type Process struct {
	PID   uint32
	Start uint64
}

var self = sync.OnceValue(func() Process {
	p, err := LookupProcess(os.Getpid())
	if err != nil {
		// /proc is required on Linux; without it liveness checks fall back to
		// the pid alone.
		return Process{PID: uint32(os.Getpid())}
	}
	return p
})

// Self returns the identity of the calling process.
func Self() Process { return self() }

// LookupProcess returns the identity of the live process pid.
func LookupProcess(pid int) (Process, error) {
	start, state, err := procStat(pid)
	if err != nil {
		return Process{}, err
	}
	if state == 'Z' || state == 'X' {
		return Process{}, fmt.Errorf("process %d has exited", pid)
	}
	return Process{PID: uint32(pid), Start: start}, nil
}

// Alive reports whether the process still runs. A zombie (exited but not yet
// reaped) counts as dead, and so does a new process that reused the pid,
// unless /proc cannot tell (not mounted, or hiding the process): then any
// process running with the pid counts as alive, never a live one as dead.
func (p Process) Alive() bool {
	// Identities read back from shared memory carry only the low 32 bits
	// of the start time.
	return alive(p.PID, func(start uint64) bool {
		return p.Start == 0 || start == p.Start || (p.Start <= 0xffffffff && start&0xffffffff == p.Start)
	})
}

// word packs the identity into 64 bits for storage in shared memory: the pid
// in the high half and the low 32 bits of the start time in the low half.
func (p Process) word() uint64 { return uint64(p.PID)<<32 | p.Start&0xffffffff }

func processFromWord(w uint64) Process { return Process{PID: uint32(w >> 32), Start: w & 0xffffffff} }

// aliveWord is Alive for an identity stored with word.
func aliveWord(w uint64) bool {
	p := processFromWord(w)
	return alive(p.PID, func(start uint64) bool { return start&0xffffffff == p.Start })
}

// alive says whether the process pid runs with a start time that match
// accepts. This process answers at once; another is watched through a
// pidfd once seen (watchAlive), else read from /proc.
func alive(pid uint32, match func(start uint64) bool) bool {
	if pid == 0 || pid >= pidMaxLimit {
		// No such process: a word from corrupt memory (the pid, made an
		// int, could even name a process group for kill).
		return false
	}
	if me := Self(); pid == me.PID && me.Start != 0 && match(me.Start) {
		return true
	}
	if a, ok := watchAlive(pid, match); ok {
		return a
	}
	start, state, err := procStat(int(pid))
	if err != nil {
		// Dead when the kernel says no such process; when /proc is
		// unreadable (not mounted, hidden), a missing entry tells nothing,
		// and a process that may run counts as alive: taking a live
		// writer's lock or buffers is worse than waiting.
		if errors.Is(unix.Kill(int(pid), 0), unix.ESRCH) {
			return false
		}
		return !errors.Is(err, os.ErrNotExist) || !procReadable()
	}
	if state == 'Z' || state == 'X' {
		return false
	}
	return match(start)
}

// pidMaxLimit bounds the pids Linux hands out: PID_MAX_LIMIT on 64-bit
// systems, the ceiling of /proc/sys/kernel/pid_max (pids stay below it).
const pidMaxLimit = 1 << 22

// procRoot is where /proc is mounted (tests point it elsewhere).
var procRoot = "/proc"

// procReadable reports whether /proc shows this process, so that a missing
// /proc/<pid> means that no process pid runs.
func procReadable() bool {
	_, err := os.Stat(procRoot + "/self/stat")
	return err == nil
}

// A pidWatch is a pidfd of a process and the start time it had when the
// pidfd was opened. The pidfd turns readable when that process exits, so
// whether it still runs is one poll(2) instead of reading /proc/<pid>/stat
// (open, stat, read, close: about 13 µs on a virtual machine, and the data
// path asks every few milliseconds per peer).
type pidWatch struct {
	fd    int
	start uint64
}

// watches holds the pidfds of the processes Alive was asked about, at
// most maxWatches (any one is closed to make room); off is set once
// pidfds turn out unavailable (an old kernel, a seccomp filter).
var watches struct {
	sync.Mutex
	m   map[uint32]*pidWatch
	off bool
}

const maxWatches = 64

// watchAlive answers alive through a pidfd; ok is false when it cannot
// (no pidfds here, or the watched process exited and the pid may belong to
// another one now: /proc tells).
func watchAlive(pid uint32, match func(start uint64) bool) (alive, ok bool) {
	watches.Lock()
	defer watches.Unlock()
	if watches.off {
		return false, false
	}
	if w := watches.m[pid]; w != nil {
		if exited(w.fd) {
			unix.Close(w.fd)
			delete(watches.m, pid)
			return false, false
		}
		// The process that holds the pid runs: the one asked about, or
		// none (two live processes never share a pid).
		return match(w.start), true
	}
	fd, err := unix.PidfdOpen(int(pid), 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return false, true
	case err != nil:
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			watches.off = true
		}
		return false, false
	}
	// Which process the pidfd holds: its start time, read after the open
	// (if it exited since, the pid may be another's; then do not keep it).
	start, state, err := procStat(int(pid))
	if err != nil && !exited(fd) {
		// It runs, but /proc does not show it (unmounted, or hidepid):
		// which process it is cannot be told, so it counts as alive.
		unix.Close(fd)
		return true, true
	}
	if err != nil || state == 'Z' || state == 'X' || exited(fd) {
		unix.Close(fd)
		return false, false
	}
	if watches.m == nil {
		watches.m = map[uint32]*pidWatch{}
	}
	if len(watches.m) >= maxWatches {
		for k, w := range watches.m {
			unix.Close(w.fd)
			delete(watches.m, k)
			break
		}
	}
	watches.m[pid] = &pidWatch{fd: fd, start: start}
	return match(start), true
}

// exited says whether the process of a pidfd has exited.
func exited(fd int) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || (n > 0 && pfd[0].Revents != 0)
	}
}

func procStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile(procRoot + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name may contain spaces and parentheses: fields start after
	// the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	fields := bytes.Fields(b[i+2:])
	// fields[0] is field 3 (state); start time is field 22.
	if len(fields) < 20 {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	start, err = strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat: %w", pid, err)
	}
	return start, fields[0][0], nil
}

// livenessInterval is how often a blocked waiter checks that its peer lives.
// It bounds how long a waiter takes to notice a dead peer.
const livenessInterval = 20 * time.Millisecond

// Word packs the identity into 64 bits (pid and the low half of the start
// time), for owner and lock words in shared memory. It is never 0 or 1.
func (p Process) Word() uint64 { return p.word() }

// AliveWord reports whether the process a Word names still runs.
func AliveWord(w uint64) bool { return aliveWord(w) }
