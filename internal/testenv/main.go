package testenv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/ubkit-io/ubkit/internal/osproc"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ubkit-io/ubkit/shm"
)

// leakWait bounds how long Main waits, after the tests, for goroutines
// that are ending and for the descriptors and mappings they close. Only a
// leak waits that long. testenv's own tests shorten it.
var leakWait = 10 * time.Second

// Main is the TestMain of ubkit's test packages; it exits. It runs the
// role this process was started for with Child, if any (RunChildIfAsked).
// Otherwise it runs the tests, then teardown (what TestMain set up for all
// the tests: a server, a default endpoint), then checks that the run left
// nothing behind, and fails it (exit status 1, and a report on standard
// error) if it did:
//   - goroutines beyond those that ran when Main began (less those
//     upstream clients leave by design: knownLeaks),
//   - child processes still running, or not waited for,
//   - open file descriptors beyond those open then (pidfds aside, of
//     which package shm keeps a few by design),
//   - mappings of shared memory (/dev/shm files, memfds) beyond those
//     mapped then,
//   - files of this user's in /dev/shm (names starting with
//     ubkit-<uid>-) that this process, or a process of the test binary
//     that it started directly or not, made during the run (as a
//     segment's header names its creator; a file that is no segment, such
//     as a bell whose segment is gone, is told only by a pid in its
//     name); it removes them after reporting them.
//
// Goroutines, descriptors and mappings are checked only when the tests
// passed (a failed test may leave what it held), after waiting up to 10 s
// for those that are ending; /dev/shm always. Two kinds of files are no
// leak. The fabrics of simulated super nodes (ubkit-<uid>-sim-*)
// outlive their processes by design, so that the processes of one super
// node share one; Main removes those its run made, or used last, unless
// another process maps them still. A child started with
// Child (or its variants) that a signal ended leaves its segments as a
// crashed process does; Main removes them with shm.Sweep, as an operator
// would.
func Main(m *testing.M, teardown ...func()) {
	RunChildIfAsked()
	os.Exit(runMain(m, teardown))
}

// descPrefix starts the names of the files, under os.TempDir(), that hold
// the identities of a Main's descendants: <prefix><pid>-<random>.
const descPrefix = "ubkit-tdesc-"

func runMain(m *testing.M, teardown []func()) int {
	removeStaleDescendantFiles()
	desc, err := os.CreateTemp("", fmt.Sprintf("%s%d-", descPrefix, os.Getpid()))
	if err == nil {
		err = desc.Close()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: a file for the identities of child processes: %v\n", err)
		return 1
	}
	defer os.Remove(desc.Name())
	os.Setenv(descendantsEnv, desc.Name())

	before, err := takeBaseline()
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
	code := m.Run()
	for _, f := range teardown {
		f()
	}
	var leaks []string
	procs, err := readDescendants(desc.Name())
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	leaks = append(leaks, checkShmFiles(before.shmFiles, append(procs, shm.Self()))...)
	if code == 0 {
		leaks = append(leaks, waitProcessLeaks(before)...)
	}
	if len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: testenv: the tests left behind:\n\t%s\n", strings.Join(leaks, "\n\t"))
		return 1
	}
	return code
}

// removeStaleDescendantFiles removes the files of descendants'
// identities that test processes killed before their Main ended left.
func removeStaleDescendantFiles() {
	files, _ := filepath.Glob(filepath.Join(os.TempDir(), descPrefix+"*"))
	for _, f := range files {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(f), descPrefix), "-")
		if pid, err := strconv.Atoi(pidText); err == nil && pid > 0 && !pidAlive(pid) {
			os.Remove(f)
		}
	}
}

// baseline is what the process held, and /dev/shm had, before the tests.
type baseline struct {
	goroutines goleak.Option
	fds        map[string]string // descriptor number → what it refers to
	mappings   map[string]int    // shared-memory file → mappings of it
	shmFiles   map[string]bool
}

