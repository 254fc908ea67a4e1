//go:build linux

package shm

import (
	"os"
	"runtime"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPinProcess pins the test process and finds every thread on that one
// CPU, a thread started afterwards included; then it undoes the pin.
func TestPinProcess(t *testing.T) {
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for range 3 { // threads started meanwhile inherit the pin
			tasks, _ := os.ReadDir("/proc/self/task")
			for _, task := range tasks {
				tid, _ := strconv.Atoi(task.Name())
				unix.SchedSetaffinity(tid, &before)
			}
		}
	}()
	cpu, err := PinProcess(before.Count() + 1) // wraps around
	if err != nil {
		t.Fatal(err)
	}
	if !before.IsSet(cpu) {
		t.Fatalf("pinned to CPU %d, which the process may not use", cpu)
	}
	check := func() {
		t.Helper()
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			var got unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &got); err != nil {
				continue // the thread ended
			}
			if got.Count() != 1 || !got.IsSet(cpu) {
				t.Fatalf("thread %d may run on %d CPUs, want only CPU %d", tid, got.Count(), cpu)
			}
		}
	}
	check()
	// Goroutines that keep their threads make the runtime start new ones.
	threads := func() int {
		tasks, _ := os.ReadDir("/proc/self/task")
		return len(tasks)
	}
	was := threads()
	release := make(chan struct{})
	defer close(release)
	for i := 0; threads() <= was; i++ {
		if i == 100 {
			t.Fatal("no new thread")
		}
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			close(locked)
			<-release
		}()
		<-locked
	}
	check()
}

// TestAllowedCPU: the n-th allowed CPU, wrapping around either way, is one
// the process may use, and the one PinProcess(n) would pin to.
func TestAllowedCPU(t *testing.T) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	var cpus []int
	for i := range len(allowed) * 64 {
		if allowed.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	last := len(cpus) - 1
	for n, want := range map[int]int{0: cpus[0], last: cpus[last], len(cpus): cpus[0], -1: cpus[last], -len(cpus): cpus[0]} {
		got, err := AllowedCPU(n)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("AllowedCPU(%d) = %d, want %d (allowed: %v)", n, got, want, cpus)
		}
	}
}
