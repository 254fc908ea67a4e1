package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// packetCases are the paths made of packets (ub and tcp).
func packetCases(t *testing.T) map[string]func() (*Conn, *Conn) {
	all := pathCases(t)
	return map[string]func() (*Conn, *Conn){"ub-tcp": all["ub-tcp"], "ub-sim": all["ub-sim"], "tcp": all["tcp"]}
}

// readAllSlowly reads to the end, pausing between reads.
func readAllSlowly(c net.Conn) ([]byte, error) {
	var got []byte
	buf := make([]byte, 16<<10)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return got, err
		}
		time.Sleep(20 * time.Microsecond) // a pace, not a synchronisation
	}
}

// TestCloseDeliversToASlowReader: the writer writes more than the reader's
// queue holds and closes; the reader, starting late and reading slowly,
// still gets every byte, then io.EOF (not a reset).
func TestCloseDeliversToASlowReader(t *testing.T) {
	for name, mk := range packetCases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk()
			defer b.Close()
			data, done := writeBeyondQueueAndClose(a, nil)
			waitWriterBlocked(t)
			got, err := readAllSlowly(b)
			if err != io.EOF || !bytes.Equal(got, data) {
				t.Fatalf("read %d of %d bytes, then %v", len(got), len(data), err)
			}
			if err := <-done; err != nil {
				t.Fatalf("writer: %v", err)
			}
		})
	}
}

// waitWriterBlocked waits until a Write blocks, for want of credit: a
// reader that starts now starts late.
func waitWriterBlocked(t *testing.T) {
	t.Helper()
	testenv.WaitParked(t, 1, "", "transport.(*Conn).Write(")
}

// writeBeyondQueueAndClose writes more than a reader's queue holds to a,
// closes it, then runs after (if any); done reports the write's or the
// Close's error.
func writeBeyondQueueAndClose(a *Conn, after func()) (data []byte, done <-chan error) {
	data = bytes.Repeat([]byte("0123456789abcdef"), (DefaultStreamWindow+10*64<<10)/16)
	ch := make(chan error, 1)
	go func() {
		_, err := a.Write(data)
		if cerr := a.Close(); err == nil {
			err = cerr
		}
		if after != nil {
			after()
		}
		ch <- err
	}()
	return data, ch
}

// TestCloseWhilePeerFarBehind: Close returns while the peer, far behind,
// reads nothing, and the peer, reading again only once Close and any
// lingering it does are over, still reads everything, then io.EOF.
func TestCloseWhilePeerFarBehind(t *testing.T) {
	for name, mk := range packetCases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk()
			defer b.Close()
			data := bytes.Repeat([]byte{7}, 5<<20)
			wrote, closed := make(chan struct{}), make(chan struct{})
			go func() {
				a.Write(data)
				close(wrote)
				a.Close()
				close(closed)
			}()
			// The peer reads only what the Write needs to end (more than
			// its window), then stops.
			var got []byte
			buf := make([]byte, 16<<10)
			for reading := true; reading; {
				n, err := b.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					t.Fatalf("read %d of %d bytes while the Write went on: %v", len(got), len(data), err)
				}
				select {
				case <-wrote:
					reading = false
				default:
				}
			}
			select {
			case <-closed:
			case <-time.After(30 * time.Second): // a hang guard
				t.Fatalf("Close waits for a peer %d bytes behind to read", len(data)-len(got))
			}
			t.Logf("Close returned with the peer %d bytes behind", len(data)-len(got))
			rest, err := readAllSlowly(b)
			got = append(got, rest...)
			if err != io.EOF || len(got) != len(data) {
				t.Fatalf("read %d of %d bytes, then %v", len(got), len(data), err)
			}
		})
	}
}

