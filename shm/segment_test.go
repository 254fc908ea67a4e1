//go:build linux

package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSegmentCreateOpen(t *testing.T) {
	name := testName(t)
	s, err := CreateSegment(name, 10000, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st, err := os.Stat(filepath.Join(ShmDir, userPrefix()+name))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if s.Size() < 10000 || s.Name() != name || s.Creator() != Self() {
		t.Errorf("size %d name %q creator %v", s.Size(), s.Name(), s.Creator())
	}
	if _, err := CreateSegment(name, 100, nil); !errors.Is(err, os.ErrExist) {
		t.Errorf("second create: %v, want ErrExist", err)
	}
	if _, err := s.WriteAt([]byte("hello"), 100); err != nil {
		t.Fatal(err)
	}
	o, err := OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := o.ReadAt(got, 100); err != nil || string(got) != "hello" {
		t.Errorf("read %q, %v", got, err)
	}
	if o.ID() != s.ID() {
		t.Errorf("ids differ")
	}
	if _, err := o.WriteAt(got, int64(o.Size())-2); err == nil {
		t.Error("write past the end succeeded")
	}
	if _, err := o.ReadAt(got, -1); err == nil {
		t.Error("read at -1 succeeded")
	}
	// The opener's Close leaves the name; the creator's removes it.
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ShmDir, userPrefix()+name)); err != nil {
		t.Errorf("opener's Close removed the name: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ShmDir, userPrefix()+name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("creator's Close left the name: %v", err)
	}
}

func TestSegmentBadNames(t *testing.T) {
	for _, name := range []string{"", ".", "..", "a/b", "../x", "sp ace", string(make([]byte, 300))} {
		if _, err := CreateSegment(name, 10, nil); err == nil {
			t.Errorf("CreateSegment(%q) succeeded", name)
		}
		if _, err := OpenSegment(name); err == nil {
			t.Errorf("OpenSegment(%q) succeeded", name)
		}
	}
	if _, err := CreateSegment(testName(t), 0, nil); err == nil {
		t.Error("zero size accepted")
	}
}

func TestOpenCorruptSegment(t *testing.T) {
	cases := map[string]func(path string) error{
		"empty":     func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"bad magic": func(p string) error { return os.WriteFile(p, make([]byte, 8192), 0o600) },
		"wrong size": func(p string) error {
			s, err := CreateSegment(filepath.Base(p)[len(userPrefix()):], 100, &SegmentConfig{Keep: true})
			if err != nil {
				return err
			}
			s.Close()
			return os.Truncate(p, 3*HeaderSize)
		},
	}
	for name, make := range cases {
		t.Run(name, func(t *testing.T) {
			n := testName(t)
			path := filepath.Join(ShmDir, userPrefix()+n)
			defer os.Remove(path)
			if err := make(path); err != nil {
				t.Fatal(err)
			}
			s, err := OpenSegment(n)
			if err == nil {
				s.Close()
				t.Fatal("opened a corrupt segment")
			}
			if !errors.Is(err, ErrCorrupt) {
				t.Errorf("error %v does not wrap ErrCorrupt", err)
			}
		})
	}
}

