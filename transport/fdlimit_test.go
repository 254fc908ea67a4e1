package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/internal/procstat"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

// The fd-limit tests run one side of ub-path connections in a child
// process (this test binary again) whose RLIMIT_NOFILE they lower, the
// other side here.
const (
	envFDLimitRole = "TRANSPORT_TEST_FDLIMIT" // "dial" or "listen"
	envFDLimitDir  = "TRANSPORT_TEST_FDLIMIT_DIR"
	envFDLimitAddr = "TRANSPORT_TEST_FDLIMIT_ADDR"
	maxFree        = 16 // more descriptors than one connection's side takes
)

// allowFree lowers this process's soft RLIMIT_NOFILE so that exactly k
// more descriptors can be opened (the limit bounds descriptor numbers, and
// a new descriptor takes the lowest free one), and returns what restores
// it.
func allowFree(t *testing.T, k int) (restore func()) {
	t.Helper()
	dir, err := os.Open("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	names, err := dir.Readdirnames(-1)
	own := int(dir.Fd())
	dir.Close()
	if err != nil {
		t.Fatal(err)
	}
	used := map[int]bool{}
	for _, n := range names {
		if fd, err := strconv.Atoi(n); err == nil && fd != own {
			used[fd] = true
		}
	}
	limit := 0
	for free := 0; ; limit++ {
		if !used[limit] {
			if free == k {
				break
			}
			free++
		}
	}
	orig, err := fdlimit.Limit()
	if err != nil {
		t.Fatal(err)
	}
	if err := fdlimit.SetLimit(uint64(limit)); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := fdlimit.SetLimit(orig); err != nil {
			t.Fatal(err)
		}
	}
}

// echo serves l: every connection gets back what it sends. open counts
// the connections not yet closed.
func echo(l *Listener, open *atomic.Int64) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		open.Add(1)
		go func() {
			io.Copy(c, c)
			c.Close()
			open.Add(-1)
		}()
	}
}

// roundTrip sends a byte on c and reads it back, then closes c.
func roundTrip(t *testing.T, c *Conn) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	b := []byte{7}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
}

// limitedDials records the dials made with few descriptors free.
type limitedDials struct{ failed, dialed []int }

// record checks a dial made with free descriptors: a failure must say the
// descriptors ran out, both to errors.Is and in words; a connection must
// carry a byte.
func (r *limitedDials) record(t *testing.T, free int, c *Conn, err error) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, fdlimit.ErrProcessLimit) || !strings.Contains(err.Error(), "fd limit") {
			t.Errorf("with %d descriptors free: %v (want EMFILE, and the fd limit named)", free, err)
		}
		r.failed = append(r.failed, free)
		t.Logf("%d free: %v", free, err)
		return
	}
	roundTrip(t, c)
	r.dialed = append(r.dialed, free)
}

// check fails the test unless the dial with fewest free failed and some
// worked: the limits bit, and were lifted.
func (r *limitedDials) check(t *testing.T, fewest int) {
	t.Helper()
	if len(r.failed) == 0 || len(r.dialed) == 0 || !slices.Contains(r.failed, fewest) {
		t.Fatalf("dials failed with %v descriptors free and worked with %v: the limits did not bite", r.failed, r.dialed)
	}
	t.Logf("dials failed with %v descriptors free and worked with %v", r.failed, r.dialed)
}

// dialer dials addr from e, each dial within 10 s.
func dialer(e *Endpoint, addr string) func() (*Conn, error) {
	return func() (*Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return e.Dial(ctx, addr)
	}
}

// startPiped starts cmd with pipes to its standard input and from its
// standard output.
func startPiped(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, *bufio.Reader) {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return in, bufio.NewReader(out)
}

// startChild runs this test in a child process in role, with the runtime
// directory and address given.
func startChild(t *testing.T, role, dir, addr string) (*exec.Cmd, io.WriteCloser, *bufio.Reader) {
	t.Helper()
	cmd := testenv.ChildTest(t, envFDLimitRole+"="+role, envFDLimitDir+"="+dir, envFDLimitAddr+"="+addr)
	cmd.Stderr = os.Stderr
	in, out := startPiped(t, cmd)
	return cmd, in, out
}

// waitChild reads the child's output to its end and fails the test if
// the child failed.
func waitChild(t *testing.T, cmd *exec.Cmd, out *bufio.Reader) {
	t.Helper()
	rest, _ := io.ReadAll(out)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, rest)
	}
	t.Logf("child:\n%s", rest)
}

// TestDialNamesTheFDLimit: a dialer that runs out of descriptors at any
// step of a ub-path connection (the rendezvous socket, its segment,
// queues, jetties, the imports of the listener's) gets an error that is
// EMFILE and names the fd limit, not a missing file; it leaves nothing
// open, and dials again once descriptors are free.
func TestDialNamesTheFDLimit(t *testing.T) {
	if os.Getenv(envFDLimitRole) == "dial" {
		dialUnderLimits(t)
		return
	}
	dir := t.TempDir()
	n0 := dev4(t, "n0", Config{RuntimeDir: dir})
	svc := fmt.Sprintf("fdlimit-%d", os.Getpid())
	l, err := n0.Listen(context.Background(), "ub:///"+svc)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var open atomic.Int64
	go echo(l, &open)
	cmd, in, out := startChild(t, "dial", dir, "ub://n0/"+svc)
	in.Close()
	waitChild(t, cmd, out)
}

