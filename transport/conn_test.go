package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

var serviceSeq atomic.Int64

// pipe joins two connections over the same-node path with the default
// endpoint.
func pipe(t *testing.T) (net.Conn, net.Conn, func()) {
	t.Helper()
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := connect(t, def, def, "", "", PathShm)
	return c1, c2, func() { c1.Close(); c2.Close() }
}

// The test binary re-executed as a child plays one of these roles, with
// the rest of what it needs in the environment.
func init() {
	testenv.RegisterChild("dial-unix", dialUnixChild)
	testenv.RegisterChild("auth", func() int { return authChild(os.Getenv("TRANSPORT_TEST_AUTH")) })
	testenv.RegisterChild("writer", child)
	testenv.RegisterChild("sender", senderChild)
	testenv.RegisterChild("closer", closerChild)
}

func TestMain(m *testing.M) {
	testenv.RunChildIfAsked()
	dir, err := os.MkdirTemp("", "ubkit-transport-")
	if err != nil {
		panic(err)
	}
	os.Setenv("UBKIT_RUNTIME_DIR", dir)
	testenv.Main(m, func() {
		// The default endpoint lives as long as its process; close it
		// here so that what it opened counts for the leak check.
		if ep, err := Default(); err == nil {
			ep.Close()
		}
		os.RemoveAll(dir)
	})
}

// dialUnixChild connects to the unix socket TRANSPORT_TEST_DIAL_UNIX, then
// waits for the other side to hang up.
func dialUnixChild() int {
	c, err := net.Dial("unix", os.Getenv("TRANSPORT_TEST_DIAL_UNIX"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	io.Copy(io.Discard, c)
	return 0
}

// child dials TRANSPORT_TEST_ADDR and writes until killed.
func child() int {
	c, err := Dial(context.Background(), os.Getenv("TRANSPORT_TEST_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	buf := make([]byte, 4096)
	for {
		if _, err := c.Write(buf); err != nil {
			return 0
		}
	}
}

// TestPeerKilled kills the writing process in the middle of a stream, on
// every path: the reader's pending Read fails promptly with a clear error,
// and nothing hangs.
func TestPeerKilled(t *testing.T) {
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	n0 := dev4(t, "n0", Config{})
	for round, c := range []struct {
		ep    *Endpoint
		node  string
		query string
		env   []string
		want  Path
	}{
		{def, "", "", nil, PathShm},
		{def, "", "", nil, PathShm},
		{def, "", "?path=tcp", nil, PathTCP},
		{def, "", "?path=ub", []string{"UB_PROVIDER=tcp"}, PathUB},
		{n0, "n0", "", []string{"UB_TOPOLOGY=example:dev4", "UB_NODE=n1", "UB_PROVIDER=sim"}, PathUB},
	} {
		svc := fmt.Sprintf("killed-%d-%d", os.Getpid(), round)
		l, err := c.ep.Listen(context.Background(), "ub:///"+svc)
		if err != nil {
			t.Fatal(err)
		}
		cmd := testenv.Child(t, "writer", append([]string{"TRANSPORT_TEST_ADDR=ub://" + c.node + "/" + svc + c.query}, c.env...)...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		conn, err := l.Accept()
		l.Close()
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal(err)
		}
		if p := conn.(*Conn).Path(); p != c.want {
			t.Errorf("round %d: path %s, want %s", round, p, c.want)
		}
		buf := make([]byte, 64<<10)
		if _, err := io.ReadFull(conn, buf); err != nil {
			t.Fatal(err)
		}
		cmd.Process.Kill()
		killed := time.Now()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang guard, not a speed target
		for err == nil {
			_, err = conn.Read(buf)
		}
		took := time.Since(killed)
		cmd.Wait()
		if !errors.Is(err, shm.ErrConnReset) {
			t.Fatalf("round %d (%s): read after the writer died: %v", round, c.want, err)
		}
		t.Logf("round %d (%s): %v after SIGKILL (%v)", round, c.want, took.Round(time.Millisecond), err)
		conn.Close()
	}
}

// TestNetConn runs the standard net.Conn conformance tests over the
// same-host path.
func TestNetConn(t *testing.T) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c1, c2, stop := pipe(t)
		return c1, c2, stop, nil
	})
}

func TestHalfCloseAndEOF(t *testing.T) {
	c1, c2, stop := pipe(t)
	defer stop()
	if _, err := c1.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c1.(*Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c2)
	if err != nil || string(got) != "last words" {
		t.Fatalf("read %q, %v", got, err)
	}
	// The other direction still works.
	if _, err := c2.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c1, buf); err != nil || string(buf) != "reply" {
		t.Fatalf("reply %q, %v", buf, err)
	}
	if c1.(*Conn).Path() != PathShm {
		t.Errorf("path %v", c1.(*Conn).Path())
	}
}

