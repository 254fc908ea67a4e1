package mq

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// Starting points for NewReader besides a log offset.
const (
	// Oldest is the first record retention keeps.
	Oldest = ^uint64(0)
	// Newest is the next record to be sent.
	Newest = ^uint64(0) - 1
)

// Record is a committed record read in place.
type Record struct {
	// Offset is the record's log offset; Offset of the next record is
	// Reader.Offset after Next.
	Offset uint64
	// Payload is the record's bytes in shared memory. It is valid until
	// the next call of Next or Close on the Reader that returned it.
	// The payload's checksum was verified when Next returned; shared
	// memory is writable by every producer, so a hostile one could still
	// change it afterwards.
	Payload []byte
	// CRC is the payload's CRC-32C (Castagnoli) as its header holds it,
	// which Payload was checked against: a holder of a checksum made
	// when the record was written (an offload reference) compares it
	// with this instead of summing the payload again.
	CRC uint32
}

// Reader reads one partition from its own offset. Readers register in the
// log's meta segment, so that producers under FullBlock and FullFail keep
// the segments they are in. A Reader is for one goroutine at a time.
type Reader struct {
	l      *Log
	p      int
	pt     *partition
	owner  *atomic.Uint64
	off    *atomic.Uint64 // the slot's offset, updated per segment
	me     uint64
	offset uint64
	m      *mapped // this reader's own mapping of its current segment
	// next is the next segment, mapped ahead by a goroutine (openAhead)
	// that opening counts; it is read after opening.Wait.
	next    *mapped
	opening sync.WaitGroup
	// tail is the partition's tail as last loaded: records below it are
	// claimed, so the reader loads the tail (a line every producer
	// writes) only when it catches up with it.
	tail   uint64
	closed bool
	// waits is how Next waits for a record (SetWait).
	waits shm.Wait

	aborted uint64

	// onMap, if set, is called when the reader is about to map segment
	// k, before it reads a record of it: a replica maps the segment too,
	// for its writes (replica.go).
	onMap func(k uint64) error
}