// TestWriteDeadlineKeepsPacketsWhole: writes that run into their deadline
// report what they wrote; after the deadline is lifted the stream goes on,
// and the reader gets exactly the bytes reported, in order.
func TestWriteDeadlineKeepsPacketsWhole(t *testing.T) {
	for name, mk := range packetCases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk()
			defer a.Close()
			defer b.Close()
			var sent bytes.Buffer
			chunk := make([]byte, 100<<10)
			for i := range 60 {
				for j := range chunk {
					chunk[j] = byte(i + j)
				}
				a.SetWriteDeadline(time.Now().Add(2 * time.Millisecond))
				n, err := a.Write(chunk)
				sent.Write(chunk[:n])
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatal(err)
				}
			}
			type result struct {
				b   []byte
				err error
			}
			read := make(chan result, 1)
			go func() {
				got, err := io.ReadAll(b)
				read <- result{got, err}
			}()
			a.SetWriteDeadline(time.Time{})
			if _, err := a.Write([]byte("end")); err != nil {
				t.Fatal(err)
			}
			sent.WriteString("end")
			if err := a.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			r := <-read
			if r.err != nil || !bytes.Equal(r.b, sent.Bytes()) {
				t.Fatalf("read %d bytes, %d reported written (%v)", len(r.b), sent.Len(), r.err)
			}
		})
	}
}

// TestCloseRacesDeadlineChanges: another goroutine moving the write
// deadline cannot keep Close from waking a blocked Write.
func TestCloseRacesDeadlineChanges(t *testing.T) {
	for name, mk := range packetCases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk()
			defer b.Close()
			go a.Write(make([]byte, 64<<20)) // blocks: b does not read
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for {
					select {
					case <-stop:
						return
					default:
						a.SetWriteDeadline(time.Now().Add(time.Hour))
					}
				}
			}()
			waitWriterBlocked(t)
			done := make(chan struct{})
			go func() {
				a.Close()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(30 * time.Second): // a hang guard
				t.Fatal("Close hung")
			}
		})
	}
}

// TestCloseWriteNeedsNoCredit: with the peer not reading, a Write stops
// at the peer's window (and fails at its deadline), but CloseWrite still
// returns at once, since the end of the stream takes no credit; the peer
// then reads every byte written, then io.EOF.
func TestCloseWriteNeedsNoCredit(t *testing.T) {
	for name, mk := range packetCases(t) {
		t.Run(name, func(t *testing.T) {
			a, b := mk()
			defer a.Close()
			defer b.Close()
			a.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := a.Write(make([]byte, 32<<20))
			if !errors.Is(err, os.ErrDeadlineExceeded) || n > DefaultStreamWindow {
				t.Fatalf("wrote %d bytes to a peer that does not read (window %d), then %v", n, DefaultStreamWindow, err)
			}
			a.SetWriteDeadline(time.Time{})
			closed := make(chan error, 1)
			go func() { closed <- a.CloseWrite() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("CloseWrite with a full window: %v", err)
				}
			case <-time.After(10 * time.Second): // a hang guard
				t.Fatal("CloseWrite waits for credit")
			}
			got, err := io.ReadAll(b)
			if err != nil || len(got) != n {
				t.Fatalf("read %d of %d bytes: %v", len(got), n, err)
			}
		})
	}
}

