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
	var allowed, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return 0, fmt.Errorf("shm: pin: %w", err)
	}
	var cpus []int
	for i := range len(allowed) * 64 {
		if allowed.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	if len(cpus) == 0 {
		return 0, errors.New("shm: pin: this process may use no CPU")
	}
	cpu := cpus[((n%len(cpus))+len(cpus))%len(cpus)]
	set.Set(cpu)
	// Twice: a thread started during the first pass is pinned by the
	// second, or inherited the pin.
	for range 2 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return 0, fmt.Errorf("shm: pin: %w", err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return 0, fmt.Errorf("shm: pin thread %d to CPU %d: %w", tid, cpu, err)
			}
		}
	}
	return cpu, nil
}
