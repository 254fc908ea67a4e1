package mq

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub"
)

// Regression tests of the review of the remote reader and replication
// (docs/mq.md, "Across the super node").

// TestNewReaderOnlyAtRecords: NewReader accepts an offset where a record
// (committed, aborted or padding) starts, a segment's start and the tail,
// and refuses every other 8-aligned offset, beyond the tail too; a reader
// from each record's offset reads that record.
func TestNewReaderOnlyAtRecords(t *testing.T) {
	const size = 4096
	l := newLog(t, Config{SegmentSize: size, Segments: 8})
	ctx := context.Background()
	boundary := map[uint64]bool{}
	committed := map[uint64]int{} // offset: payload length
	for i := range 40 {
		n := (i * 53) % 700
		res, err := l.Loan(ctx, 0, n)
		if err != nil {
			t.Fatal(err)
		}
		o := res.Offset()
		boundary[o], boundary[o+align8(headerSize+uint64(n))] = true, true
		for j := range res.Bytes() {
			res.Bytes()[j] = byte(i + j)
		}
		if i%5 == 3 {
			res.Abort()
			continue
		}
		if err := res.Commit(); err != nil {
			t.Fatal(err)
		}
		committed[o] = n
	}
	st, _ := l.Stats(0)
	if st.Tail < 3*size {
		t.Fatalf("tail %d: the test wants records in three segments", st.Tail)
	}
	for k := uint64(0); k*size <= st.Tail; k++ {
		boundary[k*size] = true
	}
	for o := uint64(0); o <= st.Tail+64; o += 8 {
		r, err := l.NewReader(0, o)
		if !boundary[o] || o > st.Tail {
			if err == nil {
				r.Close()
				t.Fatalf("NewReader from %d (no record's, tail %d): accepted", o, st.Tail)
			}
			continue
		}
		if err != nil {
			t.Fatalf("NewReader from %d (a record's): %v", o, err)
		}
		if n, ok := committed[o]; ok {
			rec, err := r.Next(timeout(t, time.Second))
			if err != nil || rec.Offset != o || len(rec.Payload) != n {
				t.Fatalf("reader from %d: record at %d of %d bytes, %v; want %d bytes", o, rec.Offset, len(rec.Payload), err, n)
			}
		}
		r.Close()
	}
	if st, _ := l.Stats(0); st.Aborted != 0 {
		t.Errorf("readers aborted %d records", st.Aborted)
	}
}

// TestRemoteFromInsidePayload: a dialer asking for an 8-aligned offset
// inside a committed payload whose words look like the header of a dead
// producer's record is refused; before the fix its server-side Reader
// aborted that "record", writing into the committed payload, and every
// reader of the partition then failed on it with shm.ErrCorrupt.
func TestRemoteFromInsidePayload(t *testing.T) {
	for _, c := range []struct {
		name string
		word uint64 // the payload word at from
		at   int    // its place in the payload
	}{
		{"a free slot's writing header", 255<<4 | stateWriting, 0},
		{"little-endian 1", 1, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 64 << 10})
			ctx := timeout(t, 10*time.Second)
			payload := make([]byte, 32)
			binary.LittleEndian.PutUint64(payload[c.at:], c.word)
			if _, err := l.Send(ctx, 0, payload); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Send(ctx, 0, []byte("after")); err != nil {
				t.Fatal(err)
			}
			_, addr := serve(t, l, tcpPath, ServeConfig{})
			from := uint64(headerSize + c.at)
			r, err := tcpPath.dialer(t, nil).DialReader(ctx, addr, l.Name(), 0, from)
			if err == nil {
				defer r.Close()
				rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				rec, err := r.Next(rctx)
				cancel()
				t.Errorf("a reader from %d, inside a payload, was accepted: %+v %v", from, rec, err)
			} else if !errors.Is(err, ErrProtocol) {
				t.Errorf("a reader from %d: %v, want ErrProtocol (no record's offset)", from, err)
			}
			lr := newReader(t, l, 0, 0)
			for _, want := range [][]byte{payload, []byte("after")} {
				rec, err := lr.Next(ctx)
				if err != nil || string(rec.Payload) != string(want) {
					t.Fatalf("local reader: %q %v, want %q", rec.Payload, err, want)
				}
			}
			if st, _ := l.Stats(0); st.Aborted != 0 {
				t.Errorf("%d records aborted", st.Aborted)
			}
		})
	}
}

