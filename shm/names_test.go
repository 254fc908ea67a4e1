//go:build linux

package shm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ubkit-io/ubkit/internal/rundir"
)

// foreignUID owns the files these tests plant in another user's name: root
// gives them away with chown (the tests in squat_test.go plant them as a
// real other user).
const foreignUID = 65534

// privateRundir points this user's runtime directory at a new private
// directory for the test, so that records go there.
func privateRundir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "run")
	t.Setenv(rundir.Env, dir)
	return dir
}

// plantForeign makes a file at this user's predictable file for name,
// owned by another user, and removes it when the test ends.
func plantForeign(t *testing.T, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test plants files of another user with chown: run it as root (`make test` does)")
	}
	path := filepath.Join(ShmDir, userPrefix()+name)
	if err := os.WriteFile(path, make([]byte, HeaderSize), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	if err := os.Chown(path, foreignUID, foreignUID); err != nil {
		t.Fatal(err)
	}
	return path
}

// createAltSegment creates segment name while another user's file holds
// its predictable one, and checks that it went to an alternative file.
func createAltSegment(t *testing.T, name string) *Segment {
	t.Helper()
	squat := plantForeign(t, name)
	s, err := CreateSegment(name, 4096, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatalf("CreateSegment(%q) with another user's file at %s: %v", name, squat, err)
	}
	t.Cleanup(func() { s.Unlink(); s.Close() })
	if !strings.HasPrefix(s.file, userPrefix()+name+altSep) || s.Name() != name {
		t.Fatalf("segment %q made in file %s", s.Name(), s.file)
	}
	return s
}

func TestCreateSegmentBesideForeignFile(t *testing.T) {
	dir := privateRundir(t)
	name := testName(t)
	s := createAltSegment(t, name)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(ShmDir, userPrefix()+name), &st); err != nil || st.Uid != foreignUID {
		t.Fatalf("the other user's file: owner %d, %v", st.Uid, err)
	}
	rec := filepath.Join(dir, recordDir, name+recordExt)
	if target, err := os.Readlink(rec); err != nil || target != s.file {
		t.Fatalf("record %s names %q (%v), want %s", rec, target, err, s.file)
	}
	o, err := OpenSegment(name)
	if err != nil {
		t.Fatalf("OpenSegment(%q): %v", name, err)
	}
	defer o.Close()
	if o.ID() != s.ID() || o.Name() != name {
		t.Fatalf("OpenSegment(%q) opened segment %x named %q, want %x", name, o.ID(), o.Name(), s.ID())
	}
	if _, err := CreateSegment(name, 4096, nil); !errors.Is(err, os.ErrExist) {
		t.Fatalf("a second CreateSegment(%q): %v, want an error wrapping os.ErrExist", name, err)
	}
	if err := s.Unlink(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(rec); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record after Unlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(ShmDir, s.file)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("alternative file after Unlink: %v", err)
	}
	if _, err := OpenSegment(name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenSegment(%q) after Unlink: %v, want an error wrapping os.ErrNotExist", name, err)
	}
}