// NewReader returns a reader of partition p from log offset from (an offset
// a record had, or 0), Oldest or Newest.
func (l *Log) NewReader(p int, from uint64) (*Reader, error) {
	pt, err := l.part(p)
	if err != nil {
		return nil, err
	}
	me := shm.Self().Word()
	r := &Reader{l: l, p: p, pt: pt, me: me}
	for i := range maxReaders {
		base := offReaders + i*line
		owner, _ := l.meta.Uint64At(base)
		w := owner.Load()
		if w != 0 && shm.AliveWord(w) || !owner.CompareAndSwap(w, me) {
			continue
		}
		r.owner = owner
		part, _ := l.meta.Uint64At(base + 8)
		r.off, _ = l.meta.Uint64At(base + 16)
		part.Store(uint64(p))
		// A pin tag (consumer groups: pinTag) left by the slot's last
		// holder is not this reader's.
		for _, w := range pinTag(l, i) {
			w.Store(0)
		}
		break
	}
	if r.owner == nil {
		return nil, fmt.Errorf("mq: %s: %d readers: %w", l.name, maxReaders, ErrNoSlot)
	}
	if err := r.start(from); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// start puts a new reader at from (Oldest, Newest or an offset a record
// had): its slot holds the place first, then the place is checked
// against the head (ErrOffsetGone) and the segment's headers (boundary).
func (r *Reader) start(from uint64) error {
	size := uint64(r.l.cfg.SegmentSize)
	switch from {
	case Oldest:
		from = r.pt.head.Load() * size
	case Newest:
		from = r.pt.tail.Load()
	}
	r.offset = from
	r.off.Store(from)
	switch {
	case from%8 != 0:
		return fmt.Errorf("mq: offset %d is not a record's", from)
	case from < r.pt.head.Load()*size:
		return fmt.Errorf("mq: offset %d of partition %d: %w", from, r.p, ErrOffsetGone)
	}
	return r.boundary(from)
}

// NewScanner returns a reader of partition p from log offset from (as
// NewReader's) that takes no reader slot: it never fails for want of one,
// and holds nothing back. Retention may drop segments ahead of it, and
// its Next then fails with ErrOffsetGone; the segment it is in stays
// mapped for it, so it never reads a segment made again under the same
// name. For scans that must not hold retention, or cannot have a slot:
// finding a topic's last record, a position by time.
func (l *Log) NewScanner(p int, from uint64) (*Reader, error) {
	pt, err := l.part(p)
	if err != nil {
		return nil, err
	}
	r := &Reader{l: l, p: p, pt: pt, me: shm.Self().Word(), off: new(atomic.Uint64)}
	if err := r.start(from); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// boundary checks that a record starts at from, by walking the headers
// of its segment from the segment's start (at most a segment's worth):
// a reader from inside a payload would take payload words for headers,
// and might abort one "written by a dead producer", that is, write into
// a committed record. Headers below the tail are claimed (a producer
// moves the tail past a header only once it holds it), and a header's
// length never changes once claimed but a batch's (LoanBatch: its claim
// covers all its records, and Commit gives the first its own length):
// the walk skips a batch being written whole (an offset inside it is no
// record's until Commit) and steps through its records after, so an
// offset found a record's stays one.
func (r *Reader) boundary(from uint64) error {
	size := uint64(r.l.cfg.SegmentSize)
	at := from % size
	if tail := r.pt.tail.Load(); from > tail {
		return fmt.Errorf("mq: offset %d of partition %d is beyond its tail %d, not a record's", from, r.p, tail)
	}
	if at == 0 {
		return nil
	}
	m, err := r.mapping(from / size)
	if err != nil {
		return err
	}
	pos := uint64(0)
	for pos < at && size-pos >= headerSize {
		w := m.words[pos/8].Load()
		n := w >> 32
		if w == 0 || n > size-pos-headerSize {
			return fmt.Errorf("mq: header %#x at offset %d of partition %d: %w", w, from-at+pos, r.p, shm.ErrCorrupt)
		}
		if w&flagPad != 0 {
			pos = size
			break
		}
		pos += align8(headerSize + n)
	}
	if pos != at {
		return fmt.Errorf("mq: offset %d of partition %d is not a record's", from, r.p)
	}
	return nil
}

// Offset is the log offset the next Next reads from.
func (r *Reader) Offset() uint64 { return r.offset }

// Seek moves the reader to log offset to (an offset a record had, 0,
// Oldest or Newest) in its own slot, checked as NewReader checks it: a
// dropped offset is ErrOffsetGone, an offset inside a record or beyond
// the tail an error. On an error the reader stays where it was (its
// place was kept from retention meanwhile). Records returned before are
// not to be used after it, as after Next.
func (r *Reader) Seek(to uint64) error {
	if r.closed || r.l.closed.Load() {
		return ErrClosed
	}
	size := uint64(r.l.cfg.SegmentSize)
	switch to {
	case Oldest:
		to = r.pt.head.Load() * size
	case Newest:
		to = r.pt.tail.Load()
	}
	if to%8 != 0 {
		return fmt.Errorf("mq: offset %d is not a record's", to)
	}
	if to < r.pt.head.Load()*size {
		return fmt.Errorf("mq: offset %d of partition %d: %w", to, r.p, ErrOffsetGone)
	}
	// The slot holds the lower of the two places while to is checked, so
	// that retention keeps both; then the head is looked at again (a
	// segment dropped before the slot held it is gone).
	if to < r.offset {
		r.off.Store(to)
	}
	var err error
	if to < r.pt.head.Load()*size {
		err = fmt.Errorf("mq: offset %d of partition %d: %w", to, r.p, ErrOffsetGone)
	} else {
		err = r.boundary(to)
	}
	if err != nil {
		if to < r.offset {
			r.off.Store(r.offset)
			r.l.wakeBlocked(r.pt)
		}
		return err
	}
	r.offset = to
	r.off.Store(to)
	r.l.wakeBlocked(r.pt)
	return nil
}

// Aborted counts the records this reader aborted and skipped because their
// writer died before committing them.
func (r *Reader) Aborted() uint64 { return r.aborted }

// Close gives the reader's slot up and unmaps its segment. Close Readers
// before their Log.
func (r *Reader) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	r.opening.Wait()
	if r.next != nil {
		r.next.unmap()
		r.next = nil
	}
	var err error
	if r.m != nil {
		err = r.m.unmap()
		r.m = nil
	}
	if r.owner != nil && !r.l.closed.Load() { // else no slot (a scanner), or it went with the Log's mapping
		r.owner.CompareAndSwap(r.me, 0)
		r.l.wakeBlocked(r.pt)
	}
	return err
}

// wakeBlocked wakes producers waiting for readers to move on.
func (l *Log) wakeBlocked(pt *partition) {
	wake(pt.freed, pt.blocked)
}

// moveTo sets the reader's offset to o, telling producers when it leaves a
// segment.
func (r *Reader) moveTo(o uint64) {
	size := uint64(r.l.cfg.SegmentSize)
	crossed := o/size != r.offset/size
	r.offset = o
	if crossed {
		r.off.Store(o)
		r.l.wakeBlocked(r.pt)
	}
}

// mapping returns segment k mapped for this reader.
func (r *Reader) mapping(k uint64) (*mapped, error) {
	if r.m != nil && r.m.index == k {
		return r.m, nil
	}
	if r.m != nil {
		// Records of it are not used after this Next (Record.Payload).
		r.l.unmapLater(r.m)
		r.m = nil
	}
	if r.onMap != nil {
		// The reader's slot is in segment k already (moveTo), so
		// retention under FullBlock and FullFail keeps it for the hook.
		if err := r.onMap(k); err != nil {
			return nil, err
		}
	}
	r.opening.Wait()
	if n := r.next; n != nil {
		r.next = nil
		// Retention may have dropped it since it was mapped ahead: then
		// the reader is told, as if it opened it now (below).
		if n.index == k && k >= r.pt.head.Load() {
			r.m = n
			r.openAhead(k + 1)
			return n, nil
		}
		r.l.unmapLater(n)
	}
	if k < r.pt.head.Load() {
		// Dropped, its file perhaps not yet removed.
		return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, r.p, ErrOffsetGone)
	}
	m, err := r.open(k)
	if err != nil {
		return nil, err
	}
	r.m = m
	r.openAhead(k + 1)
	return m, nil
}