// TestRemoteSendsBeforeAHeldRecord: records committed before a record
// that is still being written (a held Loan), or that was aborted with
// nothing after it, reach a remote reader at once, as a local reader
// gets them; before the fix the server waited for a later record before
// it sent its batch.
func TestRemoteSendsBeforeAHeldRecord(t *testing.T) {
	for _, held := range []bool{true, false} {
		name := map[bool]string{true: "held loan", false: "aborted loan"}[held]
		t.Run(name, func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 64 << 10})
			ctx := timeout(t, 10*time.Second)
			offA, err := l.Send(ctx, 0, []byte("A"))
			if err != nil {
				t.Fatal(err)
			}
			res, err := l.Loan(ctx, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if held {
				defer res.Abort()
			} else {
				res.Abort()
			}
			_, addr := serve(t, l, tcpPath, ServeConfig{})
			r := dialReader(t, tcpPath.dialer(t, nil), addr, l.Name(), 0, 0)
			rec, err := r.Next(timeout(t, 2*time.Second))
			if err != nil || rec.Offset != offA || string(rec.Payload) != "A" {
				t.Fatalf("remote reader: %d %q %v, want A at %d, committed before the %s", rec.Offset, rec.Payload, err, offA, name)
			}
			if held {
				// The held record goes once it is committed.
				copy(res.Bytes(), "0123456789")
				if err := res.Commit(); err != nil {
					t.Fatal(err)
				}
				if rec, err := r.Next(timeout(t, 2*time.Second)); err != nil || rec.Offset != res.Offset() || string(rec.Payload) != "0123456789" {
					t.Fatalf("remote reader after the commit: %d %q %v", rec.Offset, rec.Payload, err)
				}
			}
		})
	}
}

// TestReplicaPostsBeforeAHeldRecord: the same on the replication path:
// under AckFollower the record before a held or aborted Loan is posted
// and acknowledged at once; before the fix it waited for a later record,
// so a Send on a quiet partition did not return.
func TestReplicaPostsBeforeAHeldRecord(t *testing.T) {
	t.Run("held loan", func(t *testing.T) {
		n0, n1, _ := simNodes(t)
		leader := newLog(t, Config{SegmentSize: 16 << 10, Segments: 16})
		follower := newLog(t, Config{SegmentSize: 16 << 10, Segments: 16})
		ctx := timeout(t, 10*time.Second)
		offA, err := leader.Send(ctx, 0, []byte("A"))
		if err != nil {
			t.Fatal(err)
		}
		res, err := leader.Loan(ctx, 0, 10) // another producer, filling its loan
		if err != nil {
			t.Fatal(err)
		}
		defer res.Abort()
		r, f := replicate(t, leader, 0, n0, n1, follower, ReplicaConfig{Ack: AckFollower}, FollowerConfig{})
		if err := r.WaitAcked(timeout(t, 2*time.Second), offA); err != nil {
			t.Fatalf("A, committed before the held loan, not on the follower after 2 s: %v; leader %+v follower %+v", err, r.Stats(), f.Stats())
		}
		lr := newReader(t, follower, 0, 0)
		if rec, err := lr.Next(timeout(t, time.Second)); err != nil || string(rec.Payload) != "A" {
			t.Fatalf("follower: %q %v", rec.Payload, err)
		}
	})
	t.Run("aborted loan", func(t *testing.T) {
		n0, n1, _ := simNodes(t)
		leader := newLog(t, Config{SegmentSize: 16 << 10, Segments: 16})
		follower := newLog(t, Config{SegmentSize: 16 << 10, Segments: 16})
		r, f := replicate(t, leader, 0, n0, n1, follower, ReplicaConfig{Ack: AckFollower}, FollowerConfig{})
		ctx := timeout(t, 10*time.Second)
		// A loan held before A keeps the replica's reader before A, so
		// that it finds A and then a loan aborted after it.
		res, err := leader.Loan(ctx, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		offA, err := leader.Send(ctx, 0, []byte("A"))
		if err != nil {
			t.Fatal(err)
		}
		res2, err := leader.Loan(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		res.Bytes()[0] = 'z'
		if err := res.Commit(); err != nil {
			t.Fatal(err)
		}
		res2.Abort()
		if err := r.WaitAcked(timeout(t, 2*time.Second), offA); err != nil {
			t.Fatalf("A not acknowledged after 2 s: %v; leader %+v follower %+v", err, r.Stats(), f.Stats())
		}
	})
}

// TestServerCloseWhileAccepting: Close while dialers keep coming waits
// for every goroutine the server started (they were counted after the
// lock, racing Close's Wait), and leaves no connection served. A stress
// test: run it with -race.
func TestServerCloseWhileAccepting(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 64 << 10})
	for range 30 {
		ln, _ := tcpPath.listen(t)
		s := NewServer(l, ServeConfig{MaxConns: 2})
		served := make(chan error, 1)
		go func() { served <- s.Serve(ln) }()
		stop := make(chan struct{})
		dialed := make(chan struct{})
		go func() {
			defer close(dialed)
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					return // the listener is closed
				}
				c.Write(appendHello(nil, hello{name: l.Name(), from: 0, window: MinWindow}))
				defer c.Close()
			}
		}()
		s.Close()
		close(stop)
		<-dialed
		if err := <-served; err != nil && !errors.Is(err, ErrClosed) {
			t.Fatalf("Serve: %v", err)
		}
		if st := s.Stats(); st.Active != 0 {
			t.Fatalf("after Close: %+v", st)
		}
	}
}