// The other user's file goes away after a segment was made beside it: a
// creator that now finds the predictable file free must not make a second
// segment of the name.
func TestCreateSegmentAfterSquatterLeft(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	s := createAltSegment(t, name)
	if err := os.Remove(filepath.Join(ShmDir, userPrefix()+name)); err != nil {
		t.Fatal(err)
	}
	if dup, err := CreateSegment(name, 4096, nil); !errors.Is(err, os.ErrExist) {
		if err == nil {
			dup.Close()
		}
		t.Fatalf("CreateSegment(%q) with the predictable file free and a live record: %v, want os.ErrExist", name, err)
	}
	if _, err := os.Lstat(filepath.Join(ShmDir, userPrefix()+name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the creator that gave up left its file: %v", err)
	}
	o, err := OpenSegment(name)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.ID() != s.ID() {
		t.Errorf("OpenSegment(%q) opened segment %x, want the recorded %x", name, o.ID(), s.ID())
	}
}

// The two orders of the race between a creator beside another user's file
// (createAlt) and one that finds the predictable file free: exactly one
// makes the segment, and openers find it.
func TestCreateSegmentRace(t *testing.T) {
	for _, tt := range []struct {
		step    string // when the other creator runs
		altWins bool
	}{
		{step: "created", altWins: false},
		{step: "linked", altWins: true},
	} {
		t.Run(tt.step, func(t *testing.T) {
			privateRundir(t)
			name := testName(t)
			squat := plantForeign(t, name)
			var other *Segment
			var otherErr error
			altHook = func(step string) {
				if step != tt.step {
					return
				}
				os.Remove(squat)
				other, otherErr = CreateSegment(name, 4096, nil)
			}
			defer func() { altHook = nil }()
			s, err := CreateSegment(name, 4096, nil)
			altHook = nil
			if other != nil {
				defer other.Close()
			}
			if s != nil {
				defer s.Close()
			}
			if tt.altWins {
				if err != nil || !errors.Is(otherErr, os.ErrExist) {
					t.Fatalf("beside the file: %v; the other creator: %v; want success and os.ErrExist", err, otherErr)
				}
			} else if otherErr != nil || !errors.Is(err, os.ErrExist) {
				t.Fatalf("beside the file: %v; the other creator: %v; want os.ErrExist and success", err, otherErr)
			}
			winner := other
			if tt.altWins {
				winner = s
			}
			o, err := OpenSegment(name)
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			if o.ID() != winner.ID() {
				t.Errorf("OpenSegment(%q) opened %x, want the winner's %x", name, o.ID(), winner.ID())
			}
			if names, _ := filepath.Glob(filepath.Join(ShmDir, userPrefix()+name+"*")); len(names) != 1 {
				t.Errorf("files of %s: %v, want the winner's alone", name, names)
			}
		})
	}
}

// The creator beside another user's file that has just gone (createAlt)
// finds a creator of the predictable file holding it locked, its header not
// yet written: it waits for that creator's decision instead of taking the
// unwritten header for no segment.
func TestCreateSegmentRaceWaitsForLock(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	squat := plantForeign(t, name)
	primary := filepath.Join(ShmDir, userPrefix()+name)
	var other *Segment
	var otherErr error
	otherDone, checked, release, done := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	createHook = func(step string) {
		if step == "checked" {
			close(checked)
			<-release
		}
	}
	altHook = func(step string) {
		if step != "created" {
			return
		}
		os.Remove(squat)
		go func() {
			defer close(otherDone)
			other, otherErr = CreateSegment(name, 4096, nil)
		}()
		<-checked // it holds the predictable file locked, found no record
		var st unix.Stat_t
		if err := unix.Lstat(primary, &st); err != nil {
			t.Error(err)
		}
		go func() {
			defer close(release)
			waitLockWaiter(t, &st, done)
		}()
	}
	s, err := CreateSegment(name, 4096, nil)
	close(done)
	<-otherDone
	createHook, altHook = nil, nil
	if other != nil {
		defer other.Close()
	}
	if s != nil {
		defer s.Close()
	}
	if otherErr != nil || !errors.Is(err, os.ErrExist) {
		t.Fatalf("beside the file: %v; the creator of the predictable file: %v; want os.ErrExist and success", err, otherErr)
	}
	if names, _ := filepath.Glob(filepath.Join(ShmDir, userPrefix()+name+"*")); len(names) != 1 {
		t.Errorf("files of %s: %v, want the winner's alone", name, names)
	}
}

// The creator beside another user's file cannot tell whether the
// predictable file, which is its own now, holds the segment (out of
// descriptors): it fails rather than make a second segment of the name.
func TestCreateSegmentCannotTell(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	squat := plantForeign(t, name)
	var other *Segment
	var otherErr error
	restore := func() {}
	defer func() { restore() }()
	altHook = func(step string) {
		switch step {
		case "created":
			os.Remove(squat)
			other, otherErr = CreateSegment(name, 4096, nil)
		case "linked":
			restore = exhaustFds(t)
		}
	}
	s, err := CreateSegment(name, 4096, nil)
	restore()
	altHook = nil
	if other != nil {
		defer other.Close()
	}
	if s != nil {
		defer s.Close()
	}
	if otherErr != nil {
		t.Fatal(otherErr)
	}
	if !errors.Is(err, unix.EMFILE) {
		t.Errorf("CreateSegment out of descriptors beside a segment of the name: %v, want an error wrapping EMFILE", err)
	}
	if names, _ := filepath.Glob(filepath.Join(ShmDir, userPrefix()+name+"*")); len(names) != 1 {
		t.Errorf("files of %s: %v, want the predictable one alone", name, names)
	}
}

// exhaustFds takes every free descriptor this process may open (its soft
// limit lowered to at most 1024) until restore.
func exhaustFds(t *testing.T) (restore func()) {
	t.Helper()
	var saved unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &saved); err != nil {
		t.Fatal(err)
	}
	low := saved
	low.Cur = min(low.Cur, 1024)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	var spare []int
	for {
		fd, err := unix.Dup(0)
		if err != nil {
			break
		}
		spare = append(spare, fd)
	}
	return func() {
		for _, fd := range spare {
			unix.Close(fd)
		}
		spare = nil
		unix.Setrlimit(unix.RLIMIT_NOFILE, &saved)
	}
}

