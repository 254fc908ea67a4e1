package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
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
// reaped) counts as dead, and so does a new process that reused the pid.
func (p Process) Alive() bool {
	if p.PID == 0 {
		return false
	}
	if p.isSelf() {
		return true
	}
	start, state, err := procStat(int(p.PID))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	if state == 'Z' || state == 'X' {
		return false
	}
	// Identities read back from shared memory carry only the low 32 bits
	// of the start time.
	return p.Start == 0 || start == p.Start || (p.Start <= 0xffffffff && start&0xffffffff == p.Start)
}

// isSelf says whether p is the calling process, which is alive without
// asking /proc (the data path asks often: a peer of the same process, as
// in a simulated super node, would cost a file read every few calls).
func (p Process) isSelf() bool {
	me := Self()
	return p.PID == me.PID && me.Start != 0 && (p.Start == me.Start || (p.Start <= 0xffffffff && p.Start == me.Start&0xffffffff))
}

// word packs the identity into 64 bits for storage in shared memory: the pid
// in the high half and the low 32 bits of the start time in the low half.
func (p Process) word() uint64 { return uint64(p.PID)<<32 | p.Start&0xffffffff }

func processFromWord(w uint64) Process { return Process{PID: uint32(w >> 32), Start: w & 0xffffffff} }

// aliveWord is Alive for an identity stored with word.
func aliveWord(w uint64) bool {
	p := processFromWord(w)
	if p.PID == 0 {
		return false
	}
	if p.isSelf() {
		return true
	}
	start, state, err := procStat(int(p.PID))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	if state == 'Z' || state == 'X' {
		return false
	}
	return start&0xffffffff == p.Start
}

func procStat(pid int) (start uint64, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
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
