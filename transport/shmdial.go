package transport

import (
	"fmt"
	"net"
	"os"

	"github.com/ubkit-io/ubkit/shm"
)

// acceptShm takes a dialer's shared memory and makes the connection.
func acceptShm(uc *net.UnixConn, local Addr) (*shmConn, error) {
	seg, err := shm.ReceiveSegment(uc, nil)
	if err != nil {
		return nil, err
	}
	// Then the read end of ring a's notification pipe and the write end of
	// ring b's.
	files, err := receiveFiles(uc, 2)
	if err != nil {
		seg.Close()
		return nil, err
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
		return nil, err
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
	// Tell the dialer its connection is accepted.
	if _, err := uc.Write([]byte{1}); err != nil {
		msgs.close()
		prod.Close()
		cons.Close()
		return fail(err)
	}
	c := newConn(seg, prod, cons, waitA, waitB, files[0], files[1], local, Addr{Node: local.Node, Service: local.Service + "-peer"})
	c.msgs = msgs
	return c, nil
}

// dialShm makes the connection's rings in a sealed anonymous segment and
// hands it to the listener.
func dialShm(uc *net.UnixConn, a Addr) (*shmConn, error) {
	offA, offB, offCtl, _ := ringOffsets()
	_, _, _, size := messageLayout(offCtl + 256)
	seg, err := shm.CreateMemfd("transport", size, nil)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*shmConn, error) {
		seg.Close()
		return nil, fmt.Errorf("transport: dial %s: %w", a, err)
	}
	ra, err := shm.CreateSPSC(seg, offA, ringCapacity)
	if err != nil {
		return fail(err)
	}
	rb, err := shm.CreateSPSC(seg, offB, ringCapacity)
	if err != nil {
		return fail(err)
	}
	if err := createMessages(seg, offCtl+256); err != nil {
		return fail(err)
	}
	if err := seg.Seal(); err != nil {
		return fail(err)
	}
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
	if err := sendFiles(uc, aR, bW); err != nil {
		return closePipes(err)
	}
	var ok [1]byte
	if _, err := uc.Read(ok[:]); err != nil {
		return closePipes(fmt.Errorf("not accepted: %w", err))
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
	c := newConn(seg, prod, cons, waitB, waitA, bR, aW, Addr{Node: a.Node, Service: a.Service + "-peer"}, a)
	c.msgs = msgs
	return c, nil
}