// open maps segment k.
func (r *Reader) open(k uint64) (*mapped, error) { return r.l.mapSeg(r.p, k) }

// mapSeg maps segment k of partition p, a mapping of the caller's own
// (not the producers' cache): Close its seg when done.
func (l *Log) mapSeg(p int, k uint64) (*mapped, error) {
	size := l.cfg.SegmentSize
	seg, err := l.openSeg(p, k)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, ErrOffsetGone)
		}
		return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, err)
	}
	if seg.Size() < size {
		seg.Close()
		return nil, fmt.Errorf("mq: segment %d of partition %d has %d bytes, want %d: %w", k, p, seg.Size(), size, shm.ErrCorrupt)
	}
	words, err := seg.Uint64s(0, size/8)
	if err != nil {
		seg.Close()
		return nil, err
	}
	return &mapped{index: k, seg: seg, words: words, data: seg.Data()[:size:size], maps: l.parts[p].maps}, nil
}

// openAhead maps segment k in the background, if it exists already, and
// faults its pages in by reading a word of each, so that the reader
// crossing into it neither waits for the mapping nor takes a page fault
// per 4 KiB (a fault waits for the process's mmap lock, which a segment
// being unmapped holds for up to a millisecond). A segment not there yet
// is left for mapping to open when the reader gets to it.
func (r *Reader) openAhead(k uint64) {
	if k >= r.pt.made.Load() {
		return
	}
	r.opening.Add(1)
	go func() {
		defer r.opening.Done()
		m, err := r.open(k)
		if err != nil {
			return
		}
		for i := 0; i < len(m.words); i += pageWords {
			m.words[i].Load()
		}
		r.next = m
	}()
}

// pageWords is the number of 8-byte words in a 4 KiB page.
const pageWords = 4096 / 8

// Next returns the next committed record, waiting for one until ctx ends.
// Records whose writer died before committing are aborted and skipped.
// A header that makes no sense is an error wrapping shm.ErrCorrupt (the
// reader stays at that offset).
func (r *Reader) Next(ctx context.Context) (Record, error) {
	rec, _, err := r.read(ctx, ^uint64(0))
	return rec, err
}

// NextBelow is Next for records below log offset limit: it returns
// ok false, without waiting, once the reader's offset reaches limit (a
// tail from Log.Stats, say). It does not wait for a record being
// written either: at a record its live writer has not committed yet it
// returns ok false after a short spin, and the reader stays there (a
// later call, or Next, reads it once committed). A dead writer's record
// is aborted and skipped, as Next does.
func (r *Reader) NextBelow(ctx context.Context, limit uint64) (rec Record, ok bool, err error) {
	return r.read(ctx, limit)
}

