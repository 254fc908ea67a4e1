package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
)

// MPMC ring layout, at a cacheLine-aligned offset of a segment:
//
//	control line   0: magic u64, version u32, slots u32, slotSize u32,
//	                  deaths u32
//	enqueue line 128: enqueue position u64, notEmptySeq u32, popWaiters u32,
//	                  bellArmed u32, bellWritten u32
//	dequeue line 256: dequeue position u64, notFullSeq u32, pushWaiters u32
//	participants 384: mpmcParticipants process words
//	slots        640: slots x (sequence u64, length u32, pad u32, payload)
//
// The algorithm is Dmitry Vyukov's bounded MPMC queue: each slot's sequence
// says whose turn it is, so producers and consumers only contend on their own
// position word. Every sequence value read from shared memory is checked
// against the few values a correct peer can leave there.
const (
	mpmcMagic   = 0x3143_4d50_4d4b_4255 // "UBKMPMC1"
	mpmcVersion = 1

	mpmcOffMagic    = 0
	mpmcOffVersion  = 8
	mpmcOffSlots    = 12
	mpmcOffSlotSize = 16
	mpmcOffDeaths   = 20 // participants found dead, by anyone

	mpmcOffEnq         = cacheLine
	mpmcOffNotEmptySeq = cacheLine + 8
	mpmcOffPopWaiters  = cacheLine + 12
	mpmcOffBellArmed   = cacheLine + 16 // consumers asleep on the bell (zero in rings made before bells)
	mpmcOffBellWritten = cacheLine + 20 // a producer wrote into the bell since the consumer emptied it
	mpmcOffDeq         = 2 * cacheLine
	mpmcOffNotFullSeq  = 2*cacheLine + 8
	mpmcOffPushWaiters = 2*cacheLine + 12
	mpmcOffParts       = 3 * cacheLine
	mpmcParticipants   = 32
	mpmcHeaderSize     = 5 * cacheLine
	mpmcSlotHeader     = 16
)

// MPMCSize returns the number of segment bytes an MPMC ring of slots slots of
// slotSize payload bytes occupies.
func MPMCSize(slots, slotSize int) int {
	return mpmcHeaderSize + slots*(mpmcSlotHeader+align8(slotSize))
}

// MPMC is a bounded multi-producer multi-consumer ring of fixed-size slots in
// shared memory. Any number of goroutines in up to 32 attached processes may
// push and pop concurrently. Payloads are copied in and out.
type MPMC struct {
	mem      []byte
	slots    uint64
	mask     uint64
	slotSize int
	stride   int

	enq, deq                *atomic.Uint64
	notEmptySeq, popWaiters *atomic.Uint32
	notFullSeq, pushWaiters *atomic.Uint32
	wait                    Wait
	me                      int // our participant index

	stalled atomic.Uint64 // 1 + position found claimed-but-unpublished at the last check

	bell *bell
}

// CreateMPMC initializes a ring of slots slots (a power of two) of slotSize
// payload bytes at offset off of seg's data area, and attaches to it.
func CreateMPMC(seg *Segment, off, slots, slotSize int, w Wait) (*MPMC, error) {
	if slots < 2 || slots&(slots-1) != 0 || slots > 1<<30 {
		return nil, errorf("MPMC slots %d must be a power of two between 2 and 2^30", slots)
	}
	if slotSize < 1 || slotSize > 1<<30 {
		return nil, errorf("MPMC slot size %d must be between 1 and 2^30", slotSize)
	}
	mem, err := region(seg, off, MPMCSize(slots, slotSize))
	if err != nil {
		return nil, err
	}
	clear(mem[:mpmcHeaderSize])
	binary.LittleEndian.PutUint32(mem[mpmcOffVersion:], mpmcVersion)
	binary.LittleEndian.PutUint32(mem[mpmcOffSlots:], uint32(slots))
	binary.LittleEndian.PutUint32(mem[mpmcOffSlotSize:], uint32(slotSize))
	r := attachMPMC(mem, slots, slotSize, w)
	r.bell = newBell(bellPath(seg, off), atomicU32(mem, mpmcOffBellArmed), atomicU32(mem, mpmcOffBellWritten))
	for i := range slots {
		r.seq(uint64(i)).Store(uint64(i))
	}
	atomicU64(mem, mpmcOffMagic).Store(mpmcMagic)
	return r, r.join()
}