// TestRemoteCreditTimeout: a reader that says hello and then never
// returns credit, with records waiting, is dropped after CreditTimeout
// (before, it held its connection, and a reader slot of the log, for
// ever), having been sent no more than its window.
func TestRemoteCreditTimeout(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 64 << 10, Segments: 8})
	ctx := timeout(t, 10*time.Second)
	for range 200 {
		if _, err := l.Send(ctx, 0, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	s, addr := serve(t, l, tcpPath, ServeConfig{CreditTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(appendHello(nil, hello{name: l.Name(), from: 0, window: MinWindow})); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	if err != nil {
		t.Fatalf("a reader returning no credit was not dropped: %v after %v, %d bytes (server %+v)", err, time.Since(start), n, s.Stats())
	}
	if n > MinWindow+64 {
		t.Errorf("%d bytes sent to a reader of a %d-byte window", n, MinWindow)
	}
	t.Logf("dropped after %v, %d bytes sent", time.Since(start).Round(time.Millisecond), n)
}

// TestRemotePeerLimit: one peer holds at most MaxConnsPerPeer of the
// server's connections; beyond, it gets ErrBusy.
func TestRemotePeerLimit(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 64 << 10})
	_, addr := serve(t, l, tcpPath, ServeConfig{MaxConns: 8, MaxConnsPerPeer: 2})
	d := tcpPath.dialer(t, nil)
	dialReader(t, d, addr, l.Name(), 0, 0)
	dialReader(t, d, addr, l.Name(), 0, 0)
	if r, err := d.DialReader(timeout(t, 10*time.Second), addr, l.Name(), 0, 0); !errors.Is(err, ErrBusy) {
		if err == nil {
			r.Close()
		}
		t.Fatalf("a third reader from one peer with MaxConnsPerPeer 2: %v, want ErrBusy", err)
	}
	if got := NewServer(l, ServeConfig{}).cfg.MaxConnsPerPeer; got != 8 {
		t.Errorf("default MaxConnsPerPeer %d, want half of 16", got)
	}
}

// TestRemoteAuthorize: ServeConfig.Authorize sees each reader's
// connection (over TCP its address, over the ub path the dialer's node)
// and the partition; what it refuses is ErrDenied on the reader.
func TestRemoteAuthorize(t *testing.T) {
	for _, path := range []remotePath{tcpPath, ubPath()} {
		t.Run(path.name, func(t *testing.T) {
			l := newLog(t, Config{Partitions: 2, SegmentSize: 64 << 10})
			ctx := timeout(t, 10*time.Second)
			if _, err := l.Send(ctx, 0, []byte("ok")); err != nil {
				t.Fatal(err)
			}
			peers := make(chan string, 4)
			_, addr := serve(t, l, path, ServeConfig{Authorize: func(c net.Conn, p int) error {
				peers <- peerOf(c.RemoteAddr())
				if p != 0 {
					return fmt.Errorf("partition %d is not for %s", p, c.RemoteAddr())
				}
				return nil
			}})
			var got transport.Path
			d := path.dialer(t, &got)
			if _, err := d.DialReader(ctx, addr, l.Name(), 1, 0); !errors.Is(err, ErrDenied) {
				t.Fatalf("partition 1: %v, want ErrDenied", err)
			}
			r := dialReader(t, d, addr, l.Name(), 0, 0)
			if rec, err := r.Next(ctx); err != nil || string(rec.Payload) != "ok" {
				t.Fatalf("partition 0: %q %v", rec.Payload, err)
			}
			want := "127.0.0.1"
			if path.name == "ub" {
				want = "node n1"
			}
			for range 2 {
				if p := <-peers; p != want {
					t.Errorf("Authorize saw peer %q, want %q", p, want)
				}
			}
		})
	}
}

// pipeListener is a listener whose connections are net.Pipes (no socket
// buffers: a write waits for the reader), made by its dial.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial returns the client end of a new pipe whose reads take at most
// chunk bytes, each after pause: a slow link.
func (l *pipeListener) dial(chunk int, pause time.Duration) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return &slowConn{Conn: c, chunk: chunk, pause: pause}, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

type slowConn struct {
	net.Conn
	chunk int
	pause time.Duration
}

func (c *slowConn) Read(b []byte) (int, error) {
	time.Sleep(c.pause) // the link's pace, not a synchronisation
	return c.Conn.Read(b[:min(len(b), c.chunk)])
}

// TestRemoteLargeRecordSlowReader: a 2 MiB record to a reader that reads
// steadily but takes longer than WriteTimeout for all of it (16 KiB per
// 25 ms, about 3.3 s, with a 1 s WriteTimeout: slack for a loaded machine
// between pieces of 64 KiB, 100 ms each) arrives: the deadline
// is per piece written, not per record (before, the reader was dropped).
func TestRemoteLargeRecordSlowReader(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4 << 20, Segments: 2})
	ctx := timeout(t, 20*time.Second)
	big := make([]byte, 2<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if _, err := l.Send(ctx, 0, big); err != nil {
		t.Fatal(err)
	}
	ln := newPipeListener()
	s := NewServer(l, ServeConfig{WriteTimeout: time.Second})
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	defer func() {
		s.Close()
		<-served
	}()
	d := &Dialer{Window: 4 << 20, Dial: func(context.Context, string) (net.Conn, error) {
		return ln.dial(16<<10, 25*time.Millisecond)
	}}
	r, err := d.DialReader(ctx, "pipe", l.Name(), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	rec, err := r.Next(ctx)
	if err != nil || !bytes.Equal(rec.Payload, big) {
		t.Fatalf("a 2 MiB record to a slow reader: %d bytes, %v after %v", len(rec.Payload), err, time.Since(start))
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}

// replicatePair dials a control connection to a Follow on n1 and calls
// Replicate on n0 over it, returning both results: the follower's
// without closing anything the test did not ask for.
func replicatePair(t *testing.T, leader *Log, n0, n1 ub.Context, follower *Log, rc ReplicaConfig, fc FollowerConfig) (*Replica, error, *Follower, error) {
	t.Helper()
	ctx := timeout(t, 10*time.Second)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		f   *Follower
		err error
	}
	fch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			fch <- res{nil, err}
			return
		}
		f, err := Follow(ctx, follower, n1, c, fc)
		fch <- res{f, err}
	}()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r, rerr := Replicate(ctx, leader, 0, n0, c, rc)
	fr := <-fch
	t.Cleanup(func() {
		if r != nil {
			r.Close()
		}
		if fr.f != nil {
			fr.f.Close()
		}
		c.Close()
	})
	return r, rerr, fr.f, fr.err
}