func takeBaseline() (baseline, error) {
	// The runtime's network poller opens its descriptors the first time
	// a descriptor is made pollable, and keeps them: open them now.
	r, w, err := os.Pipe()
	if err != nil {
		return baseline{}, err
	}
	r.Close()
	w.Close()
	b := baseline{goroutines: goleak.IgnoreCurrent()}
	if b.fds, err = openFDs(); err != nil {
		return b, err
	}
	if b.mappings, err = sharedMappings(); err != nil {
		return b, err
	}
	files, err := ownShmFiles()
	b.shmFiles = map[string]bool{}
	for _, f := range files {
		b.shmFiles[f] = true
	}
	return b, err
}

// waitProcessLeaks reports goroutines, descriptors and mappings beyond
// before, once they have not gone within leakWait.
func waitProcessLeaks(before baseline) []string {
	deadline := time.Now().Add(leakWait)
	for {
		leaks := processLeaks(before)
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		// Polling: nothing tells when a goroutine has ended.
		time.Sleep(20 * time.Millisecond)
	}
}

func processLeaks(before baseline) []string {
	var leaks []string
	fds, err := openFDs()
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	for _, fd := range slices.Sorted(mapKeys(fds)) {
		// Package shm keeps pidfds of the processes it was asked about
		// (at most 64), by design; a child not waited for, whose pidfd
		// the os package would hold, is reported below.
		if target := fds[fd]; before.fds[fd] != target && target != "anon_inode:[pidfd]" {
			leaks = append(leaks, fmt.Sprintf("file descriptor %s, %s", fd, target))
		}
	}
	children, err := childProcesses()
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	for _, c := range children {
		leaks = append(leaks, "child process "+c+", still running or not waited for")
	}
	maps, err := sharedMappings()
	if err != nil {
		leaks = append(leaks, err.Error())
	}
	for _, file := range slices.Sorted(mapKeys(maps)) {
		if n := maps[file] - before.mappings[file]; n > 0 {
			leaks = append(leaks, fmt.Sprintf("%d more mappings of %s", n, file))
		}
	}
	if err := goleak.Find(append(slices.Clone(knownLeaks), before.goroutines)...); err != nil {
		leaks = append(leaks, "goroutines: "+err.Error())
	}
	return leaks
}

// knownLeaks are goroutines that upstream clients the tests use leave
// running after they were shut down, which no caller can stop; each rule
// names them as narrowly as goleak can (function names of the pinned
// version, in go.mod).
var knownLeaks = []goleak.Option{
	// rocketmq-client-go: a push consumer's statistics start three
	// loops that sleep forever (statsItemSet.init's func4 to func6, beside
	// the three tickers Shutdown stops), one that sleeps ConsumeTimeout
	// (15 min) before it looks at Shutdown (pushConsumer.Start's
	// func1.2), and its long-polling pulls still waiting for the
	// broker's answer (20 s, or their 30 s timeout when the broker is
	// gone).
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func4"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func5"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*statsItemSet).init.func6"),
	goleak.IgnoreAnyFunction("github.com/apache/rocketmq-client-go/v2/consumer.(*pushConsumer).Start.func1.2"),
	goleak.IgnoreTopFunction("github.com/apache/rocketmq-client-go/v2/internal/remote.(*ResponseFuture).waitResponse"),
	// pulsar-client-go: a producer's send-timeout loop sleeps its
	// SendTimeout (30 s) before it looks whether the producer was closed
	// (partitionProducer.failTimeoutMessages): a test that ends sooner
	// after making a producer finds it still there.
	goleak.IgnoreAnyFunction("github.com/apache/pulsar-client-go/pulsar.(*partitionProducer).failTimeoutMessages"),
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// childProcesses describes this process's child processes: pid and
// command line.
func childProcesses() ([]string, error) {
	lists, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil || len(lists) == 0 {
		return nil, fmt.Errorf("testenv: no /proc/self/task/*/children to list child processes in: %v", err)
	}
	var out []string
	for _, list := range lists {
		b, err := os.ReadFile(list)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a thread that ended
		}
		if err != nil {
			return out, fmt.Errorf("testenv: listing child processes: %w", err)
		}
		for pid := range strings.FieldsSeq(string(b)) {
			cmdline, _ := os.ReadFile("/proc/" + pid + "/cmdline")
			out = append(out, fmt.Sprintf("%s (%s)", pid, strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
		}
	}
	return out, nil
}

// openFDs returns this process's open descriptors and what each refers to,
// without the one that reads the list.
func openFDs() (map[string]string, error) {
	const dir = "/proc/self/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("testenv: listing descriptors: %w", err)
	}
	self := "/proc/" + strconv.Itoa(os.Getpid()) + "/fd"
	fds := map[string]string{}
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) || target == self {
			continue // the listing's own, closed by now
		}
		if err != nil {
			target = err.Error()
		}
		fds[e.Name()] = target
	}
	return fds, nil
}