// dialUnderLimits is TestDialNamesTheFDLimit's child: node n1, dialing
// with 0, 1, ... descriptors free.
func dialUnderLimits(t *testing.T) {
	dial := dialer(dev4(t, "n1", Config{RuntimeDir: os.Getenv(envFDLimitDir)}), os.Getenv(envFDLimitAddr))
	c, err := dial() // opens the ub context, which stays
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c)
	base, err := procstat.Read()
	if err != nil {
		t.Fatal(err)
	}
	var dials limitedDials
	for free := 0; free <= maxFree; free++ {
		restore := allowFree(t, free)
		c, err := dial()
		restore()
		dials.record(t, free, c, err)
		if _, err := procstat.Returned(base, procstat.Usage{Goroutines: 2}, 5*time.Second); err != nil {
			t.Fatalf("after a dial with %d descriptors free: %v", free, err)
		}
	}
	dials.check(t, 0)
}

// TestRefusalNamesTheFDLimit: a listener that runs out of descriptors
// while it sets up its side of a ub-path connection refuses the dialer
// with the cause, which the dialer's error carries (EMFILE, and the fd
// limit named), instead of releasing its half under the dialer, whose
// import then failed with "no such file or directory"; it leaves nothing
// open and accepts again once descriptors are free.
func TestRefusalNamesTheFDLimit(t *testing.T) {
	if os.Getenv(envFDLimitRole) == "listen" {
		listenUnderLimits(t)
		return
	}
	dir := t.TempDir()
	svc := fmt.Sprintf("fdlimit-%d", os.Getpid())
	dial := dialer(dev4(t, "n1", Config{RuntimeDir: dir}), "ub://n0/"+svc)
	cmd, in, out := startChild(t, "listen", dir, svc)
	defer in.Close()
	say := func(line string) {
		t.Helper()
		if _, err := fmt.Fprintln(in, line); err != nil {
			t.Fatal(err)
		}
		for {
			got, err := out.ReadString('\n')
			if err != nil {
				t.Fatalf("child: %v", err)
			}
			if got == "ok\n" {
				return
			}
		}
	}
	say("listen")
	c, err := dial() // opens the child's ub context, which stays
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c)
	say("base")
	var dials limitedDials
	// With none free the listener cannot even accept the dialer, which
	// then waits for its deadline: the listener has no descriptor to
	// answer on.
	for free := 1; free <= maxFree; free++ {
		say(fmt.Sprintf("free %d", free))
		c, err := dial()
		say("restore")
		dials.record(t, free, c, err)
	}
	in.Close()
	waitChild(t, cmd, out)
	dials.check(t, 1)
}

// listenUnderLimits is TestRefusalNamesTheFDLimit's child: node n0,
// listening, its limit set as the parent says on stdin ("listen", "base",
// "free N", "restore"; each answered "ok").
func listenUnderLimits(t *testing.T) {
	n0 := dev4(t, "n0", Config{RuntimeDir: os.Getenv(envFDLimitDir)})
	var open atomic.Int64
	var base procstat.Usage
	restore := func() {}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "listen":
			l, err := n0.Listen(context.Background(), "ub:///"+os.Getenv(envFDLimitAddr))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			go echo(l, &open)
		case "base":
			// The first connection closed: what stays is the ub context.
			// Polling: nothing tells when the echo has closed its side.
			deadline := time.Now().Add(10 * time.Second)
			for open.Load() != 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			var err error
			if base, err = procstat.Read(); err != nil {
				t.Fatal(err)
			}
		case "free":
			// What the last dial took is given back first.
			if _, err := procstat.Returned(base, procstat.Usage{Goroutines: 1 << 20}, 5*time.Second); err != nil {
				t.Fatalf("before a dial with %s descriptors free: %v", arg, err)
			}
			k, _ := strconv.Atoi(arg)
			restore = allowFree(t, k)
		case "restore":
			restore()
		}
		fmt.Println("ok")
	}
}

// TestRefusalFromAHostileListener: what a listener says in a refusal
// reaches the dialer's error bounded and printable, and only the errnos
// of running out of descriptors are taken from it.
func TestRefusalFromAHostileListener(t *testing.T) {
	long := strings.Repeat("x\n\x1b[2J", 20000)
	const enoent = 2 // ENOENT: a listener's errno the dialer must not act on
	err := ubHello{Err: long, Errno: enoent}.refused("n0")
	if len(err.Error()) > maxRefusal+100 || strings.ContainsAny(err.Error(), "\n\x1b") {
		t.Errorf("a refusal of %d bytes became an error of %d bytes: %q...", len(long), len(err.Error()), err.Error()[:80])
	}
	if errors.Is(err, fs.ErrNotExist) {
		t.Error("the dialer's error took the listener's word for ENOENT")
	}
	for _, limit := range []error{fdlimit.ErrProcessLimit, fdlimit.ErrSystemLimit} {
		errno, _ := fdlimit.Errno(limit)
		if err := (ubHello{Err: "out", Errno: int(errno)}).refused("n0"); !errors.Is(err, limit) {
			t.Errorf("a refusal for %v: %v does not match it", limit, err)
		}
	}
}