// OpenMPMC attaches to a ring another process created at offset off of seg.
func OpenMPMC(seg *Segment, off int, w Wait) (*MPMC, error) {
	hdr, err := region(seg, off, mpmcHeaderSize)
	if err != nil {
		return nil, err
	}
	if atomicU64(hdr, mpmcOffMagic).Load() != mpmcMagic {
		return nil, corruptf("no MPMC ring at offset %d (bad magic)", off)
	}
	if v := binary.LittleEndian.Uint32(hdr[mpmcOffVersion:]); v != mpmcVersion {
		return nil, errorf("MPMC ring version %d, this ubkit speaks %d", v, mpmcVersion)
	}
	slots := int(binary.LittleEndian.Uint32(hdr[mpmcOffSlots:]))
	slotSize := int(binary.LittleEndian.Uint32(hdr[mpmcOffSlotSize:]))
	if slots < 2 || slots&(slots-1) != 0 || slots > 1<<30 || slotSize < 1 || slotSize > 1<<30 {
		return nil, corruptf("MPMC ring of %d slots of %d bytes", slots, slotSize)
	}
	mem, err := region(seg, off, MPMCSize(slots, slotSize))
	if err != nil {
		return nil, corruptf("MPMC ring of %d slots of %d bytes: %v", slots, slotSize, err)
	}
	r := attachMPMC(mem, slots, slotSize, w)
	r.bell = newBell(bellPath(seg, off), atomicU32(mem, mpmcOffBellArmed), atomicU32(mem, mpmcOffBellWritten))
	return r, r.join()
}

func attachMPMC(mem []byte, slots, slotSize int, w Wait) *MPMC {
	return &MPMC{
		mem: mem, slots: uint64(slots), mask: uint64(slots - 1),
		slotSize: slotSize, stride: mpmcSlotHeader + align8(slotSize),
		enq:         atomicU64(mem, mpmcOffEnq),
		deq:         atomicU64(mem, mpmcOffDeq),
		notEmptySeq: atomicU32(mem, mpmcOffNotEmptySeq),
		popWaiters:  atomicU32(mem, mpmcOffPopWaiters),
		notFullSeq:  atomicU32(mem, mpmcOffNotFullSeq),
		pushWaiters: atomicU32(mem, mpmcOffPushWaiters),
		wait:        w,
		me:          -1,
	}
}

func (r *MPMC) part(i int) *atomic.Uint64 { return atomicU64(r.mem, mpmcOffParts+8*i) }

// join registers this process in the participant table, taking a free entry
// or one of a dead process.
func (r *MPMC) join() error {
	me := Self().word()
	for i := range mpmcParticipants {
		w := r.part(i).Load()
		if w == me {
			r.me = i
			return nil
		}
	}
	for i := range mpmcParticipants {
		w := r.part(i).Load()
		if (w == 0 || !aliveWord(w)) && r.part(i).CompareAndSwap(w, me) {
			r.me = i
			return nil
		}
	}
	return errorf("MPMC ring already has %d live participants", mpmcParticipants)
}

func (r *MPMC) slot(pos uint64) []byte {
	off := mpmcHeaderSize + int(pos&r.mask)*r.stride
	return r.mem[off : off+r.stride]
}

func (r *MPMC) seq(pos uint64) *atomic.Uint64 { return atomicU64(r.slot(pos), 0) }

// SlotSize returns the largest payload a slot holds.
func (r *MPMC) SlotSize() int { return r.slotSize }

