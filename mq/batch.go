package mq

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// maxBatch bounds the records of one LoanBatch.
const maxBatch = 1 << 16

// Batch is records of one size loaned together (LoanBatch): fill each
// one's Bytes(i), then Commit or Abort them all, once (the batch keeps
// its segment mapped until then; no Bytes may be used after).
type Batch struct {
	l      *Log
	pt     *partition
	m      *mapped
	at     uint64 // offset in the segment of the first record
	offset uint64 // log offset of the first record
	n      uint64 // payload bytes of each record
	count  int
	state  uint64 // the first header's state word as claimed
}

// Len is how many records the batch holds.
func (b *Batch) Len() int { return b.count }

// stride is the bytes each record of the batch takes, header included.
func (b *Batch) stride() uint64 { return align8(headerSize + b.n) }

// Bytes is record i's loaned payload space, in shared memory. It panics
// if i is not below Len, as indexing a slice would.
func (b *Batch) Bytes(i int) []byte {
	if i < 0 || i >= b.count {
		panic(fmt.Sprintf("mq: record %d of a batch of %d", i, b.count))
	}
	at := b.at + uint64(i)*b.stride() + headerSize
	return b.m.data[at : at+b.n : at+b.n]
}

// Offset is record i's log offset: a record's once Commit has returned
// nil (before, only the first one is a record's, being written).
func (b *Batch) Offset(i int) uint64 { return b.offset + uint64(i)*b.stride() }

// Commit publishes every record of the batch at once: readers see none of
// them before, and all of them, in order, after. It fails with
// ErrAborted if a reader took this process for dead and aborted the
// batch. Under FlushEverySend it returns once the batch is on disk (or
// with the error that kept it from getting there: it is published
// anyway).
//
// The batch was claimed as one record being written, as long as all of
// them: the records after the first get their headers, committed, while
// nobody can reach them, and the first one's header, turned from that
// claim into its own committed header by one CAS, publishes them all.
func (b *Batch) Commit() error {
	if b.l == nil {
		return ErrAborted
	}
	if b.m.words[b.at/8].Load() != b.state {
		// Aborted by a reader that took this process for dead: write
		// no header into what readers skip.
		b.m.release()
		return ErrAborted
	}
	stride := b.stride()
	writer := b.state & (1<<32 - 1) &^ (stateMask | flagPad | 0x8) // the slot and generation
	for i := 1; i < b.count; i++ {
		// Plain stores, not atomic ones (an atomic store is a full
		// barrier on amd64, twice per record): nobody reads these words
		// before the CAS below, which orders them before any read.
		at := b.at + uint64(i)*stride
		payload := b.m.data[at+headerSize : at+headerSize+b.n]
		binary.NativeEndian.PutUint64(b.m.data[at+8:], uint64(crc32.Checksum(payload, castagnoli))|(b.offset+uint64(i)*stride)<<32)
		binary.NativeEndian.PutUint64(b.m.data[at:], b.n<<32|writer|stateCommitted)
	}
	first := b.m.data[b.at+headerSize : b.at+headerSize+b.n]
	return b.l.publish(b.pt, b.m, b.at, b.state, b.n<<32|writer|stateCommitted,
		uint64(crc32.Checksum(first, castagnoli))|b.offset<<32, b.at+uint64(b.count)*stride)
}

// Abort gives every record of the batch up: readers skip them as one
// aborted record.
func (b *Batch) Abort() {
	if b.l != nil {
		abandon(b.pt, b.m, b.at, b.state)
	}
}

// LoanBatch reserves up to count records of n bytes each, one after the
// other at the tail of partition p, with one claim: as many as fit in
// the rest of the tail's segment, at least one (Len says how many; ask
// again for the rest). It is Loan for many small records: one claim, one
// move of the tail and one publication for all of them, where Loan takes
// each its own. Readers see none of them until Commit publishes them
// all; Abort, or a producer that dies holding the batch, gives them all
// up (readers skip them as one aborted record, counted once in
// Stats.Aborted). A full partition waits or fails by Config.Full; ctx
// bounds the wait.
//
// A log in files under FlushEverySend or FlushInterval loans one record
// at a time: Commit rewrites the first header's length and writes the
// others' headers, which may reach the disk in any order, and a log
// opened again after a machine crash reads its segments by following the
// headers' lengths: a batch half on disk would end that walk before
// records written and flushed after it.
func (l *Log) LoanBatch(ctx context.Context, p, n, count int) (Batch, error) {
	pt, err := l.part(p)
	if err != nil {
		return Batch{}, err
	}
	if count < 1 || count > maxBatch {
		return Batch{}, fmt.Errorf("mq: a batch of %d records (1 to %d)", count, maxBatch)
	}
	if l.cfg.Dir != "" && l.cfg.Flush != FlushNone {
		count = 1
	}
	m, t, at, c, claim, err := l.claim(ctx, p, pt, n, count)
	if err != nil {
		return Batch{}, err
	}
	return Batch{l: l, pt: pt, m: m, at: at, offset: t, n: uint64(n), count: int(c), state: claim}, nil
}