func TestOpenRefusesForeignModes(t *testing.T) {
	name := testName(t)
	path := filepath.Join(ShmDir, userPrefix()+name)
	if err := os.WriteFile(path, make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	os.Chmod(path, 0o644)
	s, err := OpenSegment(name)
	if err == nil {
		s.Close()
		t.Fatal("opened a segment readable by other users")
	}
	if !strings.Contains(err.Error(), "mode") {
		t.Errorf("error does not say why: %v", err)
	}
}

func TestMemfdSealAndPass(t *testing.T) {
	s, err := CreateMemfd("pass", 1<<16, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	copy(s.Data(), "shared through SCM_RIGHTS")
	a, b := socketPair(t)
	// An unsealed segment is refused by a receiver that requires a seal.
	if err := SendSegment(a, s); err != nil {
		t.Fatal(err)
	}
	if _, err := ReceiveSegment(b, nil); err == nil {
		t.Fatal("unsealed segment accepted by default")
	}
	if err := SendSegment(a, s); err != nil {
		t.Fatal(err)
	}
	u, err := ReceiveSegment(b, &ReceiveOptions{AllowUnsealed: true})
	if err != nil {
		t.Fatalf("unsealed segment with AllowUnsealed: %v", err)
	}
	u.Close()
	if err := s.Seal(); err != nil {
		t.Fatal(err)
	}
	if !s.Sealed() {
		t.Fatal("not sealed after Seal")
	}
	if err := SendSegment(a, s); err != nil {
		t.Fatal(err)
	}
	r, err := ReceiveSegment(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if !bytes.HasPrefix(r.Data(), []byte("shared through SCM_RIGHTS")) || r.ID() != s.ID() {
		t.Errorf("received segment differs")
	}
	// Writes are visible both ways: same memory.
	copy(r.Data()[100:], "back")
	if string(s.Data()[100:104]) != "back" {
		t.Error("write through the received mapping not visible")
	}
	// A message without a descriptor is an error, not a crash.
	a.Write([]byte("S"))
	if _, err := ReceiveSegment(b, nil); err == nil {
		t.Error("message without a descriptor accepted")
	}
}

func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func init() {
	children["memfd-receiver"] = func(args []string) error {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: args[0], Net: "unix"})
		if err != nil {
			return err
		}
		defer c.Close()
		s, err := ReceiveSegment(c, nil)
		if err != nil {
			return err
		}
		defer s.Close()
		if !bytes.HasPrefix(s.Data(), []byte("ping")) {
			return errors.New("no ping in received segment")
		}
		copy(s.Data(), "pong")
		return nil
	}
	children["keep-segment"] = func(args []string) error {
		s, err := CreateSegment(args[0], 4096, &SegmentConfig{Keep: true})
		if err != nil {
			return err
		}
		// Exit without Close: the name stays behind for Sweep.
		_ = s
		return nil
	}
}

func TestMemfdAcrossProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	cmd := startChild(t, "memfd-receiver", path)
	c, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := CreateMemfd("xproc", 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	copy(s.Data(), "ping")
	if err := s.Seal(); err != nil {
		t.Fatal(err)
	}
	if err := SendSegment(c, s); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if string(s.Data()[:4]) != "pong" {
		t.Errorf("child's write not visible: %q", s.Data()[:4])
	}
}

func TestSweep(t *testing.T) {
	dead := testName(t) + "-dead"
	if err := startChild(t, "keep-segment", dead).Wait(); err != nil {
		t.Fatal(err)
	}
	live, err := CreateSegment(testName(t)+"-live", 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	removed, err := Sweep()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range removed {
		if r == dead {
			found = true
		}
		if r == live.Name() {
			t.Errorf("Sweep removed a live process's segment")
		}
	}
	if !found {
		t.Errorf("Sweep removed %v, not the dead process's %s", removed, dead)
	}
	if _, err := os.Stat(filepath.Join(ShmDir, userPrefix()+dead)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dead segment still there: %v", err)
	}
}

func TestProcessLiveness(t *testing.T) {
	if !Self().Alive() {
		t.Fatal("self not alive")
	}
	name := testName(t)
	cmd := startChild(t, "keep-segment", name)
	p, err := LookupProcess(cmd.Process.Pid)
	if err != nil {
		// The child may already have exited; that is fine for this check.
		t.Logf("lookup: %v", err)
	}
	cmd.Wait()
	os.Remove(filepath.Join(ShmDir, userPrefix()+name))
	if err == nil && p.Alive() {
		t.Errorf("process %d alive after it was reaped", p.PID)
	}
	if (Process{PID: uint32(os.Getpid()), Start: Self().Start + 1}).Alive() {
		t.Error("a process with our pid but another start time counts as alive")
	}
	// Stored in shared memory (the low 32 bits of the start time), both
	// identities read back the same way.
	if !aliveWord(Self().word()) {
		t.Error("our own stored identity counts as dead")
	}
	if aliveWord((Process{PID: uint32(os.Getpid()), Start: Self().Start + 1}).word()) {
		t.Error("a stored identity with our pid but another start time counts as alive")
	}
}

func init() {
	// Lives until the test kills it (a minute at most).
	children["sleep"] = func([]string) error {
		time.Sleep(time.Minute)
		return nil
	}
}

// TestLivenessOfAnExitingProcess follows one process through its life as
// the data path sees it (the answers come from a pidfd once it was asked
// about): alive, then dead as soon as it exits, before its parent reaps
// it, and after. Another identity with its pid is never alive.
func TestLivenessOfAnExitingProcess(t *testing.T) {
	cmd := startChild(t, "sleep")
	p, err := LookupProcess(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	other := Process{PID: p.PID, Start: p.Start + 1}
	for range 3 {
		if !p.Alive() || !aliveWord(p.word()) {
			t.Fatal("a running child counts as dead")
		}
		if other.Alive() || aliveWord(other.word()) {
			t.Fatal("another identity with the child's pid counts as alive")
		}
	}
	cmd.Process.Kill()
	// Not reaped yet: a zombie, dead to us.
	deadline := time.Now().Add(hangGuard)
	for p.Alive() || aliveWord(p.word()) {
		if time.Now().After(deadline) {
			t.Fatalf("a killed child still counts as alive after %v", hangGuard)
		}
		// Polling: the kill lands a moment later, and only Alive tells.
		time.Sleep(time.Millisecond)
	}
	cmd.Wait()
	if p.Alive() || aliveWord(p.word()) {
		t.Fatal("a reaped child counts as alive")
	}
}

// forgetWatch drops the pidfd kept for pid, if any, so that the next
// liveness check of pid starts afresh.
func forgetWatch(pid uint32) {
	watches.Lock()
	defer watches.Unlock()
	if w := watches.m[pid]; w != nil {
		unix.Close(w.fd)
		delete(watches.m, pid)
	}
}

// With /proc unreadable, a running process counts as alive, through a new
// pidfd or without pidfds, and a reaped one as dead.
func TestLivenessWithoutProc(t *testing.T) {
	cmd := startChild(t, "sleep")
	p, err := LookupProcess(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	watches.Lock()
	off := watches.off
	watches.Unlock()
	procRoot = filepath.Join(t.TempDir(), "proc")
	defer func() {
		procRoot = "/proc"
		watches.Lock()
		watches.off = off
		watches.Unlock()
		forgetWatch(p.PID)
	}()
	check := func(want bool, what string) {
		t.Helper()
		for _, pidfds := range []bool{true, false} {
			forgetWatch(p.PID)
			watches.Lock()
			watches.off = off || !pidfds
			watches.Unlock()
			if got := p.Alive(); got != want {
				t.Errorf("%s, /proc unreadable, pidfds %v: Alive() = %v", what, pidfds, got)
			}
			forgetWatch(p.PID)
			if got := aliveWord(p.word()); got != want {
				t.Errorf("%s, /proc unreadable, pidfds %v: aliveWord = %v", what, pidfds, got)
			}
		}
	}
	check(true, "a running child")
	cmd.Process.Kill()
	cmd.Wait()
	check(false, "a reaped child")
}

func TestHugePages(t *testing.T) {
	// Named segments ask for transparent huge pages (best effort).
	s, err := CreateSegment(testName(t), 4<<20, &SegmentConfig{HugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Data()[len(s.Data())-1] = 1
	s.Close()
	// memfd segments need reserved huge pages, which `make prereqs`
	// reserves as root.
	m, err := CreateMemfd("huge", 4<<20, &SegmentConfig{HugePages: true})
	if err != nil {
		t.Fatalf("this test needs huge pages reserved for memfd segments (prerequisite: 3 free pages of 2 MiB in "+
			"/proc/sys/vm/nr_hugepages, which `make prereqs` run as root reserves): %v", err)
	}
	defer m.Close()
	if m.Size() < 4<<20 {
		t.Fatalf("size %d", m.Size())
	}
	m.Data()[0] = 1
	// More than the kernel could ever give: the error says how to reserve
	// huge pages.
	pages := hugePagesLimit(t)
	if _, err := CreateMemfd("huge", (pages+1)*hugePageSize, &SegmentConfig{HugePages: true}); err == nil ||
		!strings.Contains(err.Error(), "nr_hugepages") {
		t.Fatalf("a memfd of %d huge pages, with at most %d to be had: %v, want an error that says how to reserve them", pages+1, pages, err)
	}
}

// hugePagesLimit is the most huge pages the kernel gives: those reserved
// and those it may add (overcommit).
func hugePagesLimit(t *testing.T) int {
	t.Helper()
	n := 0
	for _, f := range []string{"/proc/sys/vm/nr_hugepages", "/proc/sys/vm/nr_overcommit_hugepages"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		n += v
	}
	return n
}

func TestUint64At(t *testing.T) {
	s := newSegment(t, 64)
	w, err := s.Uint64At(8)
	if err != nil {
		t.Fatal(err)
	}
	w.Store(42)
	if w.CompareAndSwap(42, 7); binary.LittleEndian.Uint64(s.Data()[8:]) != 7 {
		t.Error("atomic view does not alias the segment")
	}
	for _, off := range []int{-8, 4, s.Size() - 4, s.Size()} {
		if _, err := s.Uint64At(off); err == nil {
			t.Errorf("Uint64At(%d) accepted", off)
		}
	}
	if _, err := s.Uint32At(2); err == nil {
		t.Error("misaligned Uint32At accepted")
	}
}