func (r *Reader) read(ctx context.Context, limit uint64) (Record, bool, error) {
	below := limit != ^uint64(0)
	if r.closed || r.l.closed.Load() {
		return Record{}, false, ErrClosed
	}
	size := uint64(r.l.cfg.SegmentSize)
	bo := r.backoff()
	var look shm.Backoff // NextBelow's short look at a held record: the default spin
	for {
		o := r.offset
		k, at := o/size, o%size
		if size-at < headerSize {
			r.moveTo((k + 1) * size)
			continue
		}
		if o >= limit {
			return Record{}, false, nil
		}
		if o >= r.tail {
			if r.tail = r.pt.tail.Load(); o >= r.tail {
				if err := r.wait(ctx, &bo, func() bool { return r.pt.tail.Load() > o }, nil); err != nil {
					return Record{}, false, err
				}
			}
			continue
		}
		m, err := r.mapping(k)
		if err != nil {
			return Record{}, false, err
		}
		hw := &m.words[at/8]
		w := hw.Load()
		w1 := m.words[at/8+1].Load()
		rec, next, err := decode(m.data, at, w, w1, o)
		if err != nil {
			return Record{}, false, fmt.Errorf("mq: partition %d offset %d: %w", r.p, o, err)
		}
		switch w & stateMask {
		case stateWriting:
			dead := func() bool {
				if !r.l.writerDead(w) {
					return false
				}
				if hw.CompareAndSwap(w, w|stateAborted) {
					r.pt.aborted.Add(1)
					r.aborted++
				}
				return true
			}
			if below {
				// NextBelow: a held record ends what is there to read.
				if !look.Pause() && !dead() {
					return Record{}, false, nil
				}
				continue
			}
			if err := r.wait(ctx, &bo, func() bool { return hw.Load() != w }, dead); err != nil {
				return Record{}, false, err
			}
			continue
		case stateCommitted:
			r.moveTo(o + next)
			if rec == nil {
				continue // padding
			}
			return Record{Offset: o, Payload: rec, CRC: uint32(w1)}, true, nil
		default: // aborted
			r.moveTo(o + next)
		}
		bo.Reset()
		look.Reset()
	}
}

// held reports whether the record at the reader's offset is claimed and
// still being written by a producer that is alive: Next would wait for
// it. It looks at the header only if the reader has its segment mapped
// (Next looked there before); otherwise it says false, and Next looks.
func (r *Reader) held() bool {
	size := uint64(r.l.cfg.SegmentSize)
	o := r.offset
	k, at := o/size, o%size
	if r.closed || r.m == nil || r.m.index != k || size-at < headerSize || o >= r.tail {
		return false
	}
	w := r.m.words[at/8].Load()
	return w&stateMask == stateWriting && !r.l.writerDead(w)
}

// decode checks the record header (w, w1) at offset at of a segment's data
// for log offset o and returns the payload (nil for padding and records
// not committed) and the record's size. Everything in it came from shared
// memory.
func decode(data []byte, at, w, w1, o uint64) ([]byte, uint64, error) {
	payload, next, err := decodeUnsummed(data, at, w, w1, o)
	if err == nil && payload != nil && crc32.Checksum(payload, castagnoli) != uint32(w1) {
		return nil, 0, fmt.Errorf("record at %d fails its checksum: %w", o, shm.ErrCorrupt)
	}
	return payload, next, err
}

