package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/ubkit-io/ubkit/internal/osproc"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

func TestMain(m *testing.M) { Main(m) }

// The children of the tests below read these.
const (
	wordEnv     = "UBKIT_TESTENV_TEST_WORD"
	leakModeEnv = "UBKIT_TESTENV_TEST_LEAK" // which leak TestMainFindsLeaks's child makes
	leakNameEnv = "UBKIT_TESTENV_TEST_SEGMENT"
)

func init() {
	// Prints its word and whether it still sees its role, and exits with
	// status 3.
	RegisterChild("word", func() int {
		fmt.Printf("word=%s role=%q\n", os.Getenv(wordEnv), os.Getenv(childEnv))
		return 3
	})
	// Creates segment $UBKIT_TESTENV_TEST_SEGMENT, kept after it exits.
	RegisterChild("keep-segment", func() int {
		if err := keepSegment(os.Getenv(leakNameEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	})
	// Creates the kept segment, says so, then waits to be killed.
	RegisterChild("hold-segment", func() int {
		if err := keepSegment(os.Getenv(leakNameEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("made")
		io.Copy(io.Discard, os.Stdin)
		return 0
	})
}

func keepSegment(name string) error {
	s, err := shm.CreateSegment(name, 4096, &shm.SegmentConfig{Keep: true})
	if err != nil {
		return err
	}
	return s.Close()
}

// TestChild: a child plays the role it was started for, with the
// environment added, and exits with the role's status; the role is not
// passed on to its own children.
func TestChild(t *testing.T) {
	cmd := Child(t, "word", wordEnv+"=hello")
	out, err := cmd.Output()
	if exitErr, ok := errors.AsType[*exec.ExitError](err); !ok || exitErr.ExitCode() != 3 {
		t.Fatalf("the child: %v, want exit status 3; output %q", err, out)
	}
	if got, want := string(out), "word=hello role=\"\"\n"; got != want {
		t.Errorf("the child printed %q, want %q", got, want)
	}
}

// TestChildTest: the child runs the test that started it, and only it,
// subtests included.
func TestChildTest(t *testing.T) {
	for _, name := range []string{"plain", "with space", "a+b(c)"} {
		t.Run(name, func(t *testing.T) {
			if os.Getenv(wordEnv) != "" {
				fmt.Printf("in the child: %s %s\n", t.Name(), os.Getenv(wordEnv))
				return
			}
			out, err := ChildTest(t, wordEnv+"=child").CombinedOutput()
			if err != nil {
				t.Fatalf("the child: %v\n%s", err, out)
			}
			if want := "in the child: " + t.Name() + " child\n"; strings.Count(string(out), "in the child: ") != 1 || !strings.Contains(string(out), want) {
				t.Errorf("the child's output\n%s\nwant one line %q", out, want)
			}
		})
	}
}

func TestExactRun(t *testing.T) {
	for name, want := range map[string]string{
		"TestX":           "^TestX$",
		"TestX/sub_test":  "^TestX$/^sub_test$",
		"TestX/a+b(c)/#1": `^TestX$/^a\+b\(c\)$/^#1$`,
	} {
		if got := exactRun(name); got != want {
			t.Errorf("exactRun(%q) = %q, want %q", name, got, want)
		}
	}
}

// Leaks of TestMainFindsLeaks's child that must live as long as it does
// (an *os.File that nothing refers to would be closed by the garbage
// collector).
var (
	leakedFile  *os.File
	leakedSeg   *shm.Segment
	neverClosed = make(chan struct{})
)

// TestMainFindsLeaks runs a test that leaves something behind in a child
// process, and checks that the child's Main fails its run, naming what
// was left, and removes what it left in /dev/shm; or that it passes the
// run and removes the files that are no leak.
func TestMainFindsLeaks(t *testing.T) {
	tests := []struct {
		mode string
		want string // in the report; "" for a run that must pass
	}{
		{"nothing", ""},
		{"goroutine", "goroutines: "},
		{"fd", "file descriptor "},
		{"child-process", "child process "},
		{"mapping", "more mappings of " + shm.ShmDir + "/"},
		{"segment", ", made by this process (removed now)"},
		{"bell", ".bell-0, made by this process (removed now)"},
		{"child-segment", "which this one started (removed now)"},
		{"killed-child-segment", ""},
		{"sim-fabric", ""},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			if os.Getenv(leakModeEnv) == tt.mode {
				leak(t, tt.mode, os.Getenv(leakNameEnv))
				return
			}
			t.Parallel()
			name := fmt.Sprintf("test-leak-%d-%d", os.Getpid(), time.Now().UnixNano())
			if tt.mode == "sim-fabric" {
				name = "sim-" + name
			}
			file := filepath.Join(shm.ShmDir, shmPrefix()+name)
			t.Cleanup(func() {
				os.Remove(file)
				os.Remove(file + ".bell-0")
			})
			out, err := ChildTest(t, leakModeEnv+"="+tt.mode, leakNameEnv+"="+name).CombinedOutput()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("a run that left nothing behind failed: %v\n%s", err, out)
			case tt.want != "" && err == nil:
				t.Errorf("a run that leaked (%s) passed:\n%s", tt.mode, out)
			case tt.want != "" && (!strings.Contains(string(out), "FAIL: testenv: the tests left behind:") ||
				!strings.Contains(string(out), tt.want)):
				t.Errorf("the report of a run that leaked (%s) does not say %q:\n%s", tt.mode, tt.want, out)
			}
			for _, f := range []string{file, file + ".bell-0"} {
				if _, err := os.Lstat(f); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s after the run: %v, want it removed", f, err)
				}
			}
		})
	}
}