func TestListenErrors(t *testing.T) {
	for _, bad := range []string{"tcp://x/y", "ub://node", "ub://node/", "ub://n/a/b", "ub://n/.."} {
		if l, err := Listen(context.Background(), bad); err == nil {
			l.Close()
			t.Errorf("Listen(%q) succeeded", bad)
		}
	}
	addr := fmt.Sprintf("ub:///dup-%d", os.Getpid())
	l, err := Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l2, err := Listen(context.Background(), addr); err == nil {
		l2.Close()
		t.Error("two listeners on one service")
	}
	if _, err := Dial(context.Background(), "ub:///nobody-listens"); err == nil {
		t.Error("dialed a service nobody listens on")
	}
}

// TestSilentDialerBlocksNobody: a process that connects to the rendezvous
// socket and says nothing does not hold up other dialers.
func TestSilentDialerBlocksNobody(t *testing.T) {
	addr := fmt.Sprintf("ub:///silent-%d", os.Getpid())
	l, err := Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, _ := ParseAddr(addr)
	ep, _ := Default()
	silent, err := net.Dial("unix", ep.socketPath(ep.resolve(a)))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr)
	if err != nil {
		t.Fatalf("dial behind a silent dialer: %v", err)
	}
	c.Close()
}

func TestReadPollBacksOff(t *testing.T) {
	p := &poller{}
	polls := 0
	for i := 0; i < 1000; i++ {
		if p.start() {
			polls++
			p.ended(10*time.Millisecond, false) // idle: the poll never pays
		}
	}
	// 1 + 1 + 2 + 4 + ... + 64 waits, then one poll in 65.
	if polls < 10 || polls > 25 {
		t.Fatalf("an idle connection polled %d times in 1000 waits", polls)
	}
	// A poll that pays keeps the reader polling every time.
	for p.skip > 0 {
		p.start()
	}
	for i := 0; i < 100; i++ {
		if !p.start() {
			t.Fatalf("wait %d after a paying poll did not poll", i)
		}
		p.ended(30*time.Microsecond, false)
	}
	// A poll caught late (the peer could not run meanwhile) does not pay.
	p.ended(readSpinPays+time.Microsecond, false)
	if p.start() {
		t.Fatal("the reader polled right after a poll that did not pay")
	}
	// On the ub path (pays: readSpinMax) a catch anywhere within the poll
	// pays, and one after it does not.
	p = &poller{pays: readSpinMax}
	p.ended(readSpinPays+time.Microsecond, false)
	if !p.start() {
		t.Fatal("a ub-path poll caught within the poll made the reader park")
	}
	p.ended(readSpinMax+time.Microsecond, false)
	if p.start() {
		t.Fatal("a ub-path poll caught after the poll did not make the reader back off")
	}
	// A late poll whose write had to wake the peer changes nothing: a
	// reader that was polling goes on polling...
	p = &poller{}
	p.ended(readSpinPays+time.Microsecond, true)
	if !p.start() {
		t.Fatal("a poll excused by the peer's wake-up made the reader park")
	}
	// ... and one that was backing off goes on backing off.
	p.ended(readSpinPays+time.Microsecond, false)
	backoff := p.backoff
	p.ended(readSpinPays+time.Microsecond, true)
	if p.backoff != backoff {
		t.Fatalf("an excused poll moved the backoff from %d to %d", backoff, p.backoff)
	}
	// A wait that outlasted the poll counts even if excused: calls that
	// come further apart than a poll find the peer parked every time, and
	// such a connection must still back off.
	p = &poller{}
	polls = 0
	for i := 0; i < 1000; i++ {
		if p.start() {
			polls++
			p.ended(time.Millisecond, true)
		}
	}
	if polls > 25 {
		t.Fatalf("a connection whose every wait outlasted its poll polled %d times in 1000 waits", polls)
	}
}

// TestAnswerDue: a reader expects an answer after it wrote a request or an
// answer of its own, not after the flow-control trickle a stream's
// receiver writes.
func TestAnswerDue(t *testing.T) {
	for _, c := range []struct {
		read  int
		wrote int64
		want  bool
	}{
		{0, 0, false},        // nothing written: nothing to answer
		{100, 0, false},      // read only
		{64, 64, true},       // echo
		{120, 300, true},     // a gRPC call's frames each way
		{0, 9, true},         // a request before any read
		{1 << 20, 13, false}, // a 1 MiB stream's window update
		{800, 100, true},     // an answer an eighth of the request
		{801, 100, false},
	} {
		if got := answerDue(c.read, c.wrote); got != c.want {
			t.Errorf("answerDue(read %d, wrote %d) = %v, want %v", c.read, c.wrote, got, c.want)
		}
	}
}
