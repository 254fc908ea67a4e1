package shm

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"
)

// A SeqLock guards a record in shared memory that processes read without a
// lock and write under one, and survives a writer that dies at any
// instruction. It is SeqLockSize bytes of a segment, all zero when free:
//
//	 0: owner     u64  the holder's process word (Process.Word), 0 when free
//	 8: sequence  u64  even, and odd while a write is open
//	16: wake      u32  futex word: bumped by EndWrite and Unlock when someone sleeps
//	20: sleepers  u32  goroutines asleep on wake (low 16 bits) and a generation
//	24: fruitless u32  the sleepers word of a wake-up that woke nobody (dead sleepers)
//	28: pad       u32
//
// Readers call Begin, read the record, and keep what they read only if
// Validate then accepts Begin's sequence; otherwise they read again. They
// must read the record's words atomically (or copy them out) and bounds-check
// anything they follow from it before Validate says it is whole, since a
// write may be under way meanwhile. Writers call Lock, BeginWrite, change the
// record, EndWrite and Unlock; Lock alone excludes other writers without
// making readers retry.
//
// The lock is robust. A holder that dies leaves its process word in owner,
// and the next Lock takes the lock over (it looks at the holder's
// liveness after its first microsecond of waiting, when its spin ends, and
// every 20 ms) and returns an error wrapping ErrOwnerDied: the
// caller then holds the lock with the write open, repairs the record, and
// calls EndWrite and Unlock. A sequence left odd with nobody holding the
// lock (which no death explains: the memory was overwritten) is handed to
// the next Lock the same way, with ErrCorrupt as well. Begin, which holds
// nothing, reports both with ErrOwnerDied, for its caller to Lock and repair.
//
// Every wait climbs the Backoff ladder (letting this process's other
// goroutines run at each checkpoint), then sleeps on the wake word's futex
// for at most 20 ms at a time, looking at the holder's liveness when its
// spin ends and between sleeps, and ends with ErrHeld once the caller's
// patience has passed with a live holder. No wait hangs on a dead or
// stopped process.
//
// A process word names a process, not a goroutine: a lock this process
// holds is held by all its goroutines, and Lock and Begin from another
// goroutine of the holder's process wait as for another process. A
// goroutine must not Lock or Begin a record whose write it holds open.
//
// The zero SeqLock is not usable; get one from SeqLockAt or SeqTable.At.
// Its methods are safe for concurrent use by goroutines and processes.
type SeqLock struct{ w *seqLockWords }

// seqLockWords is a SeqLock's memory (see SeqLock).
type seqLockWords struct {
	owner     atomic.Uint64
	seq       atomic.Uint64
	wake      atomic.Uint32
	sleepers  atomic.Uint32
	fruitless atomic.Uint32
	_         uint32
}

// SeqLockSize is the bytes a SeqLock takes in a segment.
const SeqLockSize = 32

// The layout above, to the byte.
var (
	_ [SeqLockSize - unsafe.Sizeof(seqLockWords{})]struct{}
	_ [unsafe.Sizeof(seqLockWords{}) - SeqLockSize]struct{}
)

// SeqLockAt returns the SeqLock at offset off of seg's data area (8-byte
// aligned). Memory of zeros is a free lock.
func SeqLockAt(seg *Segment, off int) (SeqLock, error) {
	t, err := NewSeqTable(seg, off, 1, SeqLockSize)
	if err != nil {
		return SeqLock{}, err
	}
	return t.At(0), nil
}

// SeqTable is n SeqLocks in a segment's data area, one every stride bytes
// from an offset: a lock per bucket of a hash table, say, each beside the
// bucket it guards. It is checked once, so At costs no more than indexing.
type SeqTable struct {
	mem    []byte
	n      int
	stride int
}

// NewSeqTable returns the table of n SeqLocks every stride bytes from off
// of seg's data area. off and stride must be multiples of 8, stride at
// least SeqLockSize, and the last lock must end inside the segment.
func NewSeqTable(seg *Segment, off, n, stride int) (*SeqTable, error) {
	d := seg.Data()
	switch {
	case off < 0 || off%8 != 0:
		return nil, errorf("seqlock table offset %d is not a non-negative multiple of 8", off)
	case stride < SeqLockSize || stride%8 != 0:
		return nil, errorf("seqlock table stride %d is not a multiple of 8 of at least %d", stride, SeqLockSize)
	case n < 1 || off > len(d) || len(d)-off < SeqLockSize || n-1 > (len(d)-off-SeqLockSize)/stride:
		return nil, errorf("%d seqlocks every %d bytes from offset %d do not fit in a %d-byte segment", n, stride, off, len(d))
	}
	end := off + (n-1)*stride + SeqLockSize
	return &SeqTable{mem: d[off:end:end], n: n, stride: stride}, nil
}