// leak makes TestMainFindsLeaks's child leave behind what mode says.
func leak(t *testing.T, mode, name string) {
	leakWait = 200 * time.Millisecond
	var err error
	switch mode {
	case "nothing":
	case "goroutine":
		go func() { <-neverClosed }()
	case "fd":
		leakedFile, err = os.Open(os.DevNull)
	case "child-process":
		// Started, never waited for; killed when the child exits.
		cmd := exec.Command("sleep", "3600")
		osproc.DieWithParent(cmd)
		err = cmd.Start()
	case "mapping":
		leakedSeg, err = shm.CreateSegment(name, 4096, nil)
	case "segment":
		err = keepSegment(name)
	case "bell":
		// A ring's bell beside its kept segment.
		if err = keepSegment(name); err == nil {
			err = osproc.Mkfifo(filepath.Join(shm.ShmDir, shmPrefix()+name+".bell-0"), 0o600)
		}
	case "child-segment":
		cmd := Child(t, "keep-segment", leakNameEnv+"="+name)
		cmd.Stderr = os.Stderr
		err = cmd.Run()
	case "killed-child-segment":
		cmd := Child(t, "hold-segment", leakNameEnv+"="+name)
		cmd.Stderr = os.Stderr
		if _, err := cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "made\n" {
			t.Fatalf("the child: %q, %v", line, err)
		}
		cmd.Process.Kill()
		cmd.Wait()
	case "sim-fabric":
		err = keepSegment(name)
	default:
		t.Fatalf("unknown leak %q", mode)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestWaitParked: WaitParked returns once a goroutine sleeps where it is
// told to look.
func TestWaitParked(t *testing.T) {
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		parkHere(release)
		close(done)
	}()
	WaitParked(t, 1, "", "testenv.parkHere(")
	close(release)
	<-done
}

// parkHere waits for release, where TestWaitParked looks for it.
func parkHere(release <-chan struct{}) { <-release }

// TestFileCreator: what fileCreator reads of a segment's header is the
// creator that shm reports, and a file that is no segment has none.
func TestFileCreator(t *testing.T) {
	name := fmt.Sprintf("test-creator-%d-%d", os.Getpid(), time.Now().UnixNano())
	s, err := shm.CreateSegment(name, 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, ok := fileCreator(filepath.Join(shm.ShmDir, shmPrefix()+name))
	if !ok || got != s.Creator() || !sameProcess(got, shm.Self()) {
		t.Errorf("fileCreator = %+v, %v; the segment says %+v, and this process is %+v", got, ok, s.Creator(), shm.Self())
	}
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, make([]byte, 64), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, ok := fileCreator(plain); ok {
		t.Errorf("fileCreator of a file of zeros = %+v, want none", p)
	}
}