// sharedMappings counts this process's mappings of each shared-memory
// file: /dev/shm files and memfds.
func sharedMappings() (map[string]int, error) {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, fmt.Errorf("testenv: reading mappings: %w", err)
	}
	maps := map[string]int{}
	for line := range strings.Lines(string(b)) {
		// address perms offset dev inode path
		fields := strings.SplitN(strings.TrimSpace(line), " ", 6)
		if len(fields) < 6 {
			continue
		}
		if path := strings.TrimSpace(fields[5]); strings.HasPrefix(path, shm.ShmDir+"/") || strings.HasPrefix(path, "/memfd:") {
			maps[path]++
		}
	}
	return maps, nil
}

// shmPrefix starts the names of this user's files in shm.ShmDir.
func shmPrefix() string { return shm.NamePrefix + strconv.Itoa(os.Geteuid()) + "-" }

// ownShmFiles lists the files in shm.ShmDir whose names start with this
// user's prefix.
func ownShmFiles() ([]string, error) {
	entries, err := os.ReadDir(shm.ShmDir)
	if err != nil {
		return nil, fmt.Errorf("testenv: listing %s: %w", shm.ShmDir, err)
	}
	var files []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), shmPrefix()) {
			files = append(files, e.Name())
		}
	}
	return files, nil
}

// checkShmFiles reports the files in shm.ShmDir that are not in before and
// that one of procs made, and removes them; it removes without reporting
// simulated super nodes' fabrics, and segments of killed children.
func checkShmFiles(before map[string]bool, procs []shm.Process) []string {
	files, err := ownShmFiles()
	if err != nil {
		return []string{err.Error()}
	}
	// Who made what, before anything goes: a bell is told by its
	// segment.
	type made struct {
		file    string
		creator shm.Process
		ours    bool
	}
	var news []made
	for _, file := range files {
		if !before[file] {
			creator, ours := madeBy(file, procs)
			news = append(news, made{file, creator, ours})
		}
	}
	var leaks, killedLeft []string
	for _, m := range news {
		file, creator := m.file, m.creator
		if !m.ours {
			removeAbandonedFabric(file)
			continue
		}
		path := filepath.Join(shm.ShmDir, file)
		switch {
		case strings.HasPrefix(file, shmPrefix()+"sim-"):
			// Another test process may share it (a super node of the
			// same topology): it outlives us for them, and the last
			// one's run removes it (removeAbandonedFabric).
			if !mappedByOthers(path) {
				os.Remove(path)
			}
		case creator.PID != shm.Self().PID && killed(creator.PID):
			killedLeft = append(killedLeft, path)
		default:
			what := "made by this process"
			if creator.PID != shm.Self().PID {
				what = fmt.Sprintf("made by process %d, which this one started", creator.PID)
			}
			leaks = append(leaks, fmt.Sprintf("%s, %s (removed now)", path, what))
			os.RemoveAll(path)
		}
	}
	return append(leaks, sweepKilled(killedLeft)...)
}