// TestListenerSurvivesAcceptErrors: running out of descriptors for a moment
// does not end the listener.
func TestListenerSurvivesAcceptErrors(t *testing.T) {
	e, err := NewEndpoint(Config{RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	l, err := e.Listen(context.Background(), "ub:///emfile")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go serveEach(l, func(net.Conn) {})
	old, err := fdlimit.Limit()
	if err != nil {
		t.Fatal(err)
	}
	if err := fdlimit.SetLimit(256); err != nil {
		t.Fatal(err)
	}
	var keep []*os.File
	restore := sync.OnceFunc(func() {
		for _, f := range keep {
			f.Close()
		}
		fdlimit.SetLimit(old)
	})
	defer restore()
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		keep = append(keep, f)
	}
	keep[len(keep)-1].Close() // room for the dialer's socket, none for the accept
	keep = keep[:len(keep)-1]
	c, err := net.Dial("unix", e.socketPath(e.resolve(Addr{Service: "emfile"})))
	if err != nil {
		t.Fatalf("dialing with one descriptor free: %v", err)
	}
	// The listener, out of descriptors for the accept, backs off before
	// it tries again.
	testenv.WaitParked(t, 1, "select", "transport.(*Listener).acceptLoop(")
	c.Close()
	restore()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := e.Dial(ctx, "ub:///emfile")
	if err != nil {
		t.Fatalf("dial after a moment without descriptors: %v", err)
	}
	conn.Close()
}

// TestRuntimeDirChecks: a registry directory others can write to, or a
// symbolic link in its place, is refused.
func TestRuntimeDirChecks(t *testing.T) {
	open := t.TempDir()
	os.Chmod(open, 0o777)
	e, _ := NewEndpoint(Config{RuntimeDir: open})
	if _, err := e.Listen(context.Background(), "ub:///x"); err == nil {
		t.Error("listened in a world-writable registry")
	}
	base := t.TempDir()
	link := filepath.Join(base, "link")
	os.Symlink(t.TempDir(), link)
	e, _ = NewEndpoint(Config{RuntimeDir: link})
	if _, err := e.Listen(context.Background(), "ub:///x"); err == nil {
		t.Error("listened in a registry reached through a symbolic link")
	}
}

// TestPeerCredentials: a process of another user is refused on the
// rendezvous socket unless Config.AllowUIDs names its user.
func TestPeerCredentials(t *testing.T) {
	u := testenv.OtherUser(t)
	// Not t.TempDir: its parent is this user's alone, and the other user
	// must reach the socket.
	dir, err := os.MkdirTemp("", "ubkit-peercred-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	path := filepath.Join(dir, "peer.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	os.Chmod(path, 0o777)
	cmd := u.Child(t, "dial-unix", "TRANSPORT_TEST_DIAL_UNIX="+path, "UBKIT_RUNTIME_DIR="+dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	l.SetDeadline(time.Now().Add(10 * time.Second)) // a hang guard
	uc, err := l.AcceptUnix()
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	defer uc.Close()
	if err := checkPeer(uc, nil); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", u.UID)) {
		t.Errorf("a dialer running as uid %d was not refused: %v", u.UID, err)
	}
	if err := checkPeer(uc, []int{u.UID}); err != nil {
		t.Errorf("AllowUIDs did not let uid %d in: %v", u.UID, err)
	}
}

// ownFabricPair connects n0 to n1 of dev4 over the ub path on a simulated
// fabric of the test's own, so that the faults it sets reach no other
// test, and returns the connection's ends and the fabric (closed and
// removed by the test's cleanup).
func ownFabricPair(t *testing.T, name string) (a, b *Conn, f *simprov.Fabric) {
	t.Helper()
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	fabric := fmt.Sprintf("%s-%d", name, os.Getpid())
	cfg := Config{ProviderOptions: map[string]string{"fabric": fabric}}
	a, b = connect(t, dev4(t, "n0", cfg), dev4(t, "n1", cfg), "n0", "", PathUB)
	f, err = simprov.OpenFabricNamed(topo, fabric)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Remove()
		f.Close()
	})
	return a, b, f
}

// TestLinkDownEndsBothSides: a simulated link that goes down in the middle
// of a stream loses packets and credits; both ends then fail with an error
// instead of waiting for them forever.
func TestLinkDownEndsBothSides(t *testing.T) {
	a, b, f := ownFabricPair(t, "linkdown")
	defer a.Close()
	defer b.Close()
	readErr := make(chan error, 1)
	reading := make(chan struct{})
	go func() {
		_, err := io.ReadFull(b, make([]byte, 1))
		close(reading)
		if err == nil {
			_, err = io.Copy(io.Discard, b)
		}
		if err == nil {
			err = errors.New("io.EOF")
		}
		readErr <- err
	}()
	writeErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := a.Write(buf); err != nil {
				writeErr <- err
				return
			}
		}
	}()
	select {
	case <-reading: // the stream runs
	case <-time.After(10 * time.Second): // a hang guard
		t.Fatal("nothing arrived over the link")
	}
	if err := f.SetLinkDown("n0", "n1", true); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan error{"write": writeErr, "read": readErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, shm.ErrConnReset) {
				t.Errorf("%s after the link went down: %v, want a connection reset", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s side still waits 10 s after the link went down", name)
		}
	}
}

