package mq

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/ubkit-io/ubkit/shm"
)

// ErrNotRecord: ReadAt's offset does not hold a committed record (it is
// padding, a record still being written, or an aborted one).
var ErrNotRecord = errors.New("mq: no committed record at offset")

// ReadAt reads the record at log offset off of partition p in place, as
// Reader.Next would have returned it, without a reader slot: a random
// access for holders of an offset (mq/offload's references). The payload
// is valid until release is called (release once; the segment stays
// mapped until then, even if retention drops it meanwhile). Everything
// is validated as Next validates it: an offset retention dropped is
// ErrOffsetGone, one at or past the tail or not a committed record's
// ErrNotRecord, a header that makes no sense wraps shm.ErrCorrupt.
//
// The handle keeps up to two segments of each partition it read mapped
// for the next reads, a new one in the place of the lower-numbered
// (mapping a segment anew for each read, and faulting its pages in, was
// half of a 1 MiB CopyAt); a segment retention dropped leaves that cache
// at the handle's next read of any partition, or at Close. While there
// it is pinned: not reused under Config.Recycle, and its memory held,
// unlinked, once dropped.
func (l *Log) ReadAt(p int, off uint64) (Record, func(), error) {
	h, rec, w1, err := l.recordAt(p, off, decode)
	if err != nil {
		return Record{}, nil, err
	}
	return Record{Offset: off, Payload: rec, CRC: uint32(w1)}, h.m.releaseOnce(), nil
}

// CopyAt is ReadAt into memory of the caller's: once the record's
// header is validated, alloc gets the payload's length and returns where
// to copy it (at least that long; io.ErrShortBuffer if not), or an error
// that CopyAt returns (a caller that wants a given length refuses others
// before allocating). The record comes back with Payload the copy. The
// checksum is of the copy, summed as it is made: what CopyAt returns is
// what the producer wrote, even if a hostile producer changes the shared
// bytes meanwhile (ReadAt's in-place payload was checked, and may change
// after). A mismatch wraps shm.ErrCorrupt. It reads the shared bytes
// once, where ReadAt and a copy read them twice.
func (l *Log) CopyAt(p int, off uint64, alloc func(n int) ([]byte, error)) (Record, error) {
	h, rec, w1, err := l.recordAt(p, off, decodeUnsummed)
	if err != nil {
		return Record{}, err
	}
	defer h.m.release()
	dst, err := alloc(len(rec))
	if err != nil {
		return Record{}, err
	}
	if len(dst) < len(rec) {
		return Record{}, fmt.Errorf("mq: offset %d of partition %d: a %d-byte record into %d bytes: %w", off, p, len(rec), len(dst), io.ErrShortBuffer)
	}
	dst = dst[:len(rec)]
	if crc := copySum(dst, rec, dst); crc != uint32(w1) {
		return Record{}, fmt.Errorf("mq: partition %d offset %d: the record fails its checksum: %w", p, off, shm.ErrCorrupt)
	}
	return Record{Offset: off, Payload: dst, CRC: uint32(w1)}, nil
}

// recordAt maps the segment of the record at off and decodes its header
// with dec: the caller releases h.m once done with rec, the payload.
func (l *Log) recordAt(p int, off uint64, dec func(data []byte, at, w, w1, o uint64) ([]byte, uint64, error)) (h header, rec []byte, w1 uint64, err error) {
	h, err = l.headerAt(p, off)
	if err != nil {
		return header{}, nil, 0, err
	}
	w, w1 := h.words[0].Load(), h.words[1].Load()
	rec, _, err = dec(h.data, h.at, w, w1, h.off)
	if err != nil {
		h.m.release()
		return header{}, nil, 0, fmt.Errorf("mq: partition %d offset %d: %w", h.p, h.off, err)
	}
	if rec == nil {
		h.m.release()
		what := "padding"
		switch w & stateMask {
		case stateWriting:
			what = "a record being written"
		case stateAborted:
			what = "an aborted record"
		}
		return header{}, nil, 0, fmt.Errorf("mq: offset %d of partition %d is %s: %w", off, p, what, ErrNotRecord)
	}
	return h, rec, w1, nil
}

// header is a record's header words in its segment, mapped for one read
// (headerAt); the caller releases m.
type header struct {
	pt    *partition
	p     int
	off   uint64
	m     *mapped
	data  []byte // the segment's records
	at    uint64 // off in the segment
	words []atomic.Uint64
}

// headerAt maps the segment of log offset off of partition p and returns
// its header's words, after the checks ReadAt documents: an offset
// retention dropped is ErrOffsetGone, one at or past the tail or not at
// a header's place ErrNotRecord, a segment shorter than the log's size
// wraps shm.ErrCorrupt.
func (l *Log) headerAt(p int, off uint64) (header, error) {
	pt, err := l.part(p)
	if err != nil {
		return header{}, err
	}
	size := uint64(l.cfg.SegmentSize)
	k, at := off/size, off%size
	switch {
	case off%8 != 0 || size-at < headerSize:
		return header{}, fmt.Errorf("mq: offset %d of partition %d: %w", off, p, ErrNotRecord)
	case off < pt.head.Load()*size:
		return header{}, fmt.Errorf("mq: offset %d of partition %d: %w", off, p, ErrOffsetGone)
	case off >= pt.tail.Load():
		return header{}, fmt.Errorf("mq: offset %d of partition %d is at or past the tail: %w", off, p, ErrNotRecord)
	}
	m, err := l.readSeg(p, pt, k)
	if err != nil {
		return header{}, err
	}
	return header{pt: pt, p: p, off: off, m: m, data: m.data, at: at, words: m.words[at/8 : at/8+2]}, nil
}

