package transport

import (
	"fmt"
	"io"
	"net"
	"os"

	"github.com/ubkit-io/ubkit/shm"
)

// acceptShm takes a dialer's shared memory and makes the connection. Every
// descriptor the dialer passes is checked: a memfd of the connection's size,
// sealed against resizing, then the read end of ring a's notification pipe
// and the write end of ring b's; anything else is refused (shm.ErrBadDescriptor)
// with every descriptor received closed.
func acceptShm(uc *net.UnixConn, local Addr) (*shmConn, error) {
	seg, err := shm.ReceiveSegment(uc, &shm.ReceiveOptions{Size: connSegmentSize()})
	if err != nil {
		return nil, fmt.Errorf("transport: accept a same-node dialer: %w", err)
	}
	files, err := shm.ReceivePipes(uc, shm.PipeReadEnd, shm.PipeWriteEnd)
	if err != nil {
		seg.Close()
		return nil, fmt.Errorf("transport: accept a same-node dialer: %w", err)
	}
	closeFiles := func() {
		for _, f := range files {
			f.Close()
		}
	}
	offA, offB, offCtl, _ := ringOffsets()
	fail := func(err error) (*shmConn, error) {
		closeFiles()
		seg.Close()
		return nil, fmt.Errorf("transport: accept a same-node dialer: %w", err)
	}
	ra, err := shm.OpenSPSC(seg, offA)
	if err != nil {
		return fail(err)
	}
	rb, err := shm.OpenSPSC(seg, offB)
	if err != nil {
		return fail(err)
	}
	waitA, err := seg.Uint32At(offCtl)
	if err != nil {
		return fail(err)
	}
	waitB, err := seg.Uint32At(offCtl + 128)
	if err != nil {
		return fail(err)
	}
	cons, err := ra.Consumer(shm.Wait{})
	if err != nil {
		return fail(err)
	}
	prod, err := rb.Producer(streamWriterWait)
	if err != nil {
		cons.Close()
		return fail(err)
	}
	msgs, err := attachMessages(seg, offCtl+256, false)
	if err != nil {
		prod.Close()
		cons.Close()
		return fail(err)
	}
	closeAll := func(err error) (*shmConn, error) {
		msgs.close()
		prod.Close()
		cons.Close()
		return fail(err)
	}
	c, err := newConn(seg, prod, cons, waitA, waitB, files[0], files[1], local, Addr{Node: local.Node, Service: local.Service + "-peer"})
	if err != nil {
		return closeAll(err)
	}
	c.samePID = samePID(uc)
	// Tell the dialer its connection is accepted.
	if _, err := uc.Write([]byte{shmAccepted}); err != nil {
		return closeAll(err)
	}
	c.msgs = msgs
	return c, nil
}

// shmAccepted is the listener's answer to a dialer whose segment and pipes
// it took.
const shmAccepted = 1

// connSegmentSize is the size of a connection's segment: its stream rings
// and their control lines, then its messages' rings and pool.
func connSegmentSize() int {
	_, _, offCtl, _ := ringOffsets()
	_, _, _, size := messageLayout(offCtl + 256)
	return size
}

// newConnSegment makes a connection's sealed segment with its rings and
// message pool, for dialShm.
func newConnSegment() (seg *shm.Segment, ra, rb *shm.SPSC, err error) {
	offA, offB, offCtl, _ := ringOffsets()
	seg, err = shm.CreateMemfd("transport", connSegmentSize(), nil)
	if err != nil {
		return nil, nil, nil, err
	}
	if ra, err = shm.CreateSPSC(seg, offA, ringCapacity); err == nil {
		if rb, err = shm.CreateSPSC(seg, offB, ringCapacity); err == nil {
			if err = createMessages(seg, offCtl+256); err == nil {
				err = seg.Seal()
			}
		}
	}
	if err != nil {
		seg.Close()
		return nil, nil, nil, err
	}
	return seg, ra, rb, nil
}

// dialShm makes the connection's rings in a sealed anonymous segment and
// hands it to the listener.
func dialShm(uc *net.UnixConn, a Addr) (*shmConn, error) {
	seg, ra, rb, err := newConnSegment()
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", a, err)
	}
	fail := func(err error) (*shmConn, error) {
		seg.Close()
		return nil, fmt.Errorf("transport: dial %s: %w", a, err)
	}
	_, _, offCtl, _ := ringOffsets()
	prod, err := ra.Producer(streamWriterWait)
	if err != nil {
		return fail(err)
	}
	cons, err := rb.Consumer(shm.Wait{})
	if err != nil {
		prod.Close()
		return fail(err)
	}
	closeEnds := func(err error) (*shmConn, error) {
		prod.Close()
		cons.Close()
		return fail(err)
	}
	// Notification pipes: a for ring a (we write, the listener reads), b
	// for ring b (the listener writes, we read).
	aR, aW, err := os.Pipe()
	if err != nil {
		return closeEnds(err)
	}
	bR, bW, err := os.Pipe()
	if err != nil {
		aR.Close()
		aW.Close()
		return closeEnds(err)
	}
	closePipes := func(err error) (*shmConn, error) {
		for _, f := range []*os.File{aR, aW, bR, bW} {
			f.Close()
		}
		return closeEnds(err)
	}
	waitA, _ := seg.Uint32At(offCtl)
	waitB, _ := seg.Uint32At(offCtl + 128)
	if err := shm.SendSegment(uc, seg); err != nil {
		return closePipes(err)
	}
	if err := shm.SendPipes(uc, aR, bW); err != nil {
		return closePipes(err)
	}
	// A plain read: descriptors a listener might send along with its answer
	// are dropped by the kernel, never received.
	var ok [1]byte
	if _, err := io.ReadFull(uc, ok[:]); err != nil {
		return closePipes(fmt.Errorf("not accepted by the listener: %w", err))
	}
	if ok[0] != shmAccepted {
		return closePipes(fmt.Errorf("not accepted by the listener: it answered %#x", ok[0]))
	}
	// The listener holds its ends now.
	aR.Close()
	bW.Close()
	msgs, err := attachMessages(seg, offCtl+256, true)
	if err != nil {
		bR.Close()
		aW.Close()
		return closeEnds(err)
	}
	c, err := newConn(seg, prod, cons, waitB, waitA, bR, aW, Addr{Node: a.Node, Service: a.Service + "-peer"}, a)
	if err != nil {
		msgs.close()
		bR.Close()
		aW.Close()
		return closeEnds(err)
	}
	c.samePID = samePID(uc)
	c.msgs = msgs
	return c, nil
}

// samePID says whether the process at the other end of uc is this one.
func samePID(uc *net.UnixConn) bool {
	cred, err := shm.PeerCredentials(uc)
	return err == nil && cred.PID == os.Getpid()
}