// TestCloseReportsUndelivered: a packet that cannot arrive within Close's
// linger is lost when Close releases the link, and Close says so. Before,
// the Write and the Close both succeeded and only the reader learnt of the
// loss ("the peer closed with 1 packets still undelivered", seen in
// TestSlowAcceptKeepsConnections on a loaded machine). The slowed link
// makes the packet take 20 s, which no wait of closeLinger outlasts.
func TestCloseReportsUndelivered(t *testing.T) {
	a, b, f := ownFabricPair(t, "slowclose")
	defer b.Close()
	// dev4's links take 20 µs; a million times slower, 20 s.
	if err := f.SetLinkSlow("n0", "n1", 1e6); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Close with its packet undelivered: %v, want an error matching os.ErrDeadlineExceeded", err)
	}
	if got, err := io.ReadAll(b); !errors.Is(err, shm.ErrConnReset) {
		t.Errorf("the reader got %q, then %v; want a connection reset", got, err)
	}
}

// TestGracefulCloseThenExit: the writer writes more than the reader holds,
// closes, and its ub context goes (its process ends after Close). The
// reader's credit returns then fail, which is not a fault of the path: it
// still reads every byte, then io.EOF.
func TestGracefulCloseThenExit(t *testing.T) {
	for round := range 3 {
		la, err := NewEndpoint(Config{Provider: "tcp"})
		if err != nil {
			t.Fatal(err)
		}
		defer la.Close()
		da, err := NewEndpoint(Config{Provider: "tcp"})
		if err != nil {
			t.Fatal(err)
		}
		a, b := connect(t, la, da, "", "?path=ub", PathUB)
		// After Close, the writer's process ends: its endpoint goes.
		data, done := writeBeyondQueueAndClose(a, func() { da.Close() })
		waitWriterBlocked(t)
		got, err := readAllSlowly(b)
		b.Close()
		<-done
		if err != io.EOF || !bytes.Equal(got, data) {
			t.Fatalf("round %d: read %d of %d bytes, then %v", round, len(got), len(data), err)
		}
	}
}

// TestEndpointCloseWithOpenConns: closing an endpoint while connections
// on the ub path are busy (a writer and a reader on each end) ends them
// with errors, before the ub context's memory goes: nothing touches that
// memory after (it was a fault: the credit loop and writers read the
// unmapped segment).
func TestEndpointCloseWithOpenConns(t *testing.T) {
	for round := range 20 {
		e, err := NewEndpoint(Config{RuntimeDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		var conns []*Conn
		for range 3 {
			a, b := connect(t, e, e, "", "?path=ub", PathUB)
			conns = append(conns, a, b)
		}
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(func() {
				buf := make([]byte, 32<<10)
				for {
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			})
			wg.Go(func() { io.Copy(io.Discard, c) })
		}
		if err := e.Close(); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		wg.Wait() // every Write and Read ended
		for _, c := range conns {
			if _, err := c.Write([]byte("x")); err == nil {
				t.Fatalf("round %d: a write on a connection of a closed endpoint succeeded", round)
			}
			c.Close()
		}
	}
}

// TestAcceptConnHonoursContext: AcceptConn ends with its context, the
// listener goes on, and the next dialer is accepted as a *Conn.
func TestAcceptConnHonoursContext(t *testing.T) {
	e, err := NewEndpoint(Config{RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	l, err := e.Listen(context.Background(), "ub:///acceptconn")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.AcceptConn(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcceptConn with its context cancelled: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second) // a hang guard
	defer cancel()
	go func() {
		if c, err := e.Dial(ctx, "ub:///acceptconn"); err == nil {
			defer c.Close()
			c.Write([]byte("x"))
			<-ctx.Done()
		}
	}()
	c, err := l.AcceptConn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Path() != PathShm {
		t.Errorf("path %v", c.Path())
	}
	cancel()
}