// TryPush copies payload into a free slot, or returns ErrRingFull.
func (r *MPMC) TryPush(payload []byte) error {
	if len(payload) > r.slotSize {
		return fmt.Errorf("%w: %d bytes, slots hold %d", ErrTooLarge, len(payload), r.slotSize)
	}
	pos := r.enq.Load()
	for {
		s := r.slot(pos)
		seq := atomicU64(s, 0).Load()
		switch diff := int64(seq - pos); {
		case diff == 0:
			if !r.enq.CompareAndSwap(pos, pos+1) {
				pos = r.enq.Load()
				continue
			}
			binary.LittleEndian.PutUint32(s[8:], uint32(len(payload)))
			copy(s[mpmcSlotHeader:], payload)
			atomicU64(s, 0).Store(pos + 1)
			wake(r.notEmptySeq, r.popWaiters, nil, false)
			r.bell.ring()
			return nil
		case diff == -int64(r.slots) || diff == 1-int64(r.slots):
			// The slot still holds (or is being given) the previous lap's
			// record: the ring is full, unless another producer moved on.
			if np := r.enq.Load(); np != pos {
				pos = np
				continue
			}
			return ErrRingFull
		case diff > 0:
			np := r.enq.Load()
			if np == pos {
				return corruptf("MPMC slot sequence %d ahead of enqueue position %d", seq, pos)
			}
			pos = np
		default:
			return corruptf("MPMC slot sequence %d impossible at enqueue position %d", seq, pos)
		}
	}
}

// TryPop copies the oldest record into dst, which must hold SlotSize bytes,
// and returns its length, or returns ErrRingEmpty.
func (r *MPMC) TryPop(dst []byte) (int, error) {
	if len(dst) < r.slotSize {
		return 0, errorf("pop buffer of %d bytes, slots hold %d", len(dst), r.slotSize)
	}
	pos := r.deq.Load()
	for {
		s := r.slot(pos)
		seq := atomicU64(s, 0).Load()
		switch diff := int64(seq - (pos + 1)); {
		case diff == 0:
			if !r.deq.CompareAndSwap(pos, pos+1) {
				pos = r.deq.Load()
				continue
			}
			n := int(binary.LittleEndian.Uint32(s[8:]))
			var err error
			if n > r.slotSize {
				err = corruptf("MPMC record of %d bytes in a %d-byte slot", n, r.slotSize)
				n = 0
			}
			copy(dst[:n], s[mpmcSlotHeader:])
			atomicU64(s, 0).Store(pos + r.slots)
			wake(r.notFullSeq, r.pushWaiters, nil, false)
			return n, err
		case diff == -1 || diff == -int64(r.slots):
			// Free for this lap, claimed but not yet published, or still
			// being emptied by a slow consumer of the previous lap.
			if np := r.deq.Load(); np != pos {
				pos = np
				continue
			}
			return 0, ErrRingEmpty
		case diff > 0:
			np := r.deq.Load()
			if np == pos {
				return 0, corruptf("MPMC slot sequence %d ahead of dequeue position %d", seq, pos)
			}
			pos = np
		default:
			return 0, corruptf("MPMC slot sequence %d impossible at dequeue position %d", seq, pos)
		}
	}
}

// peerCheck fails when every other process that attached has exited, or
// when a slot stays claimed-but-unpublished across two checks after a
// participant died (a producer died mid-push; the ring cannot move past the
// slot). Dead participants' entries are cleared as they are found.
func (r *MPMC) peerCheck() error {
	me := Self().word()
	live := 0
	for i := range mpmcParticipants {
		w := r.part(i).Load()
		switch {
		case w == 0 || w == me:
		case aliveWord(w):
			live++
		default:
			if r.part(i).CompareAndSwap(w, 0) {
				atomicU32(r.mem, mpmcOffDeaths).Add(1)
			}
		}
	}
	if atomicU32(r.mem, mpmcOffDeaths).Load() != 0 {
		if live == 0 {
			return fmt.Errorf("%w: every other process attached to the ring exited", ErrPeerDead)
		}
		pos := r.deq.Load()
		if r.enq.Load() > pos && r.seq(pos).Load() == pos {
			if r.stalled.Swap(pos+1) == pos+1 {
				return fmt.Errorf("%w: a producer died before publishing slot %d", ErrPeerDead, pos)
			}
			return nil
		}
	}
	r.stalled.Store(0)
	return nil
}