// TestReplicateFailsAfterAccept: a Replicate that fails after the
// follower accepted (here a test hook fails it there) tells the follower
// why and closes the control connection: the follower stops with the
// leader's reason, rather than waiting for a leader that is not there
// (before, it waited until someone closed the connection, and then knew
// no reason).
func TestReplicateFailsAfterAccept(t *testing.T) {
	n0, n1, _ := simNodes(t)
	leader := newLog(t, Config{SegmentSize: 8 << 10})
	follower := newLog(t, Config{SegmentSize: 8 << 10})
	fl := newFaults()
	fail := func() error { return protoErr("the test fails the leader after the accept") }
	testReplicateAccepted.Store(&fail)
	defer testReplicateAccepted.Store(nil)
	r, rerr, f, ferr := replicatePair(t, leader, n0, n1, follower, ReplicaConfig{},
		FollowerConfig{DeadAfter: time.Minute, OnFault: fl.add})
	if r != nil || !errors.Is(rerr, ErrProtocol) || ferr != nil {
		t.Fatalf("Replicate %v, want ErrProtocol; Follow %v, want it accepted", rerr, ferr)
	}
	fl.wait(timeout(t, 5*time.Second), t, ErrProtocol)
	if err := f.Err(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("follower: %v, want the leader's reason", err)
	}
}