// readSeg returns segment k of partition p mapped, with a reference the
// caller releases, from the handle's cache of the segments random reads
// used last (pt.reads), mapping it there if it is not. Segments that
// retention dropped leave the cache here (and at any read of the
// handle: pruneReads), and the lower-numbered when it is full: the last
// reference unmaps them, in the background. A segment in the cache is
// mapped, so it is never reused (Config.Recycle) while there: the cache
// holds two, where reads are, not the oldest ones that retention drops
// next, unless the reads stopped there.
func (l *Log) readSeg(p int, pt *partition, k uint64) (*mapped, error) {
	for _, other := range l.parts {
		if other != pt && other.readLow.Load() < other.head.Load() {
			l.pruneReads(other)
		}
	}
	pt.readMu.Lock()
	defer pt.readMu.Unlock()
	if pt.reads == nil {
		return nil, ErrClosed
	}
	l.dropReads(pt, pt.head.Load())
	for _, m := range pt.reads {
		if m != nil && m.index == k {
			m.refs.Add(1)
			return m, nil
		}
	}
	m, err := l.mapSeg(p, k) // in /dev/shm or, for a log with a Dir, its file
	if err != nil {
		return nil, err
	}
	m.refs.Store(2) // the cache's and the caller's
	slot := 0
	for i, c := range pt.reads {
		if c == nil {
			slot = i
			break
		}
		if c.index < pt.reads[slot].index {
			slot = i
		}
	}
	if old := pt.reads[slot]; old != nil {
		l.releaseLater(old)
	}
	pt.reads[slot] = m
	setReadLow(pt)
	return m, nil
}

// setReadLow sets pt.readLow from pt.reads; the caller holds pt.readMu.
func setReadLow(pt *partition) {
	low := ^uint64(0)
	for _, m := range pt.reads {
		if m != nil {
			low = min(low, m.index)
		}
	}
	pt.readLow.Store(low)
}

// pruneReads lets go of the segments in pt's random-read cache that
// retention dropped: at a read of any partition of the handle (a
// consumer group member that no longer owns pt), so that they are not
// left mapped (their memory held) until the next read of pt.
func (l *Log) pruneReads(pt *partition) {
	pt.readMu.Lock()
	defer pt.readMu.Unlock()
	l.dropReads(pt, pt.head.Load())
}

// dropReads lets go of the segments below index below in pt's
// random-read cache; the caller holds pt.readMu.
func (l *Log) dropReads(pt *partition, below uint64) {
	for i, m := range pt.reads {
		if m != nil && m.index < below {
			pt.reads[i] = nil
			l.releaseLater(m)
		}
	}
	setReadLow(pt)
}

// decode is decode for the header words w, w1 read from h.
func (h header) decode(w, w1 uint64) ([]byte, uint64, error) {
	rec, next, err := decode(h.data, h.at, w, w1, h.off)
	if err != nil {
		return nil, 0, fmt.Errorf("mq: partition %d offset %d: %w", h.p, h.off, err)
	}
	return rec, next, nil
}

// claimAt reads the header at log offset off of partition p once and
// says what it holds: a committed record (rec, valid until release is
// called), a claim of n bytes still being written by a live producer
// (held), or neither: an aborted record, padding, a claim of another
// length (not the caller's: it is left alone), or a claim of n bytes
// whose producer is dead, which claimAt aborts first (by CAS on the word
// it read, waking the partition's readers), so that it can never be
// committed after; a producer wrongly taken for dead would fail its
// commit. Errors are ReadAt's.
func (l *Log) claimAt(p int, off uint64, n int) (rec Record, release func(), held bool, err error) {
	h, err := l.headerAt(p, off)
	if err != nil {
		return Record{}, nil, false, err
	}
	for {
		w, w1 := h.words[0].Load(), h.words[1].Load()
		payload, _, err := h.decode(w, w1)
		if err != nil {
			h.m.release()
			return Record{}, nil, false, err
		}
		switch {
		case payload != nil:
			return Record{Offset: off, Payload: payload, CRC: uint32(w1)}, h.m.releaseOnce(), false, nil
		case w&stateMask != stateWriting || w>>32 != uint64(n):
		case !l.writerDead(w):
			h.m.release()
			return Record{}, nil, true, nil
		default:
			if !h.words[0].CompareAndSwap(w, w|stateAborted) {
				continue // committed or aborted meanwhile: look again
			}
			h.pt.aborted.Add(1)
			h.pt.wakeReaders()
		}
		h.m.release()
		return Record{}, nil, false, nil
	}
}
