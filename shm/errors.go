package shm

import (
	"errors"
	"fmt"
)

// Sentinel errors. Match them with errors.Is; the returned errors wrap them
// with details.
var (
	// ErrCorrupt reports that shared memory holds a value that cannot be valid:
	// a peer is buggy or hostile, or the memory was overwritten. The structure
	// should be abandoned; the caller's process is unharmed.
	ErrCorrupt = errors.New("shm: corrupt shared memory")
	// ErrPeerDead reports that the process on the other side has exited.
	ErrPeerDead = errors.New("shm: peer process is dead")
	// ErrClosed reports that the structure was closed by this side or the peer.
	ErrClosed = errors.New("shm: closed")
	// ErrRingFull is returned by non-blocking producer calls when the ring has
	// no room for the record.
	ErrRingFull = errors.New("shm: ring full")
	// ErrRingEmpty is returned by non-blocking consumer calls when there is
	// nothing to read.
	ErrRingEmpty = errors.New("shm: ring empty")
	// ErrTooLarge reports a record or allocation larger than the structure can
	// ever hold.
	ErrTooLarge = errors.New("shm: too large")
	// ErrPoolExhausted reports that no free buffer of a fitting size class is
	// left in the pool.
	ErrPoolExhausted = errors.New("shm: pool exhausted")
	// ErrStaleHandle reports a handle whose buffer has been freed or reused
	// since the handle was made.
	ErrStaleHandle = errors.New("shm: stale handle")
	// ErrInvalidHandle reports a handle that does not name a buffer of this pool.
	ErrInvalidHandle = errors.New("shm: invalid handle")
	// ErrBusy reports an end of a ring that another live process already holds.
	ErrBusy = errors.New("shm: ring end already attached by a live process")
	// ErrOwnerDied reports that the holder of a SeqLock died, or that a
	// write was left open with no holder, so the record it guards may be
	// half written. From Lock the caller holds the lock with the write
	// open and must repair the record; from Begin, nothing is held: Lock,
	// to repair.
	ErrOwnerDied = errors.New("shm: lock holder gone, its write may be half done")
	// ErrHeld reports that a live process held a SeqLock, or kept a write
	// open, for longer than the caller's patience. Nothing is corrupt: the
	// holder is stopped or slow. Try again later.
	ErrHeld = errors.New("shm: held by a live process")
	// ErrBadDescriptor reports descriptors received from another process
	// that are not what was expected: the wrong number of them, or one of
	// the wrong kind, access mode, seals or size. The sender is buggy or
	// hostile; every descriptor received was closed and nothing mapped.
	ErrBadDescriptor = errors.New("shm: unexpected descriptor received")
)

func corruptf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorrupt}, args...)...)
}

func errorf(format string, args ...any) error {
	return fmt.Errorf("shm: "+format, args...)
}
