// Package shm is ubkit's shared-memory layer: segments, cross-process rings,
// a buffer pool and futex wake-ups. It is the home of unsafe and raw system
// calls in ubkit, with the ub providers' internals and a few internal
// helpers: it also exports what the layers above need of the system
// (PeerCredentials, PipeWriter, Yield, and errno sentinels such as
// ErrConnReset) so that they import no syscall.
//
// shm needs Linux. On other systems the package keeps its API, so that
// what imports it compiles, and every call that would make or reach a
// segment fails with an error matching errors.ErrUnsupported.
//
// Everything in a segment may be read and written by another process that is
// buggy, hostile or dead. The package therefore validates every offset, length
// and handle it reads from shared memory before using it: a corrupt peer makes
// the other side return an error wrapping [ErrCorrupt], never panic, read out
// of bounds or hang. Every blocking call waits with a timeout and watches the
// peer process, so a peer that dies surfaces as [ErrPeerDead] within 100 ms.
//
// The building blocks:
//
//   - [Segment]: a named POSIX segment in /dev/shm (names are per user, in
//     files that start with "ubkit-<uid>-", created O_EXCL with mode 0600;
//     another user's file in the way does not block [CreateSegment]) or an
//     anonymous memfd segment that can be
//     sealed and passed to another process with [SendSegment]/[ReceiveSegment].
//     Pipe ends go along with [SendPipes]/[ReceivePipes]. Every descriptor
//     received is checked for its kind, access mode, seals and size, and
//     refused with [ErrBadDescriptor] if it is not what was asked for.
//     [Sweep] removes named segments whose creator died and that no process
//     still uses.
//   - [SPSC]: a single-producer single-consumer ring of variable-length records
//     with batched claim/commit and zero-copy reads.
//   - [MPMC]: a bounded multi-producer multi-consumer ring of fixed-size slots.
//     Its consumer may enable a bell ([MPMC.EnableBell]): a FIFO beside the
//     segment that a sleeping consumer waits on in Go's netpoller and that
//     producers ring after a push, instead of a futex, whose sleeper holds a
//     thread in a system call. [Sweep] removes bells nobody listens on.
//   - [Pool]: a slab allocator of buffers inside a segment, named across
//     processes by a [Handle], with reclamation of buffers whose owner died.
//   - [SeqLock]: a record that processes read without a lock (a sequence
//     number tells a reader to retry) and write under a lock whose holder is
//     a process; the successor of a holder that died repairs the record
//     ([ErrOwnerDied]). [SeqTable] is a lock per bucket of a table.
//   - [Wait]: how a blocked call waits: spin, spin then yield, or spin then
//     sleep on a futex. The spin is [Backoff], ubkit's one waiting ladder,
//     which waiters that park elsewhere use too.
//
// shm is not a message protocol: framing, sessions and flow control live in
// ubkit's transport package.
package shm
