//go:build linux

package shm_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

func Example() {
	// One process creates a segment and a ring in it...
	name := "example-" + strconv.Itoa(os.Getpid())
	seg, err := shm.CreateSegment(name, shm.SPSCSize(4096), nil)
	if err != nil {
		panic(err)
	}
	defer seg.Close()
	ring, _ := shm.CreateSPSC(seg, 0, 4096)
	producer, _ := ring.Producer(shm.Wait{})

	// ...another opens them by name (here the same process, for brevity).
	peer, _ := shm.OpenSegment(name)
	defer peer.Close()
	peerRing, _ := shm.OpenSPSC(peer, 0)
	consumer, _ := peerRing.Consumer(shm.Wait{})

	ctx := context.Background()
	producer.Send(ctx, []byte("hello"))
	producer.Send(ctx, []byte("world"))
	producer.Close()
	for {
		rec, err := consumer.NextWait(ctx)
		if err != nil {
			fmt.Println(err)
			break
		}
		fmt.Println(string(rec))
	}
	// Output:
	// hello
	// world
	// shm: closed
}

func ExampleProducer_Claim() {
	seg, _ := shm.CreateMemfd("batch", shm.SPSCSize(1024), nil)
	defer seg.Close()
	ring, _ := shm.CreateSPSC(seg, 0, 1024)
	p, _ := ring.Producer(shm.Wait{})
	c, _ := ring.Consumer(shm.Wait{})

	// Claim several records, fill them in place, publish them with one store.
	for i := range 3 {
		rec, _ := p.Claim(8)
		copy(rec, "record "+strconv.Itoa(i))
	}
	p.Commit()

	for {
		rec, err := c.Next()
		if err == shm.ErrRingEmpty {
			break
		}
		fmt.Println(string(rec))
	}
	c.Release() // give the space back with one store
	// Output:
	// record 0
	// record 1
	// record 2
}

func ExamplePool() {
	cfg := shm.PoolConfig{Classes: []shm.PoolClass{{Size: 4096, Count: 8}}}
	size, _ := shm.PoolSize(cfg)
	seg, _ := shm.CreateMemfd("pool", size, nil)
	defer seg.Close()
	pool, _ := shm.CreatePool(seg, 0, cfg)

	buf, _ := pool.Loan(100)
	copy(buf.Bytes(), "zero copy")
	wire, _ := buf.Handle().MarshalBinary() // 16 bytes to send to a peer

	// The peer decodes the handle and adopts the buffer: no payload copied.
	var h shm.Handle
	h.UnmarshalBinary(wire)
	got, _ := pool.Adopt(h)
	fmt.Println(string(got.Bytes()[:9]))
	got.Return()

	// The stale handle is refused once the buffer went back.
	_, err := pool.Resolve(h)
	fmt.Println(err != nil)
	// Output:
	// zero copy
	// true
}

func ExamplePool_LoanWait() {
	cfg := shm.PoolConfig{Classes: []shm.PoolClass{{Size: 4096, Count: 1}}}
	size, _ := shm.PoolSize(cfg)
	seg, _ := shm.CreateMemfd("pool-wait", size, nil)
	defer seg.Close()
	pool, _ := shm.CreatePool(seg, 0, cfg)

	held, _ := pool.Loan(100)
	_, err := pool.Loan(100)
	fmt.Println(errors.Is(err, shm.ErrPoolExhausted))

	// A loan that waits gets the buffer once its holder returns it (here
	// another goroutine; it may as well be another process).
	go held.Return()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	buf, err := pool.LoanWait(ctx, 100, shm.Wait{})
	fmt.Println(len(buf.Bytes()), err)
	buf.Return()
	// Output:
	// true
	// 4096 <nil>
}

func ExampleMPMC() {
	seg, _ := shm.CreateMemfd("mpmc", shm.MPMCSize(8, 64), nil)
	defer seg.Close()
	q, _ := shm.CreateMPMC(seg, 0, 8, 64, shm.Wait{})
	defer q.Close()
	q.TryPush([]byte("job 1"))
	q.TryPush([]byte("job 2"))
	buf := make([]byte, q.SlotSize())
	for {
		n, err := q.TryPop(buf)
		if err != nil {
			break
		}
		fmt.Println(string(buf[:n]))
	}
	// Output:
	// job 1
	// job 2
}

func ExampleSweep() {
	// Remove segments left behind by processes that died without Close.
	removed, err := shm.Sweep()
	if err != nil {
		fmt.Println(err)
	}
	_ = removed
}

func ExampleSendSegment() {
	// A connected pair of unix sockets; normally each end is in another
	// process (a listener and a dialer).
	fds, _ := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	fa, fb := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	a, _ := net.FileConn(fa) // FileConn duplicates the descriptor
	b, _ := net.FileConn(fb)
	fa.Close()
	fb.Close()
	defer a.Close()
	defer b.Close()

	seg, _ := shm.CreateMemfd("handoff", 4096, nil)
	defer seg.Close()
	copy(seg.Data(), "shared by descriptor")
	seg.Seal() // receivers refuse unsealed segments unless told otherwise
	if err := shm.SendSegment(a.(*net.UnixConn), seg); err != nil {
		panic(err)
	}

	got, err := shm.ReceiveSegment(b.(*net.UnixConn), nil)
	if err != nil {
		panic(err)
	}
	defer got.Close()
	fmt.Println(string(got.Data()[:20]))
	// Output:
	// shared by descriptor
}

func ExampleSendPipes() {
	fds, _ := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	fa, fb := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	a, _ := net.FileConn(fa)
	b, _ := net.FileConn(fb)
	fa.Close()
	fb.Close()
	defer a.Close()
	defer b.Close()

	r, w, _ := os.Pipe()
	defer w.Close()
	if err := shm.SendPipes(a.(*net.UnixConn), r); err != nil {
		panic(err)
	}
	r.Close() // the receiver holds it now
	got, err := shm.ReceivePipes(b.(*net.UnixConn), shm.PipeReadEnd)
	if err != nil {
		panic(err)
	}
	defer got[0].Close()
	w.Write([]byte("wake"))
	buf := make([]byte, 4)
	n, _ := got[0].Read(buf)
	fmt.Println(string(buf[:n]))

	// A write end where a read end belongs is refused.
	shm.SendPipes(a.(*net.UnixConn), w)
	_, err = shm.ReceivePipes(b.(*net.UnixConn), shm.PipeReadEnd)
	fmt.Println(errors.Is(err, shm.ErrBadDescriptor))
	// Output:
	// wake
	// true
}