// Len is the number of locks in the table.
func (t *SeqTable) Len() int { return t.n }

// At returns lock i. It panics if i is not in [0, Len()), as indexing a
// slice does.
func (t *SeqTable) At(i int) SeqLock {
	if uint(i) >= uint(t.n) {
		panic("shm: seqlock index out of the table's range")
	}
	return SeqLock{w: (*seqLockWords)(unsafe.Pointer(&t.mem[i*t.stride]))}
}

// Seq is the current sequence: it moves by two with every write, and is
// odd while one is open. One atomic load: a reader may keep what it read
// together with the sequence, and trust it while the sequence stays.
func (l SeqLock) Seq() uint64 { return l.w.seq.Load() }

// Owner is the process word of the lock's holder (Process.Word), or 0.
func (l SeqLock) Owner() uint64 { return l.w.owner.Load() }

// OwnerDead reports whether the lock is held by a process that no longer
// runs: the next Lock takes it over.
func (l SeqLock) OwnerDead() bool {
	o := l.w.owner.Load()
	return o != 0 && !aliveWord(o)
}

// Begin starts a read and returns the sequence to give Validate once the
// record is read. While a write is open it waits, at most patience for a
// live writer (then an error wrapping ErrHeld). A writer that died with its
// write open, or an open write with no holder, gives an error wrapping
// ErrOwnerDied: Lock (which repairs) and read again.
func (l SeqLock) Begin(patience time.Duration) (seq uint64, err error) {
	return l.BeginContext(context.Background(), patience)
}

// BeginContext is Begin whose wait for an open write also ends when ctx
// does, with ctx.Err(). A read that need not wait succeeds whatever ctx.
func (l SeqLock) BeginContext(ctx context.Context, patience time.Duration) (seq uint64, err error) {
	if seq = l.w.seq.Load(); seq&1 != 0 {
		seq, err = l.beginSlow(ctx, patience)
	}
	return seq, err
}

// Validate reports whether no write began since Begin returned seq: what
// was read in between is whole.
func (l SeqLock) Validate(seq uint64) bool { return l.w.seq.Load() == seq }

func (l SeqLock) beginSlow(ctx context.Context, patience time.Duration) (uint64, error) {
	var s, dead uint64
	err := Wait{}.wait(ctx, waiter{
		ready: func() (bool, error) {
			if s = l.w.seq.Load(); s&1 == 0 {
				return true, nil
			}
			// A write stays open only while its writer holds the lock
			// (EndWrite comes before Unlock): the same odd sequence on
			// both sides of a free lock is a write nobody will end.
			if l.w.owner.Load() == 0 && l.w.seq.Load() == s {
				return false, openWithoutOwner(s)
			}
			return false, nil
		},
		seq:       &l.w.wake,
		waiters:   &l.w.sleepers,
		fruitless: &l.w.fruitless,
		peer: func() error {
			if o := l.w.owner.Load(); o != 0 && !aliveWord(o) && l.w.seq.Load()&1 != 0 {
				dead = o
				return errPeerGone
			}
			return nil
		},
		peerEarly: true,
		deadline:  time.Now().Add(patience),
		gosched:   seqLockGosched,
		parkHere:  l.heldHere,
	})
	switch err {
	case nil:
		return s, nil
	case errPeerGone:
		return 0, fmt.Errorf("%w: process %d died in the middle of a write (Lock takes the record over)", ErrOwnerDied, dead>>32)
	case errPatience:
		return 0, fmt.Errorf("%w: process %d has kept a write open for over %v", ErrHeld, l.w.owner.Load()>>32, patience)
	}
	return 0, err
}

// seqLockGosched makes a SeqLock's waits let this process's other
// goroutines run at every checkpoint of the ladder (Backoff.Gosched), with
// any number of Ps: a lock's holder is as often a goroutine of this
// process as another process, one that holds for a microsecond once it
// runs but may be waiting for a P that the waiters' spinning keeps.
const seqLockGosched = time.Nanosecond

// errPeerGone is a SeqLock wait's peer check finding the holder dead.
var errPeerGone = errorf("lock holder dead")

func openWithoutOwner(seq uint64) error {
	return fmt.Errorf("%w: %w: a write is open (sequence %d) and no process holds the lock", ErrOwnerDied, ErrCorrupt, seq)
}

