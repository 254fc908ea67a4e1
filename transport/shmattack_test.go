//go:build linux

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
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// Hostile same-user dialers and listeners on the shm path: what they hand
// over is checked, a peer that floods its notification pipe is cut off, and
// one that stops reading its pipe cannot stall this side; after each
// attack the process is idle and holds what it held before.

func init() {
	// The flooding dialer of TestShmFloodedPipe, in a process of its own
	// so that its CPU time is not this one's.
	testenv.RegisterChild("flood", func() int { return floodNotifications(os.Getenv("TRANSPORT_TEST_FLOOD")) })
}

// floodNotifications dials addr over the shm path, then writes into the
// listener's notification pipe as fast as it can, until the listener closes
// it.
func floodNotifications(addr string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	garbage := bytes.Repeat([]byte{0xff}, 4096)
	for {
		if _, err := c.c.(*shmConn).notifyOut.Write(garbage); err != nil {
			return 0
		}
	}
}

// held is what this process holds: descriptors, goroutines, and mappings
// of connection segments.
type held struct{ fds, goroutines, mappings int }

func holding(t *testing.T) held {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return held{len(fds), runtime.NumGoroutine(), strings.Count(string(maps), "memfd:"+shm.NamePrefix+"transport")}
}

// waitReleased waits until the process holds no more than it did at base
// (goroutines may take a moment to end), and fails the test after 10 s.
func waitReleased(t *testing.T, base held) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now := holding(t)
		if now.fds <= base.fds && now.goroutines <= base.goroutines && now.mappings <= base.mappings {
			t.Logf("holding %+v, %+v before", now, base)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("holding %+v, %+v before the attack", now, base)
		}
		time.Sleep(5 * time.Millisecond) // polling, with the deadline above
	}
}

// idleCPU is the CPU time this process uses over d: a few milliseconds
// when idle, d (or more) when a goroutine busy-loops.
func idleCPU(d time.Duration) time.Duration {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	time.Sleep(d) // the period measured
	return cpu() - before
}

// idleLimit is the CPU time an idle process may use in idlePeriod.
const (
	idlePeriod = 300 * time.Millisecond
	idleLimit  = 30 * time.Millisecond
)