// OpenSegment of a segment in an alternative file, out of descriptors,
// says so: not that the segment does not exist, which would make cache.Open
// create a second pool of the name.
func TestOpenSegmentAltOutOfDescriptors(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	createAltSegment(t, name)
	restore := exhaustFds(t)
	s, err := OpenSegment(name)
	restore()
	if s != nil {
		s.Close()
	}
	if !errors.Is(err, unix.EMFILE) || errors.Is(err, os.ErrNotExist) {
		t.Errorf("OpenSegment(%q) out of descriptors: %v, want an error wrapping EMFILE, not os.ErrNotExist", name, err)
	}
}

// A segment file of this user with a second name (a hard link, which may
// be another user's) is not opened as this user's segment.
func TestOpenSegmentRefusesHardLinkedFile(t *testing.T) {
	privateRundir(t)
	s := newSegment(t, 4096)
	link := filepath.Join(ShmDir, s.file+"-link")
	if err := os.Link(filepath.Join(ShmDir, s.file), link); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(link)
	o, err := OpenSegment(s.Name())
	if err == nil {
		o.Close()
		t.Fatal("opened a segment file with two names")
	}
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "2 names") {
		t.Errorf("OpenSegment of a file with two names: %v; want an error wrapping os.ErrNotExist that says so", err)
	}
}

func TestOpenSegmentRefusesForeignSegment(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	// A valid segment, given to another user: never ours to open.
	lure, err := CreateSegment(name+"-lure", 4096, &SegmentConfig{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	lure.Close()
	path := filepath.Join(ShmDir, userPrefix()+name)
	if err := os.Rename(filepath.Join(ShmDir, lure.file), path); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	if err := os.Chown(path, foreignUID, foreignUID); err != nil {
		t.Fatal(err)
	}
	s, err := OpenSegment(name)
	if err == nil {
		s.Close()
		t.Fatal("opened another user's segment")
	}
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("OpenSegment of another user's file: %v; want an error wrapping os.ErrNotExist that names the owner", err)
	}
}

func TestSegments(t *testing.T) {
	privateRundir(t)
	name := testName(t)
	a := newSegment(t, 4096)
	b := createAltSegment(t, name)
	names, err := Segments()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{a.Name(), b.Name()} {
		if n := strings.Count("\x00"+strings.Join(names, "\x00")+"\x00", "\x00"+want+"\x00"); n != 1 {
			t.Errorf("Segments() lists %s %d times, want once", want, n)
		}
	}
}

func TestSegmentName(t *testing.T) {
	p := userPrefix()
	for file, want := range map[string]string{
		p + "x":                       "x",
		p + "x~0123456789abcdef":      "x",
		p + "x~0123":                  "",
		p + "x.bell-64":               "",
		NamePrefix + "x":              "",
		NamePrefix + "99999999-x":     "",
		p + "a.b-c_d":                 "a.b-c_d",
		p + "a.b~0123456789abcdef~00": "",
	} {
		got, ok := segmentName(file)
		if got != want || ok != (want != "") {
			t.Errorf("segmentName(%q) = %q, %v; want %q", file, got, ok, want)
		}
	}
}

// Creating, opening and removing segments beside another user's file, and
// failing to open the other user's file, returns every descriptor, mapping
// and file.
func TestSquattedNamesReturnResources(t *testing.T) {
	dir := privateRundir(t)
	name := testName(t)
	squat := plantForeign(t, name)
	fds0, segs0 := openFDs(t), openSegments.Load()
	const rounds = 200
	for i := range rounds {
		if _, err := OpenSegment(name); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: OpenSegment of another user's file: %v", i, err)
		}
		s, err := CreateSegment(name, 4096, nil)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		o, err := OpenSegment(name)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		o.Close()
		if err := s.Close(); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	fds1, segs1 := openFDs(t), openSegments.Load()
	t.Logf("descriptors %d before, %d after %d rounds; segments mapped %d, %d", fds0, fds1, rounds, segs0, segs1)
	if fds1 > fds0+2 || segs1 != segs0 {
		t.Errorf("after %d rounds: %d descriptors (from %d), %d segments mapped (from %d)", rounds, fds1, fds0, segs1, segs0)
	}
	left, _ := filepath.Glob(filepath.Join(ShmDir, userPrefix()+name+"*"))
	if len(left) != 1 || left[0] != squat {
		t.Errorf("files left of %s: %v, want only the other user's", name, left)
	}
	recs, _ := filepath.Glob(filepath.Join(dir, recordDir, "*"+recordExt))
	if len(recs) != 0 {
		t.Errorf("records left: %v", recs)
	}
}