// TestReplicaFollowerFaultReachesLeader: a follower that stops on a
// fault (here ErrDiverged: someone else wrote its partition) says why on
// the control connection: the leader's replication ends at once with
// ErrReplicaDown wrapping that reason (before, the leader learnt nothing
// until DeadAfter, here a minute, and then no reason).
func TestReplicaFollowerFaultReachesLeader(t *testing.T) {
	n0, n1, _ := simNodes(t)
	leader := newLog(t, Config{SegmentSize: 8 << 10})
	follower := newLog(t, Config{SegmentSize: 8 << 10})
	fl := newFaults()
	r, rerr, f, ferr := replicatePair(t, leader, n0, n1, follower, ReplicaConfig{DeadAfter: time.Minute, OnFault: fl.add}, FollowerConfig{})
	if rerr != nil || ferr != nil {
		t.Fatal(rerr, ferr)
	}
	ctx := timeout(t, 10*time.Second)
	if _, err := follower.Send(ctx, 0, []byte("not the leader's")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Send(ctx, []byte("leader's")); err != nil {
		t.Fatal(err)
	}
	fl.wait(timeout(t, 5*time.Second), t, ErrDiverged)
	if err := r.Err(); !errors.Is(err, ErrReplicaDown) || !errors.Is(err, ErrDiverged) {
		t.Fatalf("leader: %v, want ErrReplicaDown with ErrDiverged", err)
	}
	if err := f.Err(); !errors.Is(err, ErrDiverged) {
		t.Fatalf("follower: %v", err)
	}
}

// TestReplicaGapBeyondFollowerRetention: a run of aborted records on the
// leader longer than the follower's whole retention (40 KB of aborted
// loans, the follower keeping 16 KiB) is filled, within the leader's
// retention: the records after it arrive at their offsets (before, the
// follower refused the gap as ErrProtocol).
func TestReplicaGapBeyondFollowerRetention(t *testing.T) {
	n0, n1, _ := simNodes(t)
	leader := newLog(t, Config{SegmentSize: 8 << 10, Segments: 16})
	follower := newLog(t, Config{SegmentSize: 8 << 10, Segments: 2})
	ctx := timeout(t, 10*time.Second)
	if _, err := leader.Send(ctx, 0, []byte("A")); err != nil {
		t.Fatal(err)
	}
	for range 40 {
		res, err := leader.Loan(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		res.Abort()
	}
	offB, err := leader.Send(ctx, 0, []byte("B"))
	if err != nil {
		t.Fatal(err)
	}
	r, f := replicate(t, leader, 0, n0, n1, follower, ReplicaConfig{Ack: AckFollower}, FollowerConfig{})
	if err := r.WaitAcked(ctx, offB); err != nil {
		t.Fatalf("B after a %d-byte gap: %v; follower %+v", offB, err, f.Stats())
	}
	rd := newReader(t, follower, 0, offB)
	if rec, err := rd.Next(ctx); err != nil || string(rec.Payload) != "B" || rec.Offset != offB {
		t.Fatalf("follower: %q at %d, %v; want B at %d", rec.Payload, rec.Offset, err, offB)
	}
}