// attackedListener listens with an endpoint of its own on a service that
// echoes, and returns the endpoint, the service's address and its
// rendezvous socket.
func attackedListener(t *testing.T) (e *Endpoint, addr, socket string) {
	t.Helper()
	e, err := NewEndpoint(Config{RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	svc := fmt.Sprintf("attacked-%d", serviceSeq.Add(1))
	l, err := e.Listen(context.Background(), "ub:///"+svc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go serveEach(l, func(c net.Conn) { io.Copy(c, c) })
	return e, "ub:///" + svc + "?path=shm", e.socketPath(e.resolve(Addr{Service: svc}))
}

// echoOnce dials addr, and checks that what it writes comes back.
func echoOnce(t *testing.T, e *Endpoint, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := e.Dial(ctx, addr)
	if err != nil {
		t.Fatalf("a well-behaved dialer: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

// hostileDialer hands a listener what it likes in place of a connection's
// segment and pipes; what it opens is closed by close.
type hostileDialer struct {
	t      *testing.T
	uc     *net.UnixConn
	opened []io.Closer
	// hungUp tolerates a listener that refuses before the dialer has sent
	// everything: its sends then fail with EPIPE or ECONNRESET.
	hungUp bool
}

// sent fails the test on a send's error, unless the listener hung up.
func (h *hostileDialer) sent(err error) {
	hungUp := h.hungUp && (errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET))
	if err != nil && !hungUp {
		h.t.Fatal(err)
	}
}

func (h *hostileDialer) keep(c io.Closer) { h.opened = append(h.opened, c) }

func (h *hostileDialer) close() {
	for _, c := range h.opened {
		c.Close()
	}
	h.opened = nil
}

func (h *hostileDialer) pipe() (r, w *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		h.t.Fatal(err)
	}
	h.keep(r)
	h.keep(w)
	return r, w
}

func (h *hostileDialer) open(path string, flag int) *os.File {
	f, err := os.OpenFile(path, flag|os.O_CREATE, 0o600)
	if err != nil {
		h.t.Fatal(err)
	}
	h.keep(f)
	return f
}

func (h *hostileDialer) socket() *os.File {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	h.keep(a)
	h.keep(b)
	return a
}

// segment makes a connection's segment holding size bytes, sealed if seal.
func (h *hostileDialer) segment(size int, seal bool) *shm.Segment {
	offA, offB, offCtl, _ := ringOffsets()
	seg, err := shm.CreateMemfd("transport", size, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.keep(seg)
	if _, err := shm.CreateSPSC(seg, offA, ringCapacity); err != nil {
		h.t.Fatal(err)
	}
	if _, err := shm.CreateSPSC(seg, offB, ringCapacity); err != nil {
		h.t.Fatal(err)
	}
	if err := createMessages(seg, offCtl+256); err != nil {
		h.t.Fatal(err)
	}
	if seal {
		if err := seg.Seal(); err != nil {
			h.t.Fatal(err)
		}
	}
	return seg
}

func (h *hostileDialer) sendSegment(seg *shm.Segment) {
	h.sent(shm.SendSegment(h.uc, seg))
}

// sendGoodSegment sends a segment as dialShm makes it.
func (h *hostileDialer) sendGoodSegment() {
	h.sendSegment(h.segment(connSegmentSize(), true))
}

// send sends one byte, tag, carrying files.
func (h *hostileDialer) send(tag byte, files ...*os.File) {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err := h.uc.WriteMsgUnix([]byte{tag}, syscall.UnixRights(fds...), nil)
	h.sent(err)
}

// shmAttacks are hand-crafted dialers, each handing over something other
// than a connection's sealed segment, the read end of one pipe and the
// write end of another.
var shmAttacks = []struct {
	name string
	send func(h *hostileDialer)
}{
	{"/dev/zero as the read end", func(h *hostileDialer) {
		h.sendGoodSegment()
		_, bW := h.pipe()
		h.send('F', h.open("/dev/zero", os.O_RDONLY), bW)
	}},
	{"/dev/zero as the write end", func(h *hostileDialer) {
		h.sendGoodSegment()
		aR, _ := h.pipe()
		h.send('F', aR, h.open("/dev/zero", os.O_WRONLY))
	}},
	{"a regular file as the read end", func(h *hostileDialer) {
		h.sendGoodSegment()
		_, bW := h.pipe()
		h.send('F', h.open(filepath.Join(h.t.TempDir(), "f"), os.O_RDONLY), bW)
	}},
	{"a socket as the write end", func(h *hostileDialer) {
		h.sendGoodSegment()
		aR, _ := h.pipe()
		h.send('F', aR, h.socket())
	}},
	{"the ends swapped", func(h *hostileDialer) {
		h.sendGoodSegment()
		_, aW := h.pipe()
		bR, _ := h.pipe()
		h.send('F', aW, bR)
	}},
	{"both ends of one pipe", func(h *hostileDialer) {
		h.sendGoodSegment()
		r, w := h.pipe()
		h.send('F', r, w)
	}},
	{"an extra descriptor", func(h *hostileDialer) {
		h.sendGoodSegment()
		aR, _ := h.pipe()
		_, bW := h.pipe()
		h.send('F', aR, bW, h.open(os.DevNull, os.O_RDONLY))
	}},
	{"a truncated control message", func(h *hostileDialer) {
		h.sendGoodSegment()
		aR, _ := h.pipe()
		_, bW := h.pipe()
		many := []*os.File{aR, bW}
		for range 30 {
			many = append(many, bW)
		}
		h.send('F', many...)
	}},
	{"an unsealed memfd", func(h *hostileDialer) {
		h.sendSegment(h.segment(connSegmentSize(), false))
		aR, _ := h.pipe()
		_, bW := h.pipe()
		h.send('F', aR, bW)
	}},
	{"a memfd larger than a connection's", func(h *hostileDialer) {
		h.sendSegment(h.segment(connSegmentSize()+1<<20, true))
		aR, _ := h.pipe()
		_, bW := h.pipe()
		h.send('F', aR, bW)
	}},
	{"a regular file as the segment", func(h *hostileDialer) {
		f := h.open(filepath.Join(h.t.TempDir(), "seg"), os.O_RDWR)
		f.Truncate(int64(connSegmentSize()))
		h.send('S', f)
	}},
	{"two descriptors as the segment", func(h *hostileDialer) {
		aR, bW := h.pipe()
		h.send('S', aR, bW)
	}},
}

// TestShmListenerChecksDescriptors: a same-user dialer that hands over
// anything but a connection's sealed segment and the two pipe ends
// (/dev/zero, a regular file or a socket as a pipe, extra descriptors, an
// unsealed or oversized memfd) is refused with ErrBadDescriptor; the
// listener keeps serving well-behaved dialers, and afterwards the process
// is idle and holds no more descriptors, goroutines or mappings than
// before.
func TestShmListenerChecksDescriptors(t *testing.T) {
	e, addr, socket := attackedListener(t)
	base := holding(t)
	for _, attack := range shmAttacks {
		// acceptShm's verdict, over a socket pair.
		a, b := unixPair(t)
		h := &hostileDialer{t: t, uc: a}
		attack.send(h)
		sc, err := acceptShm(b, Addr{Service: "attacked"})
		if err == nil {
			sc.Close()
		}
		if !errors.Is(err, shm.ErrBadDescriptor) {
			t.Errorf("%s: acceptShm: %v, want shm.ErrBadDescriptor", attack.name, err)
		}
		h.close()
		a.Close()
		b.Close()
		// The listener's.
		uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		uc.SetDeadline(time.Now().Add(10 * time.Second))
		h = &hostileDialer{t: t, uc: uc, hungUp: true}
		if _, err := uc.Write([]byte{helloShm}); err != nil {
			t.Fatal(err)
		}
		attack.send(h)
		var answer [1]byte
		if _, err := io.ReadFull(uc, answer[:]); err == nil {
			t.Errorf("%s: the listener accepted", attack.name)
		}
		h.close()
		uc.Close()
		echoOnce(t, e, addr)
	}
	used := idleCPU(idlePeriod)
	t.Logf("after %d attacks: %v of CPU in %v", len(shmAttacks), used, idlePeriod)
	if used > idleLimit {
		t.Errorf("the process used %v of CPU in %v after the attacks", used, idlePeriod)
	}
	waitReleased(t, base)
}

// unixPair returns the two ends of a connected unix socket.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestShmFloodedPipe: a peer that writes into the notification pipe more
// than the one byte per wait the protocol allows (here a dialer in another
// process writing as fast as it can) ends the connection: the reader's
// Read fails with ECONNRESET instead of reading the flood for ever, the
// process stays idle while the flooder runs, and, once the connection is
// closed, holds what it held before. The dialer side is checked the same
// way, against a listener that floods.
func TestShmFloodedPipe(t *testing.T) {
	t.Run("listener", func(t *testing.T) {
		e, addr, _ := attackedListener(t)
		l, err := e.Listen(context.Background(), "ub:///flooded")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		base := holding(t)
		cmd := testenv.Child(t, "flood", "TRANSPORT_TEST_FLOOD=ub:///flooded?path=shm", "UBKIT_RUNTIME_DIR="+e.dir)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := l.Accept(); err == nil {
				accepted <- c
			}
		}()
		var c net.Conn
		select {
		case c = <-accepted:
		case <-time.After(10 * time.Second):
			t.Fatal("the flooding dialer did not connect")
		}
		read := readUntilError(c)
		used := idleCPU(idlePeriod)
		t.Logf("%v of CPU in %v while the peer floods", used, idlePeriod)
		if used > idleLimit {
			t.Errorf("the process used %v of CPU in %v while a peer flooded its notification pipe", used, idlePeriod)
		}
		checkFloodError(t, read)
		// Cut off, the flooder's next write fails, and it exits.
		select {
		case err := <-exited:
			exited <- err
			if err != nil {
				t.Fatalf("the flooding dialer: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the flooding dialer still writes into its pipe 10 s after it was cut off")
		}
		c.Close()
		waitReleased(t, base)
		echoOnce(t, e, addr)
	})
	t.Run("dialer", func(t *testing.T) {
		e, _, _ := attackedListener(t)
		base := holding(t)
		d, a := connect(t, e, e, "", "?path=shm", PathShm)
		// The listener's side floods what the dialer reads.
		go func() {
			garbage := bytes.Repeat([]byte{0xff}, 4096)
			for {
				if _, err := a.c.(*shmConn).notifyOut.Write(garbage); err != nil {
					return
				}
			}
		}()
		checkFloodError(t, readUntilError(d))
		d.Close()
		a.Close()
		waitReleased(t, base)
	})
}

// TestShmFloodEndsBlockedWriter: when a flood ends the connection, a Write
// already blocked on a full ring (the peer reads nothing) returns with the
// same error at once, not at its deadline or Close.
func TestShmFloodEndsBlockedWriter(t *testing.T) {
	e, _, _ := attackedListener(t)
	d, a := connect(t, e, e, "", "?path=shm", PathShm)
	defer d.Close()
	defer a.Close()
	wrote := make(chan error, 1)
	go func() {
		_, err := d.Write(make([]byte, 8<<20)) // more than the ring holds
		wrote <- err
	}()
	// The writer is blocked once the ring is full.
	deadline := time.Now().Add(10 * time.Second)
	for d.c.(*shmConn).wroteSince.Load() < int64(ringCapacity-2*maxChunk) {
		if time.Now().After(deadline) {
			t.Fatal("the ring did not fill")
		}
		time.Sleep(time.Millisecond) // polling for the condition above
	}
	go func() {
		garbage := bytes.Repeat([]byte{0xff}, 4096)
		for {
			if _, err := a.c.(*shmConn).notifyOut.Write(garbage); err != nil {
				return
			}
		}
	}()
	checkFloodError(t, readUntilError(d))
	select {
	case err := <-wrote:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the blocked Write: %v, want ECONNRESET", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Write blocked on the full ring still waits 10 s after the connection was cut off")
	}
}

// readUntilError reads c until a read fails, and reports that error.
func readUntilError(c net.Conn) <-chan error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

func checkFloodError(t *testing.T, read <-chan error) {
	t.Helper()
	select {
	case err := <-read:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Read while the peer floods its notification pipe: %v, want ECONNRESET", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Read still reads 10 s after the peer began flooding its notification pipe")
	}
}

// TestShmWriteIgnoresAStalledPipe: a peer that keeps saying its reader is
// parked but never reads its notification pipe cannot stall this side's
// writes once the pipe is full: each Write returns, and the connection is
// not held up.
func TestShmWriteIgnoresAStalledPipe(t *testing.T) {
	def, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	d, a := connect(t, def, def, "", "?path=shm", PathShm)
	defer d.Close()
	defer a.Close()
	peer, victim := d.c.(*shmConn), a.c.(*shmConn)
	// A pipe of one page: it fills after 4096 wake-ups.
	const pipeSize = 4096
	raw, err := peer.notifyIn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr syscall.Errno
	raw.Control(func(fd uintptr) {
		const fSetPipeSize = 1031 // F_SETPIPE_SZ
		_, _, serr = syscall.Syscall(syscall.SYS_FCNTL, fd, fSetPipeSize, pipeSize)
	})
	if serr != 0 {
		t.Fatal(serr)
	}
	done := make(chan error, 1)
	go func() {
		for range 2 * pipeSize {
			// The peer says it waits, takes what came, and never reads
			// its pipe.
			peer.waitIn.Store(readerParked)
			if _, err := victim.Write([]byte{1}); err != nil {
				done <- err
				return
			}
			if _, err := peer.cons.Next(); err != nil {
				done <- err
				return
			}
			peer.cons.Release()
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Write blocked on the peer's full notification pipe")
	}
}

// TestShmDialerChecksTheAnswer: a listener that answers a same-node dialer
// with anything but its one byte fails the dial, and descriptors it sends
// along with its answer never reach the dialer.
func TestShmDialerChecksTheAnswer(t *testing.T) {
	e, err := NewEndpoint(Config{RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a := e.resolve(Addr{Service: "hostile"})
	if err := e.ensureDirs(a.Node); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: e.socketPath(a), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	base := holding(t)
	for _, answer := range []byte{shmAccepted, 0x7f} {
		listened := make(chan error, 1)
		go func() { listened <- answerShmDialer(l, answer) }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := e.Dial(ctx, "ub:///hostile?path=shm")
		cancel()
		if err == nil {
			c.Close()
		}
		if (err == nil) != (answer == shmAccepted) {
			t.Errorf("a dial answered %#x: %v", answer, err)
		}
		if err := <-listened; err != nil {
			t.Fatal(err)
		}
	}
	waitReleased(t, base)
}

// answerShmDialer takes one dialer's segment and pipes, answers it with
// answer and three descriptors, and closes everything once the dialer is
// done.
func answerShmDialer(l *net.UnixListener, answer byte) error {
	uc, err := l.AcceptUnix()
	if err != nil {
		return err
	}
	defer uc.Close()
	uc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(uc, make([]byte, 1)); err != nil {
		return err
	}
	seg, err := shm.ReceiveSegment(uc, nil)
	if err != nil {
		return err
	}
	defer seg.Close()
	pipes, err := shm.ReceivePipes(uc, shm.PipeReadEnd, shm.PipeWriteEnd)
	if err != nil {
		return err
	}
	for _, p := range pipes {
		defer p.Close()
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	fd := int(null.Fd())
	if _, _, err := uc.WriteMsgUnix([]byte{answer}, syscall.UnixRights(fd, fd, fd), nil); err != nil {
		return err
	}
	// The dialer is done when it closes the rendezvous socket.
	io.Copy(io.Discard, uc)
	return nil
}