// sweepKilled removes with shm.Sweep the files at paths, which killed
// children left, and reports those that stay. Another process may hold
// one for a moment (its own Sweep, or a look at its header like
// fileCreator's), which makes it in use: Sweep is tried a few times.
func sweepKilled(paths []string) []string {
	var sweepErr error
	for try := 0; len(paths) > 0; try++ {
		_, sweepErr = shm.Sweep()
		paths = slices.DeleteFunc(paths, func(path string) bool {
			_, err := os.Lstat(path)
			return errors.Is(err, fs.ErrNotExist)
		})
		if try == 4 {
			break
		}
		// Polling: nothing tells when another process lets go of a file.
		time.Sleep(100 * time.Millisecond)
	}
	var left []string
	for _, path := range paths {
		left = append(left, fmt.Sprintf("%s, left by a killed child, which shm.Sweep did not take (%v)", path, sweepErr))
	}
	return left
}

// removeAbandonedFabric removes file if it is a simulated super node's
// fabric that another test process made during the run, that process is
// gone, and no process maps it: this run was the last to use it.
func removeAbandonedFabric(file string) {
	if !strings.HasPrefix(file, shmPrefix()+"sim-") {
		return
	}
	path := filepath.Join(shm.ShmDir, file)
	if creator, ok := fileCreator(path); ok && !creator.Alive() && !mappedByOthers(path) {
		os.Remove(path)
	}
}

// mappedByOthers reports whether a process other than this one maps the
// file at path (as far as /proc shows this user).
func mappedByOthers(path string) bool {
	maps, _ := filepath.Glob("/proc/[0-9]*/maps")
	self := "/proc/" + strconv.Itoa(os.Getpid()) + "/maps"
	for _, m := range maps {
		if m == self {
			continue
		}
		if b, err := os.ReadFile(m); err == nil && strings.Contains(string(b), path) {
			return true
		}
	}
	return false
}

// What fileCreator reads of a segment's header (shm's segment.go lays it
// out; TestFileCreator checks that the two agree): its magic, and its
// creator's pid and the low 32 bits of its start time, packed in a word.
const (
	segMagic      = 0x4745_5354_494b_4255
	segOffMagic   = 0
	segOffCreator = 24
)

// fileCreator returns the creator of the segment in the file at path, if
// it is a segment of this user. It reads the header as Sweep does, without
// mapping the file or taking its lock: either would make the segment in
// use for a Sweep of another process meanwhile.
func fileCreator(path string) (shm.Process, bool) {
	var h [32]byte
	if !osproc.ReadOwnHeader(path, h[:]) || binary.LittleEndian.Uint64(h[segOffMagic:]) != segMagic {
		return shm.Process{}, false
	}
	w := binary.LittleEndian.Uint64(h[segOffCreator:])
	return shm.Process{PID: uint32(w >> 32), Start: w & 0xffffffff}, true
}

// madeBy tells which of procs made file, a file in shm.ShmDir: a
// segment's creator (for a ring's bell, <segment>.bell-<offset>, its
// segment's), else (a file that is no segment, or a bell whose segment is
// gone) the process whose pid the name holds as one of its parts.
func madeBy(file string, procs []shm.Process) (shm.Process, bool) {
	seg, _, _ := strings.Cut(file, ".bell-")
	if creator, ok := fileCreator(filepath.Join(shm.ShmDir, seg)); ok {
		for _, p := range procs {
			if sameProcess(creator, p) {
				return p, true
			}
		}
		return shm.Process{}, false
	}
	parts := strings.FieldsFunc(strings.TrimPrefix(file, shmPrefix()), func(r rune) bool { return r < '0' || r > '9' })
	for _, p := range procs {
		if slices.Contains(parts, strconv.FormatUint(uint64(p.PID), 10)) {
			return p, true
		}
	}
	return shm.Process{}, false
}
