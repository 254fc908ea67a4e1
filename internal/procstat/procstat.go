// Package procstat reads what this process holds from /proc: open file
// descriptors, memory mappings, resident memory. Leak tests and the
// connect-close benchmark compare them before and after; it is for
// ubkit's own tests and benchmarks, Linux only.
package procstat

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// Usage is what the process holds at one moment.
type Usage struct {
	FDs        int // open file descriptors
	Mappings   int // memory mappings, the runtime's own included
	Shared     int // mappings of shared memory: ubkit segments, memfds and /dev/shm files
	Goroutines int
	RSS        int64 // resident set size, bytes
}

// Read returns the process's usage now.
func Read() (Usage, error) {
	u, err := read("/proc/self")
	// ReadDir's own descriptor was open while it read.
	u.FDs--
	u.Goroutines = runtime.NumGoroutine()
	return u, err
}

// Of returns the usage of process pid (of this user) now; Goroutines is 0.
func Of(pid int) (Usage, error) { return read("/proc/" + strconv.Itoa(pid)) }

func read(proc string) (Usage, error) {
	var u Usage
	fds, err := os.ReadDir(proc + "/fd")
	if err != nil {
		return u, fmt.Errorf("procstat: %w", err)
	}
	u.FDs = len(fds)
	maps, err := os.ReadFile(proc + "/maps")
	if err != nil {
		return u, fmt.Errorf("procstat: %w", err)
	}
	for line := range bytes.Lines(maps) {
		u.Mappings++
		if bytes.Contains(line, []byte("/dev/shm/")) || bytes.Contains(line, []byte("/memfd:")) {
			u.Shared++
		}
	}
	u.RSS, err = rss(proc)
	return u, err
}

// RSS returns the process's resident set size in bytes.
func RSS() (int64, error) { return rss("/proc/self") }

func rss(proc string) (int64, error) {
	f, err := os.Open(proc + "/status")
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("procstat: VmRSS %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("procstat: no VmRSS in %s/status", proc)
}

// Add is u and v together (of two processes).
func (u Usage) Add(v Usage) Usage {
	return Usage{FDs: u.FDs + v.FDs, Mappings: u.Mappings + v.Mappings, Shared: u.Shared + v.Shared,
		Goroutines: u.Goroutines + v.Goroutines, RSS: u.RSS + v.RSS}
}

// Sub is what u holds beyond before.
func (u Usage) Sub(before Usage) Usage {
	return Usage{FDs: u.FDs - before.FDs, Mappings: u.Mappings - before.Mappings, Shared: u.Shared - before.Shared,
		Goroutines: u.Goroutines - before.Goroutines, RSS: u.RSS - before.RSS}
}

func (u Usage) String() string {
	return fmt.Sprintf("%d fds, %d mappings (%d of shared memory), %d goroutines, %.1f MiB resident",
		u.FDs, u.Mappings, u.Shared, u.Goroutines, float64(u.RSS)/(1<<20))
}

// Within reports whether u holds at most slack more descriptors, shared
// mappings and goroutines than start.
func (u Usage) Within(start, slack Usage) bool {
	d := u.Sub(start)
	return d.FDs <= slack.FDs && d.Shared <= slack.Shared && d.Goroutines <= slack.Goroutines
}

// RSSSlack is how much resident memory a leak check should allow to grow
// where a leak-free run grows by up to plain: under the race detector, 64
// MiB more, for its shadow memory grows with every heap address the
// process touches and is never given back.
func RSSSlack(plain int64) int64 {
	if race {
		return plain + 64<<20
	}
	return plain
}

// Compact returns the usage after the runtime gave the memory it holds
// free back to the system (debug.FreeOSMemory), so RSS counts what is in
// use.
func Compact() (Usage, error) {
	debug.FreeOSMemory()
	return Read()
}

// Returned waits up to timeout for the usage to come back Within slack of
// before (goroutines of closed connections end, and descriptors close, a
// moment after Close returns), and returns it, read with Compact. It
// fails if it did not come back, or if resident memory grew by more than
// slack.RSS (when not 0).
func Returned(before, slack Usage, timeout time.Duration) (Usage, error) {
	deadline := time.Now().Add(timeout)
	for {
		u, err := Read()
		if err != nil {
			return u, err
		}
		if u.Within(before, slack) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	u, err := Compact()
	if err != nil {
		return u, err
	}
	if !u.Within(before, slack) || (slack.RSS > 0 && u.RSS-before.RSS > slack.RSS) {
		return u, fmt.Errorf("procstat: %v more than before (%v)", u.Sub(before), before)
	}
	return u, nil
}

// clockTick is the unit of /proc/PID/stat's times: USER_HZ, 100 on every
// Linux ABI Go supports.
const clockTick = 10 * time.Millisecond

// CPU returns the processor time process pid (of this user) has used so
// far, user and system, its ended threads included.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	return parseCPU(b)
}

// parseCPU reads utime and stime, the 14th and 15th fields of a
// /proc/PID/stat line, counting from after the command's closing
// parenthesis (the command may hold spaces and parentheses).
func parseCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("procstat: a stat line without a command: %q", stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is the 3rd field (state): utime is f[11], stime f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("procstat: a stat line of %d fields", len(f)+2)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("procstat: a stat time %q", s)
		}
		ticks += n
	}
	return time.Duration(ticks) * clockTick, nil
}