// Lock takes the lock for this process, waiting at most patience for a
// live holder (then an error wrapping ErrHeld, the lock not taken). It
// returns nil with the lock held and no write open. If the holder died,
// or a write was left open with no holder, it takes the lock over and
// returns an error wrapping ErrOwnerDied (and ErrCorrupt for the latter):
// the lock is then held and the write open, as after BeginWrite, and the
// caller must repair the record, then call EndWrite and Unlock.
func (l SeqLock) Lock(patience time.Duration) error {
	return l.LockContext(context.Background(), patience)
}

// LockContext is Lock whose wait for a live holder also ends when ctx
// does, with ctx.Err() and the lock not taken. A free lock is taken
// whatever ctx.
func (l SeqLock) LockContext(ctx context.Context, patience time.Duration) error {
	me := Self().word()
	if l.w.owner.Load() == 0 && l.w.owner.CompareAndSwap(0, me) {
		return l.acquired()
	}
	return l.lockSlow(ctx, me, patience)
}

// acquired checks a lock just taken from nobody for a write left open.
func (l SeqLock) acquired() error {
	if s := l.w.seq.Load(); s&1 != 0 {
		return openWithoutOwner(s)
	}
	return nil
}

func (l SeqLock) lockSlow(ctx context.Context, me uint64, patience time.Duration) error {
	deadline := time.Now().Add(patience)
	var dead uint64
	var result error
	for {
		err := Wait{}.wait(ctx, waiter{
			ready: func() (bool, error) {
				// Look before the compare-and-swap: a failing one
				// still takes the line from the holder.
				if l.w.owner.Load() != 0 || !l.w.owner.CompareAndSwap(0, me) {
					return false, nil
				}
				result = l.acquired()
				return true, nil
			},
			seq:       &l.w.wake,
			waiters:   &l.w.sleepers,
			fruitless: &l.w.fruitless,
			peer: func() error {
				if o := l.w.owner.Load(); o != 0 && o != me && !aliveWord(o) {
					dead = o
					return errPeerGone
				}
				return nil
			},
			peerEarly: true,
			deadline:  deadline,
			gosched:   seqLockGosched,
			parkHere:  l.heldHere,
		})
		switch err {
		case nil:
			return result
		case errPeerGone:
			if l.w.owner.CompareAndSwap(dead, me) {
				l.BeginWrite()
				return fmt.Errorf("%w: process %d died holding the lock", ErrOwnerDied, dead>>32)
			}
			// Another successor took it over first: wait for it.
		case errPatience:
			return fmt.Errorf("%w: process %d has held the lock for over %v", ErrHeld, l.w.owner.Load()>>32, patience)
		default:
			return err
		}
	}
}

// BeginWrite opens a write (the lock held): the sequence turns odd and
// readers wait, or retry what they read. A write already open stays so.
func (l SeqLock) BeginWrite() {
	if s := l.w.seq.Load(); s&1 == 0 {
		l.w.seq.Store(s + 1)
	}
}

// EndWrite closes the write (the lock still held): the sequence turns even
// and readers asleep on it wake.
func (l SeqLock) EndWrite() {
	if s := l.w.seq.Load(); s&1 != 0 {
		l.w.seq.Store(s + 1)
	}
	if l.w.sleepers.Load()&sleeperCount != 0 {
		l.wake()
	}
}

// Unlock releases the lock if this process holds it, and wakes the
// goroutines asleep in Lock. End an open write first.
func (l SeqLock) Unlock() {
	l.w.owner.CompareAndSwap(Self().word(), 0)
	if l.w.sleepers.Load()&sleeperCount != 0 {
		l.wake()
	}
}

// heldHere reports whether a goroutine of this process holds the lock: its
// waiters then sleep in Go's scheduler (see waiter.parkHere), and its
// EndWrite or Unlock, in this process too, wakes them.
func (l SeqLock) heldHere() bool { return l.w.owner.Load() == Self().word() }

// wake wakes the lock's sleepers, readers and lockers alike: those of this
// process asleep in Go's scheduler, and those of any process asleep on the
// futex. As wake does, it skips the system call when every sleeper counted
// is known dead (fruitless), but never for a wake-up that woke a sleeper
// of this process.
func (l SeqLock) wake() {
	here := localWake()
	w := l.w.sleepers.Load()
	if w&sleeperCount == 0 || w == l.w.fruitless.Load() {
		return
	}
	l.w.wake.Add(1)
	if futexWake(&l.w.wake, 1<<30) == 0 && !here {
		l.w.fruitless.Store(w)
	}
}
