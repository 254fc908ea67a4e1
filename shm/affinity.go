//go:build linux

package shm

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// PinProcess keeps every thread of this process on one CPU: the n-th
// (modulo their number) of the CPUs the process may use. Threads started
// later inherit it from the threads that start them. It returns that CPU.
//
// Benchmarks use it to give each simulated node of a super node its own
// CPU; a process pinned to one CPU should also run Go code on one thread
// at a time (runtime.GOMAXPROCS(1)).
func PinProcess(n int) (int, error) {
	cpu, err := AllowedCPU(n)
	if err != nil {
		return 0, fmt.Errorf("shm: pin: %w", err)
	}
	var set unix.CPUSet
	set.Set(cpu)
	// Until a pass finds every thread pinned already: a thread started
	// during a pass by one not yet pinned is found by the next.
	for pass := 0; ; pass++ {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return 0, fmt.Errorf("shm: pin: %w", err)
		}
		changed := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			var got unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &got); err == nil && got == set {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return 0, fmt.Errorf("shm: pin thread %d to CPU %d: %w", tid, cpu, err)
			}
			changed = true
		}
		if !changed {
			return cpu, nil
		}
		if pass == 100 {
			return 0, errors.New("shm: pin: the process keeps starting threads")
		}
	}
}

// AllowedCPU returns the number of the n-th (modulo their number) of the
// CPUs this process may use: the CPU PinProcess(n) pins to. Benchmarks
// give it to programs that pin themselves (HAProxy's cpu-map).
func AllowedCPU(n int) (int, error) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return 0, fmt.Errorf("shm: the CPUs this process may use: %w", err)
	}
	var cpus []int
	for i := range len(allowed) * 64 {
		if allowed.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) == 0 {
		return 0, errors.New("shm: this process may use no CPU")
	}
	return cpus[((n%len(cpus))+len(cpus))%len(cpus)], nil
}