// decodeUnsummed is decode without the payload's checksum, for a caller
// that sums the payload as it copies it (Log.CopyAt).
func decodeUnsummed(data []byte, at, w, w1, o uint64) ([]byte, uint64, error) {
	size := uint64(len(data))
	n := w >> 32
	if at%8 != 0 || at > size-headerSize || n > size-at-headerSize {
		return nil, 0, fmt.Errorf("header %#x at %d says %d bytes: %w", w, at, n, shm.ErrCorrupt)
	}
	next := align8(headerSize + n)
	state := w & stateMask
	if state == 0 || (w>>4)&0xfff >= maxProducers && w&flagPad == 0 || w&0x8 != 0 {
		return nil, 0, fmt.Errorf("header %#x at %d: %w", w, at, shm.ErrCorrupt)
	}
	if w&flagPad != 0 {
		if state != stateCommitted || at+headerSize+n != size {
			return nil, 0, fmt.Errorf("padding header %#x at %d does not end the segment: %w", w, at, shm.ErrCorrupt)
		}
		return nil, next, nil
	}
	if state != stateCommitted {
		return nil, next, nil
	}
	payload := data[at+headerSize : at+headerSize+n : at+headerSize+n]
	if uint32(w1>>32) != uint32(o) {
		return nil, 0, fmt.Errorf("record at %d names offset %#x: %w", o, w1>>32, shm.ErrCorrupt)
	}
	return payload, next, nil
}

// writerDead reports whether the producer that claimed header w is gone:
// its slot is free, taken by another handle since (the generation
// differs), or held by a process that died.
func (l *Log) writerDead(w uint64) bool {
	s := (w >> 4) & 0xfff
	if s >= maxProducers {
		return true // no producer's: a header made of garbage
	}
	owner := l.slots[2*s].Load()
	gen := l.slots[2*s+1].Load() & 0xffff
	return owner == 0 || gen != (w>>16)&0xffff || !shm.AliveWord(owner)
}

// SetWait sets how Next waits for a record, as shm.Wait says for rings:
// the zero Wait (the default) looks for w.Spin (shm.DefaultSpin if 0),
// then sleeps until a producer's commit wakes it; shm.WaitYield never
// sleeps: it looks, and from w.Spin on (shm.DefaultYield if 0) gives its
// CPU to other threads between looks (sched_yield), which costs nothing
// when none wants it; shm.WaitSpin never sleeps nor yields. A reader
// that never sleeps burns its CPU while it waits, and in exchange is
// never woken: a wake-up costs tens of microseconds on a virtual
// machine, and a goroutine woken from a futex sleep sometimes waited
// milliseconds more for Go's scheduler to run it, so a consumer that
// must see every record within microseconds (log-100B-p99) waits so.
// Either way it notices an ended ctx, or a producer that died in a
// record, within about a millisecond (spinCheck) after w.Spin. SetWait
// applies to NextBelow's wait for the tail too; its short look at a
// record being written is the same whatever SetWait said. Not safe to
// call concurrently with Next.
func (r *Reader) SetWait(w shm.Wait) { r.waits = w }

// spinCheck is how often a reader that never sleeps (SetWait) looks at
// its ctx and at the producer of a record it waits for.
const spinCheck = time.Millisecond

// backoff is the ladder of a wait of r (SetWait): under WaitYield it
// yields from w.Spin on (shm.DefaultYield if 0, at once if negative),
// under WaitSpin never; a ladder that never sleeps ends spinCheck after
// its yields begin, for wait to look at ctx and the writer, and starts
// again.
func (r *Reader) backoff() shm.Backoff {
	switch r.waits.Mode {
	case shm.WaitSpin:
		return shm.Backoff{Spin: spinCheck, Yield: -1}
	case shm.WaitYield:
		y := r.waits.Spin
		if y < 0 {
			y = time.Nanosecond // from the first checkpoint
		}
		return shm.Backoff{Spin: y + spinCheck, Yield: y}
	}
	return shm.Backoff{Spin: r.waits.Spin}
}

// wait is one pause of a reader waiting for ready: a step of the Backoff
// ladder, or, once it says park, a sleep of at most 20 ms (see park), or
// for a reader that never sleeps (SetWait), the ladder again.
// dead, if set, is asked before each sleep, and before giving up on an
// ended ctx, whether the writer waited for is gone (it then handled the
// record: the wait ends).
func (r *Reader) wait(ctx context.Context, bo *shm.Backoff, ready func() bool, dead func() bool) error {
	if bo.Pause() {
		return nil
	}
	// A dead writer's record is skipped even when ctx has ended: a
	// consumer group looks with an ended ctx (it gives up on a record
	// being written after the spin, to serve its other partitions) and
	// must still get past a dead producer's record.
	if dead != nil && dead() {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if r.waits.Mode == shm.WaitSpin || r.waits.Mode == shm.WaitYield {
		bo.Reset()
		return nil
	}
	return park(ctx, r.pt.seq, r.pt.sleepers, ready)
}