// Push is TryPush that waits, with the ring's wait strategy, while the ring
// is full.
func (r *MPMC) Push(ctx context.Context, payload []byte) error {
	err := r.TryPush(payload)
	if err != ErrRingFull {
		return err
	}
	return r.wait.wait(ctx, waiter{
		ready: func() (bool, error) {
			err := r.TryPush(payload)
			if err == ErrRingFull {
				return false, nil
			}
			return true, err
		},
		seq: r.notFullSeq, waiters: r.pushWaiters, peer: r.peerCheck,
	})
}

// Pop is TryPop that waits, with the ring's wait strategy, while the ring is
// empty.
func (r *MPMC) Pop(ctx context.Context, dst []byte) (int, error) {
	n, err := r.TryPop(dst)
	if err != ErrRingEmpty {
		return n, err
	}
	err = r.wait.wait(ctx, waiter{
		ready: func() (bool, error) {
			n, err = r.TryPop(dst)
			if err == ErrRingEmpty {
				return false, nil
			}
			return true, err
		},
		seq: r.notEmptySeq, waiters: r.popWaiters, peer: r.peerCheck,
	})
	return n, err
}

// Kick wakes the waits in WaitNotEmptyOr as a push would, pushing
// nothing: each looks at its stop condition again.
func (r *MPMC) Kick() {
	wake(r.notEmptySeq, r.popWaiters, nil, true)
	r.bell.ring()
}

// Close removes this process from the ring's participants. Other processes
// keep using the ring.
func (r *MPMC) Close() error {
	r.bell.close()
	if r.me >= 0 {
		r.part(r.me).CompareAndSwap(Self().word(), 0)
		r.me = -1
	}
	return nil
}

// WaitNotEmpty waits, with the ring's wait strategy (a producer's push
// wakes it), until a record may be popped, ctx ends or a participant is
// found dead. It pops nothing: several rings can be watched in turn.
func (r *MPMC) WaitNotEmpty(ctx context.Context) error { return r.WaitNotEmptyOr(ctx, nil) }

// WaitNotEmptyOr is WaitNotEmpty that also returns, with nil, once stop
// reports true: for a consumer that waits on something else too, which
// makes stop true and then calls Kick. stop may be nil.
func (r *MPMC) WaitNotEmptyOr(ctx context.Context, stop func() bool) error {
	ready := func() (bool, error) {
		pos := r.deq.Load()
		return r.seq(pos).Load() == pos+1 || (stop != nil && stop()), nil
	}
	if ok, _ := ready(); ok {
		return nil
	}
	if r.bell != nil && r.bell.rd != nil {
		// Sleep on the bell, no spin (callers that want one spin first),
		// checking the other participants as the futex wait does.
		isReady := func() bool { ok, _ := ready(); return ok }
		for last := time.Now(); ; {
			if !r.bell.sleep(ctx, isReady, livenessInterval) {
				break // another goroutine sleeps on the bell: use the futex
			}
			if isReady() {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			now := time.Now()
			if dl, ok := ctx.Deadline(); ok && !dl.After(now) {
				return context.DeadlineExceeded
			}
			if now.Sub(last) >= livenessInterval {
				last = now
				if err := r.peerCheck(); err != nil {
					if isReady() {
						return nil
					}
					return err
				}
			}
		}
	}
	return r.wait.wait(ctx, waiter{ready: ready, seq: r.notEmptySeq, waiters: r.popWaiters, peer: r.peerCheck})
}
