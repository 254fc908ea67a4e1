package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

func TestMessages(t *testing.T) {
	c1, c2, stop := pipe(t)
	defer stop()
	a, b := c1.(*Conn), c2.(*Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Many small messages, in order, each filled in place.
	for i := range 200 {
		m, err := a.Loan(100 + i)
		if err != nil {
			t.Fatal(err)
		}
		for j := range m.Bytes() {
			m.Bytes()[j] = byte(i + j)
		}
		if err := a.Send(m); err != nil {
			t.Fatal(err)
		}
		got, err := b.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Bytes()) != 100+i || got.Bytes()[0] != byte(i) || got.Bytes()[len(got.Bytes())-1] != byte(i+99+i) {
			t.Fatalf("message %d: %d bytes", i, len(got.Bytes()))
		}
		if err := got.Release(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Send(&Msg{}); err == nil {
		t.Error("sent a message that was not loaned")
	}

	// A 1 GiB message moves without a copy: the receiver sees the very
	// bytes the sender wrote (only the touched pages are ever committed).
	big, err := b.Loan(1 << 30)
	if err != nil {
		t.Fatal(err)
	}
	bb := big.Bytes()
	copy(bb, "head")
	copy(bb[len(bb)-4:], "tail")
	if err := b.Send(big); err != nil {
		t.Fatal(err)
	}
	got, err := a.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gb := got.Bytes()
	if len(gb) != 1<<30 || !bytes.Equal(gb[:4], []byte("head")) || !bytes.Equal(gb[len(gb)-4:], []byte("tail")) {
		t.Fatalf("1 GiB message: %d bytes", len(gb))
	}
	// The same memory, not a copy: a byte the sender changes now (which a
	// real sender must not do after Send) is what the receiver sees.
	bb[1<<29] = 42
	if gb[1<<29] != 42 {
		t.Error("the 1 GiB message was copied")
	}
	got.Release()
	if _, err := a.Loan(2 << 30); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("2 GiB loan: %v", err)
	}

	// Recv honours its context and Close.
	short, cancelShort := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancelShort()
	if _, err := a.Recv(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Recv on an empty queue: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := a.Recv(ctx); done <- err }()
	testenv.WaitParked(t, 1, "", "transport.(*Conn).Recv(")
	a.Close()
	if err := <-done; err == nil {
		t.Error("Recv returned no error after Close")
	}
}

// TestHostileMessageRecords: records a buggy or hostile peer could put on
// the message ring (bad handles, lengths past the buffer) give errors, not
// panics, and the connection goes on working.
func TestHostileMessageRecords(t *testing.T) {
	c1, c2, stop := pipe(t)
	defer stop()
	a, b := c1.(*Conn), c2.(*Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	good, err := a.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := good.buf.Handle().MarshalBinary()
	long := append(append([]byte(nil), h...), 0, 0, 0, 0, 0, 0, 0, 1) // 2^56 bytes
	for _, rec := range [][]byte{
		make([]byte, msgRecord), // zero handle
		[]byte("short"),         // not a record
		append(make([]byte, shm.HandleSize), 1, 0, 0, 0, 0, 0, 0, 0), // unknown segment
		long,
	} {
		if err := a.c.(*shmConn).msgs.prod.Send(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if m, err := b.Recv(ctx); err == nil {
			m.Release()
			t.Errorf("record %x accepted", rec)
		}
	}
	good.Release()
	m, err := a.Loan(10)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes(), "still fine")
	if err := a.Send(m); err != nil {
		t.Fatal(err)
	}
	got, err := b.Recv(ctx)
	if err != nil || string(got.Bytes()) != "still fine" {
		t.Fatalf("after the hostile records: %q %v", got.Bytes(), err)
	}
	got.Release()
}

// TestMessageOutlivesClose: a message held when its connection closes stays
// readable until released (the memory is unmapped after the last Release).
func TestMessageOutlivesClose(t *testing.T) {
	c1, c2, stop := pipe(t)
	defer stop()
	a, b := c1.(*Conn), c2.(*Conn)
	m, err := a.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	copy(m.Bytes(), "kept")
	if err := a.Send(m); err != nil {
		t.Fatal(err)
	}
	got, err := b.Recv(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.Loan(64)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if string(got.Bytes()[:4]) != "kept" {
		t.Fatalf("after Close: %q", got.Bytes()[:4])
	}
	held.Bytes()[0] = 1
	if err := got.Release(); err != nil {
		t.Fatal(err)
	}
	if err := held.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Loan(1); err == nil {
		t.Error("loaned from a closed connection")
	}
}

// messageBuffers is how many buffers a connection's message pool holds.
func messageBuffers() int {
	n := 0
	for _, c := range messagePool.Classes {
		n += c.Count
	}
	return n
}

// TestLoanWaitsForReleases: a sender loaning in a loop against a receiver
// that keeps every message until it holds all the pool's buffers, then
// releases them all at once, never sees ErrPoolExhausted: each Loan waits
// for the release.
func TestLoanWaitsForReleases(t *testing.T) {
	c1, c2, stop := pipe(t)
	defer stop()
	a, b := c1.(*Conn), c2.(*Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	all := messageBuffers()
	total := 20 * all
	received := make(chan error, 1)
	go func() {
		var held []*Msg
		for i := range total {
			m, err := b.Recv(ctx)
			if err != nil {
				received <- err
				return
			}
			if got := m.Bytes()[0]; got != byte(i) {
				received <- fmt.Errorf("message %d reads %d", i, got)
				return
			}
			if held = append(held, m); len(held) == all {
				for _, m := range held {
					m.Release()
				}
				held = held[:0]
			}
		}
		received <- nil
	}()
	for i := range total {
		m, err := a.Loan(1000)
		if err != nil {
			t.Fatalf("loan %d (the receiver holds up to %d): %v", i, all, err)
		}
		m.Bytes()[0] = byte(i)
		if err := a.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-received; err != nil {
		t.Fatal(err)
	}
}

// TestLoanOnExhaustedPool: with every buffer held, TryLoan fails at once
// with ErrPoolExhausted, and a waiting loan ends with its context, with
// the write deadline and with Close, each with its own error.
func TestLoanOnExhaustedPool(t *testing.T) {
	c1, c2, stop := pipe(t)
	defer stop()
	a := c1.(*Conn)
	_ = c2
	var held []*Msg
	defer func() {
		for _, m := range held {
			m.Release()
		}
	}()
	for range messageBuffers() {
		m, err := a.TryLoan(1)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
	}
	if _, err := a.TryLoan(1); !errors.Is(err, ErrPoolExhausted) {
		t.Fatalf("TryLoan of an exhausted pool: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := a.LoanContext(ctx, 1)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("LoanContext, cancelled: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if _, err := a.LoanContext(short, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("LoanContext past its context's deadline: %v", err)
	}

	a.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
	_, err := a.Loan(1)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("Loan past the write deadline: %v, want a timeout", err)
	}
	a.SetWriteDeadline(time.Time{})
	// A deadline moved into the past wakes a loan that waits.
	go func() {
		_, err := a.Loan(1)
		done <- err
	}()
	a.SetWriteDeadline(time.Now().Add(-time.Second))
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Loan when the deadline moved into the past: %v", err)
	}
	a.SetWriteDeadline(time.Time{})

	go func() {
		_, err := a.Loan(1)
		done <- err
	}()
	a.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Errorf("Loan across Close: %v", err)
	}
}
