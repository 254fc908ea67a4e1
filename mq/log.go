package mq

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// Errors of the log. Match them with errors.Is.
var (
	// ErrFull: a partition holds Config.Segments segments that a reader
	// still needs, under FullFail.
	ErrFull = errors.New("mq: partition full")
	// ErrOffsetGone: the reader's offset lies in a segment that retention
	// dropped.
	ErrOffsetGone = errors.New("mq: offset no longer retained")
	// ErrAborted: a loan was aborted, or a reader took the record for a
	// dead writer's, before Commit.
	ErrAborted = errors.New("mq: record aborted")
	// ErrTooLarge: a record does not fit in a segment.
	ErrTooLarge = errors.New("mq: record too large for a segment")
	// ErrClosed: the Log or Reader is closed.
	ErrClosed = errors.New("mq: closed")
	// ErrNoSlot: every producer or reader slot of the log is taken by a
	// live process.
	ErrNoSlot = errors.New("mq: no free producer or reader slot")
)

// FullPolicy says what a producer does when its partition already holds
// Config.Segments segments and the oldest is still needed by a reader.
type FullPolicy uint8

const (
	// FullBlock waits until readers move on (or the context ends).
	FullBlock FullPolicy = iota
	// FullFail returns ErrFull.
	FullFail
	// FullOverwrite drops the oldest segment anyway; a reader that had not
	// mapped it yet gets ErrOffsetGone.
	FullOverwrite
)

// Config is the shape of a new log. The zero value is one partition of 8
// segments of 8 MiB, blocking when full.
type Config struct {
	// Partitions is the number of partitions (default 1, at most 256).
	Partitions int
	// SegmentSize is the size of each segment's record area in bytes, a
	// multiple of 8 (default 8 MiB, at least 4 KiB). A record's payload
	// may be up to SegmentSize-16 bytes.
	SegmentSize int
	// Segments is how many segments a partition keeps (default 8, at
	// least 2): retention by size, SegmentSize*Segments bytes.
	Segments int
	// Full is what a producer does when the partition is full.
	Full FullPolicy

	// Dir, if set, backs the segments with memory-mapped files in this
	// directory (it must exist, belong to the user and be closed to group
	// and others' writes) instead of /dev/shm; see docs/mq.md,
	// "Durability". Open such a log with OpenDir once its meta segment
	// is gone (after a reboot, or once every process died and it was
	// removed).
	Dir string
	// Flush is when a file-backed log's records are written to disk
	// (default FlushNone); a policy other than FlushNone needs Dir.
	Flush FlushPolicy
	// FlushPeriod is FlushInterval's period (default 100 ms, at most an
	// hour).
	FlushPeriod time.Duration
	// MaxAge, if positive, is retention by age: a segment whose newest
	// record is older than MaxAge is dropped (see Log.Expire).
	MaxAge time.Duration
	// Recycle reuses the memory of segments that retention dropped for
	// new ones, instead of giving it back to the kernel and having it
	// allocate and zero fresh pages for every new segment (most of what
	// a producer of large records spends). A dropped segment is reused
	// only when no process uses it (no Reader, loan, ReadAt or CopyAt
	// in it), so nobody ever sees its bytes change; one in use is
	// removed as without Recycle. A partition then holds up to two
	// segments more (its spares). Reusing costs zeroing the segment, by
	// the segment's maker (in the background, for segments made ahead).
	// Each handle keeps its mappings of a partition's segments once done
	// with them (a cycle of its files twice; at most 1,024 over the
	// partitions, each holding a descriptor; let go at Close, or at the
	// partition's next roll once their file is removed), and
	// maps a segment made of a spare on the mapping it had of the file:
	// no page tables made and torn down again at every new segment.
	// Only for logs in /dev/shm (not with Dir). See docs/mq.md,
	// "Segment recycling".
	Recycle bool
}

func (c Config) withDefaults() (Config, error) {
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 8 << 20
	}
	if c.Segments == 0 {
		c.Segments = 8
	}
	switch {
	case c.Partitions < 1 || c.Partitions > maxPartitions:
		return c, fmt.Errorf("mq: %d partitions, want 1 to %d", c.Partitions, maxPartitions)
	case c.SegmentSize < 4096 || c.SegmentSize%8 != 0 || c.SegmentSize > maxLen:
		return c, fmt.Errorf("mq: segment size %d, want a multiple of 8 from 4096 to %d", c.SegmentSize, maxLen)
	case c.Segments < 2:
		return c, fmt.Errorf("mq: %d segments kept, want at least 2", c.Segments)
	case c.Full > FullOverwrite:
		return c, fmt.Errorf("mq: unknown full policy %d", c.Full)
	case c.Recycle && c.Dir != "":
		return c, errors.New("mq: Recycle is for logs in /dev/shm, not with Dir")
	}
	return c.durableDefaults()
}

// Layout of the meta segment (see docs/mq.md). Offsets in its data area.
const (
	metaMagic   = 0x31474f4c2d514d75 // "uMQ-LOG1", little endian
	line        = 128
	offMagic    = 0
	offParts    = 8
	offSegSize  = 16
	offSegments = 24
	offPolicy   = 32
	offFlush    = 40 // Config.Flush
	offPeriod   = 48 // Config.FlushPeriod in ns
	offMaxAge   = 56 // Config.MaxAge in ns
	offRecycle  = 72 // Config.Recycle: 1 if set
	// offAnySeq is a u32 futex word that every commit or abort in any
	// partition wakes when offAnySleepers (u32) says somebody sleeps on
	// it: a consumer group member that owns several partitions sleeps
	// there (a futex waits on one word), instead of polling them.
	offAnySeq      = 64
	offAnySleepers = 68

	maxProducers = 256
	offProducers = line // maxProducers slots of {owner, gen}
	maxReaders   = 64
	offReaders   = offProducers + maxProducers*16 // one line each: owner, partition, offset
	offParts0    = offReaders + maxReaders*line
	partStride   = 3 * line // tail | head, aborted, made, torn, synced, padEnds | seq, sleepers, freed, blocked, reused
	// offPadEnds (in a partition's words): padRing words, the log offset
	// of the padding that ends segment k in word k mod padRing, written
	// by the producer that commits it. A consumer group whose next
	// offset retention dropped tells from it whether only padding was
	// lost (Log.onlyPadding). A word names its segment (offset/size), so
	// a stale one is told apart; zero says nothing.
	offPadEnds    = line + 48
	padRing       = 8
	maxPartitions = 256
	offDir        = offParts0 + maxPartitions*partStride // Config.Dir: length, then bytes
	metaSize      = offDir + 8 + maxDir

	maxLen = 1<<32 - 1
)

// Record header: two 8-byte words before the payload, the record padded to
// 8 bytes. Word 0 is the state word, claimed by CAS from 0:
//
//	bits 0-1   state (writing, committed, aborted)
//	bit  2     padding (a committed filler to the end of a segment)
//	bits 4-15  the writer's producer slot
//	bits 16-31 the slot's generation
//	bits 32-63 payload length
//
// Word 1 is the payload's CRC-32C (low half) and the low half of the
// record's log offset (high half), written before the commit.
const (
	headerSize     = 16
	stateMask      = 3
	stateWriting   = 1
	stateCommitted = 2
	stateAborted   = 3
	flagPad        = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func align8(n uint64) uint64 { return (n + 7) &^ 7 }

// partition is a partition's words in the meta segment and this handle's
// mappings of its segments.
type partition struct {
	tail, head, aborted *atomic.Uint64
	made                *atomic.Uint64  // segments created so far: the next to create is made
	torn                *atomic.Uint64  // records reopening found torn (file.go)
	synced              *atomic.Uint64  // FlushEverySend: headers below it are on disk (file.go)
	seq, sleepers       *atomic.Uint32  // readers asleep wait on seq
	anySeq, anySleepers *atomic.Uint32  // the log's: waiters on any partition (offAnySeq)
	freed, blocked      *atomic.Uint32  // producers blocked on a full partition wait on freed
	reused              *atomic.Uint64  // segments made of a spare (Config.Recycle)
	padEnds             []atomic.Uint64 // offPadEnds

	mu   sync.Mutex
	segs map[uint64]*mapped
	cur  atomic.Pointer[mapped] // the newest mapped segment, for the producers' fast path

	ahead     atomic.Bool                  // a goroutine of this handle is making the next segment ahead
	aheadJob  *aheadJob                    // which, under mu: for a producer that reaches it first (awaitAhead)
	aheadFail atomic.Pointer[aheadFailure] // why it could not, for the producer that needs the segment

	readMu  sync.Mutex
	reads   []*mapped     // the segments random reads used last (readSeg); nil once closed
	readLow atomic.Uint64 // the lowest index in reads (^0: none), for pruneReads to skip the rest

	// maps keeps this handle's mappings of the partition's segments once
	// it is done with them, under Config.Recycle: a segment made of a
	// spare is a file this process has mapped before, and mapping it
	// again through maps costs no page tables (see mapsFor).
	maps *shm.MapCache
}

// aheadJob is makeAhead's goroutine making segment k: done is closed once
// it has put the segment in the handle's cache (or failed) and the handle
// may make the next one ahead.
type aheadJob struct {
	k    uint64
	done chan struct{}
}

// aheadFailure is why makeAhead could not make segment k.
type aheadFailure struct {
	k   uint64
	err error
}

// mapped is one segment of a partition mapped by this handle. The
// producers' cache holds one reference while the segment is in it, and
// each reservation one more, so that a goroutine with a loan (or a stale
// view of the tail) never writes to a segment the cache has unmapped.
type mapped struct {
	index uint64
	seg   *shm.Segment
	words []atomic.Uint64
	data  []byte
	refs  atomic.Int64
	// maps, if set, takes the mapping when it is no longer used
	// (partition.maps).
	maps *shm.MapCache
	// syncErr is the first failed flush of the segment through this
	// handle (file.go, noteSync).
	syncErr atomic.Pointer[error]
}

// acquire takes a reference, unless the segment is already unmapped.
func (m *mapped) acquire() bool {
	for {
		r := m.refs.Load()
		if r <= 0 {
			return false
		}
		if m.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

// release drops a reference; the last unmaps the segment.
func (m *mapped) release() {
	if m.refs.Add(-1) == 0 {
		m.unmap()
	}
}

// unmap closes the segment: into the partition's MapCache if it has one
// (its mapping is kept for the file's next use), else unmapped.
func (m *mapped) unmap() error { return m.maps.Release(m.seg) }

// releaseOnce is release for a caller outside the package, who may call
// it more than once: the calls after the first do nothing.
func (m *mapped) releaseOnce() func() {
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			m.release()
		}
	}
}

// releaseLater is release with the unmapping, if it comes to that, done
// by another goroutine (unmapLater).
func (l *Log) releaseLater(m *mapped) {
	if m.refs.Add(-1) == 0 {
		l.unmapLater(m)
	}
}

// unmapLater unmaps m (m.unmap) in another goroutine: unmapping a
// segment whose pages were all touched took a producer or a reader
// crossing into the next segment several hundred µs, in which its
// records waited (into a MapCache it costs little, unless the cache
// unmaps its oldest mapping to make room). Close waits for these.
func (l *Log) unmapLater(m *mapped) {
	l.unmapping.Add(1)
	go func() {
		defer l.unmapping.Done()
		m.unmap()
	}()
}

// Log is a handle on a shared-memory log: its partitions, the producer slot
// that names this handle's writes, and its mappings. It is safe for
// concurrent use by many goroutines; many processes open the same log.
type Log struct {
	name   string
	cfg    Config
	meta   *shm.Segment
	owner  *atomic.Uint64 // this handle's producer slot
	gen    uint64
	slot   uint64
	slots  []atomic.Uint64 // producer slots, {owner, gen} pairs
	parts  []*partition
	closed atomic.Bool
	// unmapping counts the segments being unmapped by other goroutines
	// (unmapLater) and the segments being made ahead (makeAhead).
	unmapping sync.WaitGroup

	// Durability and age (file.go).
	dirLock  *os.File                         // the configuration file, locked shared while open
	clock    atomic.Pointer[func() time.Time] // tests' clock; nil: time.Now
	flushErr atomic.Pointer[error]            // the first failed flush of this handle, for Close (noteSync)
	stop     chan struct{}                    // ends the janitor
	done     chan struct{}                    // closed when the janitor ends
}

func metaName(name string) string { return "mq-" + name }

func segName(name string, p int, k uint64) string {
	return fmt.Sprintf("mq-%s-p%d-s%d", name, p, k)
}

// spareName is the name of spare j (0 to spares-1) of partition p under
// Config.Recycle: a segment retention dropped, kept to be made a new one.
// Its prefix is its own: "mq-" names a log's meta segment and its
// segments, and a spare named so could be the meta segment of another log
// (of log "x-p0-spare0", for spare 0 of log x), which Create would remove
// and a reuse zero.
func spareName(name string, p, j int) string {
	return fmt.Sprintf("mqspare-%s-p%d-%d", name, p, j)
}

// spares is how many spares a partition may hold: one being zeroed to be
// made the next segment (newSeg) while the producer drops the next one.
// With one, a producer filling a segment as fast as the maker zeroed the
// one ahead found the spare still there at every third drop (11 of the
// 15 segments made after the first drop were reused, 15 of 16 with two).
const spares = 2

// Create makes log name (a shm segment name) with configuration c and opens
// it. It fails with an error wrapping os.ErrExist if the log exists.
//
// With Config.Dir the segments are files in that directory, beside the
// log's configuration file (<name>.mqlog); it fails with an error
// wrapping os.ErrExist if the directory holds a log of that name.
func Create(name string, c Config) (*Log, error) {
	if c.Dir != "" {
		abs, err := filepath.Abs(c.Dir)
		if err != nil {
			return nil, fmt.Errorf("mq: create %s: %w", name, err)
		}
		c.Dir = abs
	}
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	meta, err := shm.CreateSegment(metaName(name), metaSize, &shm.SegmentConfig{Keep: true})
	if err != nil {
		return nil, fmt.Errorf("mq: create %s: %w", name, err)
	}
	var lock *os.File
	if c.Dir != "" {
		if lock, err = createDir(name, c); err != nil {
			meta.Unlink()
			meta.Close()
			return nil, err
		}
	}
	if c.Dir == "" {
		// Spares left by a log of this name before (its processes
		// died with it) would only be zeroed and reused, but ones of
		// another size would take the places of this log's.
		for p := range c.Partitions {
			removeSpares(name, p)
		}
	}
	writeConfig(meta, c)
	publish(meta)
	l, err := open(name, meta, lock)
	if err != nil {
		if c.Dir != "" {
			os.Remove(configPath(c.Dir, name))
		}
		unlinkMeta(name) // open closed meta: its Unlink would find no file
	}
	return l, err
}

// unlinkMeta removes the meta segment of log name.
func unlinkMeta(name string) {
	if s, err := shm.OpenSegment(metaName(name)); err == nil {
		s.Unlink()
		s.Close()
	}
}

// writeConfig writes c to a new meta segment.
func writeConfig(meta *shm.Segment, c Config) {
	for i, v := range []uint64{uint64(c.Partitions), uint64(c.SegmentSize), uint64(c.Segments), uint64(c.Full),
		uint64(c.Flush), uint64(c.FlushPeriod), uint64(c.MaxAge)} {
		w, _ := meta.Uint64At(offParts + 8*i)
		w.Store(v)
	}
	if c.Recycle {
		w, _ := meta.Uint64At(offRecycle)
		w.Store(1)
	}
	n, _ := meta.Uint64At(offDir)
	n.Store(uint64(len(c.Dir)))
	meta.WriteAt([]byte(c.Dir), offDir+8)
}

// publish writes a new meta segment's magic, last: Open waits for it.
func publish(meta *shm.Segment) {
	magic, _ := meta.Uint64At(offMagic)
	magic.Store(metaMagic)
	// The magic's low half is the word an Open racing the creation sleeps on.
	ready, _ := meta.Uint32At(offMagic)
	shm.Wake(ready)
}

// Open opens the existing log name.
func Open(name string) (*Log, error) {
	meta, err := shm.OpenSegment(metaName(name))
	if err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", name, err)
	}
	return open(name, meta, nil)
}

// open opens the log whose meta segment is meta; lock, if not nil, is the
// configuration file of a file-backed log, already locked (it is opened
// and locked here otherwise).
func open(name string, meta *shm.Segment, lock *os.File) (*Log, error) {
	fail := func(err error) (*Log, error) {
		meta.Close()
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	if meta.Size() < metaSize {
		return fail(fmt.Errorf("mq: %s: meta segment of %d bytes: %w", name, meta.Size(), shm.ErrCorrupt))
	}
	word := func(off int) *atomic.Uint64 { w, _ := meta.Uint64At(off); return w }
	word32 := func(off int) *atomic.Uint32 { w, _ := meta.Uint32At(off); return w }
	words := func(off, n int) []atomic.Uint64 { w, _ := meta.Uint64s(off, n); return w }
	// A log being created this moment gets its magic last: wait a second
	// at most for it, asleep on the magic's low half (Create wakes it).
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	err := shm.Wait{}.Until(ctx, word32(offMagic), func(uint32) bool { return word(offMagic).Load() == metaMagic })
	cancel()
	if err != nil {
		return fail(fmt.Errorf("mq: %s is not a log (bad magic): %w", name, shm.ErrCorrupt))
	}
	c := Config{
		Partitions:  int(min(word(offParts).Load(), 1<<20)),
		SegmentSize: int(min(word(offSegSize).Load(), 1<<40)),
		Segments:    int(min(word(offSegments).Load(), 1<<20)),
		Full:        FullPolicy(min(word(offPolicy).Load(), 255)),
		Flush:       FlushPolicy(min(word(offFlush).Load(), 255)),
		FlushPeriod: time.Duration(min(word(offPeriod).Load(), 1<<62)),
		MaxAge:      time.Duration(min(word(offMaxAge).Load(), 1<<62)),
		Recycle:     word(offRecycle).Load() != 0,
	}
	if n := word(offDir).Load(); n > 0 && n <= maxDir {
		dir := make([]byte, n)
		meta.ReadAt(dir, offDir+8)
		c.Dir = string(dir)
	} else if n != 0 {
		return fail(fmt.Errorf("mq: %s: directory of %d bytes: %w", name, n, shm.ErrCorrupt))
	}
	if d, err := c.withDefaults(); err != nil || c.Partitions == 0 || c.SegmentSize == 0 || c.Segments == 0 ||
		d.FlushPeriod != c.FlushPeriod {
		return fail(fmt.Errorf("mq: %s: configuration %+v: %w", name, c, shm.ErrCorrupt))
	}
	if c.Dir != "" && lock == nil {
		var err error
		if lock, err = lockDir(name, c.Dir); err != nil {
			return fail(err)
		}
	}
	slots, _ := meta.Uint64s(offProducers, 2*maxProducers)
	l := &Log{name: name, cfg: c, meta: meta, slots: slots, dirLock: lock}
	me := shm.Self().Word()
	for i := range maxProducers {
		o := &slots[2*i]
		for {
			w := o.Load()
			if w != 0 && shm.AliveWord(w) {
				break
			}
			if o.CompareAndSwap(w, me) {
				l.owner, l.slot = o, uint64(i)
				l.gen = slots[2*i+1].Add(1) & 0xffff
				break
			}
		}
		if l.owner != nil {
			break
		}
	}
	if l.owner == nil {
		return fail(fmt.Errorf("mq: %s: %d producers: %w", name, maxProducers, ErrNoSlot))
	}
	for p := range c.Partitions {
		base := offParts0 + p*partStride
		l.parts = append(l.parts, &partition{
			tail: word(base), head: word(base + line), aborted: word(base + line + 8), made: word(base + line + 16),
			torn: word(base + line + 24), synced: word(base + line + 32),
			seq: word32(base + 2*line), sleepers: word32(base + 2*line + 4),
			freed: word32(base + 2*line + 8), blocked: word32(base + 2*line + 12),
			reused: word(base + 2*line + 16),
			anySeq: word32(offAnySeq), anySleepers: word32(offAnySleepers),
			padEnds: words(base+offPadEnds, padRing),
			segs:    map[uint64]*mapped{},
			reads:   make([]*mapped, 2),
			maps:    mapsFor(c),
		})
		l.parts[p].readLow.Store(^uint64(0))
	}
	l.startJanitor()
	return l, nil
}

// Remove deletes log name: its meta segment and every segment of its
// partitions. Processes that have it open keep their mappings.
func Remove(name string) error {
	l, err := Open(name)
	if err != nil {
		return err
	}
	var errs []error
	for p, pt := range l.parts {
		// No more than Segments are made beyond the head; a larger
		// count is corrupt and bounds nothing.
		head := pt.head.Load()
		for k := head; k < pt.made.Load() && k <= head+uint64(l.cfg.Segments); k++ {
			errs = append(errs, l.removeSeg(p, k))
		}
	}
	if l.cfg.Dir != "" {
		errs = append(errs, os.Remove(configPath(l.cfg.Dir, name)))
	} else {
		for p := range l.parts {
			errs = append(errs, removeSpares(name, p))
		}
	}
	errs = append(errs, l.meta.Unlink(), l.Close())
	return errors.Join(errs...)
}

// Name returns the log's name.
func (l *Log) Name() string { return l.name }

// Config returns the log's configuration (as read from shared memory).
func (l *Log) Config() Config { return l.cfg }

// Close gives up the producer slot and unmaps the log. Loans and records
// of this handle must not be used after it; its Readers must be closed
// first.
func (l *Log) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	var errs []error
	errs = append(errs, l.stopJanitor())
	l.owner.CompareAndSwap(shm.Self().Word(), 0)
	for _, pt := range l.parts {
		pt.mu.Lock()
		for _, m := range pt.segs {
			m.release()
		}
		pt.segs = nil
		pt.cur.Store(nil)
		pt.mu.Unlock()
		pt.readMu.Lock()
		for _, m := range pt.reads {
			if m != nil {
				m.release()
			}
		}
		pt.reads = nil
		pt.readMu.Unlock()
	}
	l.unmapping.Wait()
	for _, pt := range l.parts {
		if pt.maps != nil {
			errs = append(errs, pt.maps.Close())
		}
	}
	errs = append(errs, l.meta.Close())
	if l.dirLock != nil {
		errs = append(errs, l.dirLock.Close())
	}
	return errors.Join(errs...)
}

func (l *Log) part(p int) (*partition, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if p < 0 || p >= len(l.parts) {
		return nil, fmt.Errorf("mq: partition %d of %d", p, len(l.parts))
	}
	return l.parts[p], nil
}

// segment returns segment k of partition p mapped, with a reference the
// caller releases, creating it if create (a producer about to write its
// first record in it). It does not check retention: see ensureRoom.
func (l *Log) segment(p int, pt *partition, k uint64, create bool) (*mapped, error) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	// A second for a segment being made to appear, counting the wait
	// for this handle's own maker.
	deadline := time.Now().Add(time.Second)
	if create {
		awaitAhead(pt, k, deadline)
	}
	if pt.segs == nil {
		return nil, ErrClosed
	}
	if create && k < pt.head.Load() {
		// Dropped: the caller's view of the tail is stale. Its file may
		// still be there (the producer that dropped it is removing it),
		// but nothing goes there any more.
		return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, ErrOffsetGone)
	}
	if m := pt.segs[k]; m != nil {
		m.acquire() // the cache's reference keeps it mapped
		if create {
			l.entered(p, pt, m) // it may have been made ahead
		}
		return m, nil
	}
	size := l.cfg.SegmentSize
	// Segments are made in order, each once: made counts them, and the
	// producer that moves it from k to k+1 creates segment k. A segment
	// is never made again after retention dropped it, so a producer that
	// read the tail long ago cannot claim a header in a fresh copy of
	// one that readers have left behind.
	var seg *shm.Segment
	var err error
	madeHere := false
	takeovers := 0
	for ; ; time.Sleep(time.Millisecond) {
		mk := pt.made.Load()
		if create && mk == k && pt.made.CompareAndSwap(k, k+1) {
			seg, err = l.createSeg(p, pt, k)
			if errors.Is(err, os.ErrExist) {
				// Made meanwhile by a producer that took us for dead
				// (takeOver): open it, as any other producer does.
				continue
			}
			madeHere = true
			break
		}
		if create && mk < k {
			// The tail is in a segment nobody made: not from this code.
			return nil, fmt.Errorf("mq: partition %d: segment %d wanted, %d made: %w", p, k, mk, shm.ErrCorrupt)
		}
		seg, err = l.openSeg(p, k)
		// A segment its creator is making this moment is missing or not
		// yet sized (shm says corrupt): wait for it, creating or reading.
		making := (errors.Is(err, os.ErrNotExist) || errors.Is(err, shm.ErrCorrupt)) && k < pt.made.Load()
		if making && create && k >= pt.head.Load() && time.Now().After(deadline) && takeovers < 3 {
			// Made, and for a second not there: its maker died (or is
			// that slow). Made here instead, unless it is there now
			// or its maker is still at it: then wait again.
			takeovers++
			seg, err = l.takeOver(p, pt, k)
			if errors.Is(err, os.ErrExist) || errors.Is(err, shm.ErrLocked) {
				deadline = time.Now().Add(time.Second)
				continue
			}
			madeHere = err == nil
			break
		}
		if err == nil || (!create && !making) || k < pt.head.Load() || time.Now().After(deadline) {
			// Below the head it was dropped: the caller's view of the
			// tail is stale (retrying for a second here, under the lock,
			// stalled every producer of the handle).
			break
		}
		// Its creator is making it this moment.
	}
	if err != nil {
		if f := pt.aheadFail.Load(); f != nil && f.k == k {
			return nil, fmt.Errorf("mq: making segment %d of partition %d: %w", k, p, f.err)
		}
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, ErrOffsetGone)
		}
		return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, err)
	}
	if seg.Size() < size {
		seg.Close()
		return nil, fmt.Errorf("mq: segment %d of partition %d has %d bytes, want %d: %w", k, p, seg.Size(), size, shm.ErrCorrupt)
	}
	if err := l.syncMade(seg, !create || madeHere); err != nil {
		seg.Close()
		return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, err)
	}
	words, err := seg.Uint64s(0, size/8)
	if err != nil {
		seg.Close()
		return nil, err
	}
	m := &mapped{index: k, seg: seg, words: words, data: seg.Data()[:size:size], maps: pt.maps}
	m.refs.Store(2) // the cache's and the caller's
	pt.segs[k] = m
	if create {
		l.entered(p, pt, m)
	} else if c := pt.cur.Load(); c == nil || c.index < k {
		pt.cur.Store(m)
	}
	return m, nil
}

// entered is what a producer does, under pt.mu, when it maps segment m to
// write in: m becomes the producers' fast path, the cache lets go of
// segments two behind it (loans in them keep them mapped until they end),
// and the next segment is made ahead.
func (l *Log) entered(p int, pt *partition, m *mapped) {
	if c := pt.cur.Load(); c != nil && c.index >= m.index {
		return
	}
	pt.cur.Store(m)
	// A segment made ahead has no birth yet: it is born when the tail
	// enters it (age retention reads it as the time the segment before
	// it got its newest record; see birth).
	l.bornNow(m)
	for i, old := range pt.segs {
		if i+1 < m.index {
			delete(pt.segs, i)
			l.releaseLater(old)
		}
	}
	l.makeAhead(p, pt, m.index+1)
}

// makeAhead makes segment k of partition p in the background, if nobody
// has made it yet, and puts it in the handle's cache: the producer that reaches
// it finds it mapped, and the readers that follow open a segment that
// exists. Made in the producer's path, an 8 MiB
// segment with its pages faulted in (MAP_POPULATE) took 6 ms, in which
// the partition's records waited; without MAP_POPULATE the faults, one per
// 4 KiB, each waited up to a millisecond whenever another thread of the
// process was unmapping a segment (both take the process's mmap lock).
// One goroutine per partition and handle at most; a segment made ahead is
// made exactly once, like any other (the made count).
//
// Made ahead, a segment's pages are not faulted in at once (no
// MAP_POPULATE): that took this goroutine's thread about 4 ms per 8 MiB,
// a third runnable thread on two vCPUs that stalled a spinning producer
// or consumer as long (log-100B-p99 3.3-4.0 ms with it, 0.5-1.4 ms
// without; log-100B 8.7-10.1M msg/s with it, 9.7-10.7M without, in
// alternating runs). They are faulted in a little at a time as they are
// first touched: by a reader's openAhead, which touches each page of the
// next segment in the background, or by the producer. A segment made of a
// spare (Config.Recycle) is the exception: zeroing it faults its pages in
// here, which fresh memory would have cost as they were touched, and
// more (allocating and zeroing each page, and freeing it later).
//
// A full partition (Segments segments from the head) makes the next one
// all the same: the segment made ahead holds no records, and entering it
// drops the head as before, so the partition's records stay within
// retention while its memory is at most Segments+1 segments (what Remove
// looks for). Made only while the partition had room, as at first, a
// log in its steady state (always full) made every segment in the
// producer's path: 52% of log-100B's producer profile.
//
// Logs backed by files (Config.Dir) make their segments in the
// producer's path, as they need: a producer making segment k writes
// segment k-1 to disk in full first, and reopening a log after a crash
// finds the tail in its newest segment file.
func (l *Log) makeAhead(p int, pt *partition, k uint64) {
	if l.cfg.Dir != "" || pt.made.Load() != k || k > pt.head.Load()+uint64(l.cfg.Segments) || pt.ahead.Swap(true) {
		return
	}
	job := &aheadJob{k: k, done: make(chan struct{})}
	pt.aheadJob = job  // entered holds pt.mu
	l.unmapping.Add(1) // Close waits for it
	go func() {
		defer l.unmapping.Done()
		var m *mapped // what it made, for the cache
		defer func() {
			// All in one critical section: a producer that finds the
			// segment in the cache finds the goroutine done too, so
			// entering it makes the next one ahead.
			pt.mu.Lock()
			defer pt.mu.Unlock()
			if m != nil {
				if pt.segs == nil || pt.segs[k] != nil {
					// Closed, or a producer opened it meanwhile.
					m.release()
				} else {
					pt.segs[k] = m
					if f := testMadeAhead.Load(); f != nil {
						(*f)(m)
					}
				}
			}
			if pt.aheadJob == job {
				pt.aheadJob = nil
			}
			pt.ahead.Store(false)
			close(job.done)
		}()
		if !pt.made.CompareAndSwap(k, k+1) {
			return
		}
		if f := testSegClaimed.Load(); f != nil {
			(*f)(l, p, k)
		}
		size := l.cfg.SegmentSize
		// Its birth stays 0 until the tail enters it (entered).
		seg, err := l.newSeg(p, k, false)
		if err != nil {
			// Given back: the producer that reaches segment k makes it
			// in its path (and if that fails too, says why; this error
			// is for a producer that finds it missing all the same).
			// ErrExist stays made: a producer that took this maker for
			// dead made it (takeOver), and the producers open it; or
			// something else is in the way, which this error names.
			pt.aheadFail.Store(&aheadFailure{k, err})
			unmake(pt, k, err)
			return
		}
		words, err := seg.Uint64s(0, size/8)
		if err != nil {
			// The segment is there: a producer that reaches it opens it.
			seg.Close()
			return
		}
		m = &mapped{index: k, seg: seg, words: words, data: seg.Data()[:size:size], maps: pt.maps}
		m.refs.Store(1) // the cache's
	}()
}

// awaitAhead waits, pt.mu unlocked meanwhile, for this handle's goroutine
// making segment k ahead, if there is one, until deadline. Its
// mapping of a segment made of a spare has the pages faulted in (by the
// zeroing), where a producer that opened the segment itself, once it
// existed, wrote into a mapping of its own, faulting on each page (about
// half the pages of a 1 MiB-payload offload store's producer took a
// fault); and the producer entering the segment after the goroutine
// ended makes the next one ahead, where one entering it meanwhile found
// the goroutine busy and made the next in its own path.
func awaitAhead(pt *partition, k uint64, deadline time.Time) {
	j := pt.aheadJob
	if j == nil || j.k != k || pt.segs[k] != nil {
		return
	}
	pt.mu.Unlock()
	if f := testAwaitAhead.Load(); f != nil {
		(*f)(pt, k)
	}
	t := time.NewTimer(time.Until(deadline))
	select {
	case <-j.done:
	case <-t.C: // stuck: the producer goes on as without it, at once
	}
	t.Stop()
	pt.mu.Lock()
}

// testAwaitAhead and testMadeAhead, if set, are called by a producer
// about to wait for the segment being made ahead (awaitAhead) and by the
// goroutine making it once it is in the cache.
var (
	testAwaitAhead atomic.Pointer[func(pt *partition, k uint64)]
	testMadeAhead  atomic.Pointer[func(m *mapped)]
)

// testSegClaimed, if set, is called by a maker of a segment in /dev/shm
// (createSeg, makeAhead) just after it counted the segment as made and
// before it creates it: tests kill a maker there.
var testSegClaimed atomic.Pointer[func(l *Log, p int, k uint64)]

// ensureRoom makes sure partition p may have segment k, dropping the
// oldest segments as retention allows, and waiting or failing by policy.
func (l *Log) ensureRoom(ctx context.Context, p int, pt *partition, k uint64) error {
	keep := uint64(l.cfg.Segments)
	l.expire(p, pt)
	for {
		h := pt.head.Load()
		if k < h+keep {
			return nil
		}
		newHead := k - keep + 1
		if l.cfg.Full != FullOverwrite {
			if need, ok := l.oldestNeeded(p); ok && need < newHead {
				if l.cfg.Full == FullFail {
					return fmt.Errorf("mq: partition %d of %s: %w", p, l.name, ErrFull)
				}
				if err := l.waitFreed(ctx, pt, func() bool {
					n, ok := l.oldestNeeded(p)
					return !ok || n >= newHead || pt.head.Load() >= newHead
				}); err != nil {
					return err
				}
				continue
			}
		}
		if pt.head.CompareAndSwap(h, newHead) {
			l.removeSegs(p, h, newHead)
			return nil
		}
	}
}

// removeSegs removes segments [from, to) of partition p, which retention
// dropped, in the producer's path. Removing them in another goroutine
// (giving 8 MiB of pages back took several hundred µs) was tried: removals
// fell behind a fast producer (29 segments of a Segments-2 partition in
// /dev/shm at once), and a process killed with removals pending left
// segments behind the head that Remove never looks at, which a log made
// again under the same name then read as its own.
//
// Under Config.Recycle a dropped segment that no process has mapped
// becomes one of the partition's spares instead (a rename, which
// openers of the old name see as the segment gone); newSeg makes the
// next segment of it.
func (l *Log) removeSegs(p int, from, to uint64) {
	for i := from; i < to; i++ {
		if !l.cfg.Recycle || !l.spare(p, i) {
			l.removeSeg(p, i)
		}
	}
}

// spare makes dropped segment k of partition p a spare, if nobody has it
// mapped and a spare's place is free.
func (l *Log) spare(p int, k uint64) bool {
	for j := range spares {
		s, err := shm.RenameSegment(segName(l.name, p, k), spareName(l.name, p, j))
		if err == nil {
			s.Close()
			return true
		}
		if !errors.Is(err, os.ErrExist) {
			return false // in use (or gone): removed, as without Recycle
		}
	}
	return false
}

// newSeg creates segment k of partition p in /dev/shm, for its maker (the
// made count says who): under Config.Recycle from one of the partition's spares,
// zeroed, if there is one that nobody holds, else anew (with its pages
// faulted in at once if populate). Its errors are shm.CreateSegment's.
func (l *Log) newSeg(p int, k uint64, populate bool) (*shm.Segment, error) {
	name, size := segName(l.name, p, k), l.cfg.SegmentSize+trailer
	for j := 0; l.cfg.Recycle && j < spares; j++ {
		s, err := l.parts[p].maps.ReuseSegment(spareName(l.name, p, j), name, size)
		if err == nil {
			l.parts[p].reused.Add(1)
			return s, nil
		}
		if errors.Is(err, os.ErrExist) {
			// Something is at the segment's name: made by a producer
			// that took this maker for dead (takeOver), or another
			// user's file in the way. CreateSegment tells them apart
			// (os.ErrExist for the first, a file of its own for the
			// second), as without Recycle.
			break
		}
	}
	return shm.CreateSegment(name, size, &shm.SegmentConfig{Keep: true, Populate: populate})
}

// mapsFor is a partition's MapCache for a log of configuration c: under
// Recycle in /dev/shm, room for the mappings of a whole cycle of its
// files twice (its segments, its spares and the one made ahead, for a
// process that produces and reads: the producers' and the readers'
// mappings are their own), so that a segment made of a spare, or a
// reader opening one, finds the mapping this process had of the file
// before; nil otherwise (a file that is not reused would only be kept
// in memory by its idle mapping), and nil for a log whose partitions
// would get room for less than a cycle (many partitions or segments:
// a handle keeps at most maxIdle idle mappings, each holding a
// descriptor).
//
// Mapped anew, an 8 MiB segment's page tables cost a process about 1.4
// ms to fill (by faults or MADV_POPULATE_WRITE) and 0.8 ms to tear down
// here, each time a partition rolls to a new segment, in a producer's
// process and in every reader's: a third thread on two vCPUs where a
// producer and a consumer spin, which stalled them that long.
func mapsFor(c Config) *shm.MapCache {
	if !c.Recycle || c.Dir != "" {
		return nil
	}
	cycle := c.Segments + spares + 1
	n := min(2*cycle+2, maxIdle/c.Partitions, maxIdlePart)
	if n < cycle+1 {
		// Less than a cycle: a file comes back after the cache let go
		// of its mapping, and the cache would only hold descriptors.
		return nil
	}
	return shm.NewMapCache(n)
}

// maxIdle bounds the idle mappings (and their descriptors) a handle
// keeps over its partitions, and maxIdlePart a partition's (each
// release into the cache looks at every idle file: fstat, about 0.5 µs
// each).
const (
	maxIdle     = 1024
	maxIdlePart = 128
)

// removeSpares removes the spare segments of partition p of log name
// (Config.Recycle).
func removeSpares(name string, p int) error {
	var errs []error
	for j := range spares {
		errs = append(errs, removeShm(spareName(name, p, j)))
	}
	return errors.Join(errs...)
}

// waitFreed waits until ready, woken by readers that move to a new
// segment.
func (l *Log) waitFreed(ctx context.Context, pt *partition, ready func() bool) error {
	for !ready() {
		// After a sleep, look again even if nobody woke us: a reader may
		// have died.
		if err := park(ctx, pt.freed, pt.blocked, ready); err != nil {
			return err
		}
	}
	return nil
}

// oldestNeeded returns the oldest segment a live reader of partition p is
// in, of those retention has not dropped: a reader in a dropped segment
// (age retention does not wait for readers) can never read there again,
// and holding producers for it would hold them for good.
func (l *Log) oldestNeeded(p int) (uint64, bool) {
	var oldest uint64
	found := false
	size := uint64(l.cfg.SegmentSize)
	head := l.parts[p].head.Load()
	for i := range maxReaders {
		base := offReaders + i*line
		owner, _ := l.meta.Uint64At(base)
		w := owner.Load()
		if w == 0 {
			continue
		}
		part, _ := l.meta.Uint64At(base + 8)
		off, _ := l.meta.Uint64At(base + 16)
		if part.Load() != uint64(p) {
			continue
		}
		o := off.Load()
		if !shm.AliveWord(w) {
			owner.CompareAndSwap(w, 0)
			continue
		}
		if k := o / size; k >= head && (!found || k < oldest) {
			oldest, found = k, true
		}
	}
	return oldest, found
}

// Reservation is space loaned in a partition: fill Bytes, then Commit or
// Abort it, once (it keeps its segment mapped until then; Bytes must not
// be used after). It is a record that readers wait for, so hold it
// briefly.
type Reservation struct {
	l      *Log
	pt     *partition
	m      *mapped
	at     uint64 // offset in the segment
	offset uint64 // log offset
	buf    []byte
	state  uint64 // the state word as claimed
}

// Bytes is the loaned payload space, in shared memory.
func (r Reservation) Bytes() []byte { return r.buf }

// Offset is the record's log offset.
func (r Reservation) Offset() uint64 { return r.offset }

// Commit publishes the record. It fails with ErrAborted if a reader
// took this process for dead and aborted the record. Under FlushEverySend
// it returns once the record is on disk (or with the error that kept it
// from getting there: the record is published anyway).
func (r Reservation) Commit() error {
	_, err := r.CommitSum()
	return err
}

// CommitSum is Commit that also returns the payload's CRC-32C it
// published (what Record.CRC says when the record is read), for a caller
// that needs the checksum too (an offload reference) without summing the
// payload a second time.
func (r Reservation) CommitSum() (uint32, error) {
	if r.l == nil {
		return 0, ErrAborted
	}
	return r.commit(crc32.Checksum(r.buf, castagnoli))
}

// CommitCopy copies src, which must be as long as the reservation, into
// it and commits it, as CommitSum: in 64 KiB pieces, each summed just
// after its copy while it is in the cache, where a copy into Bytes and
// CommitSum read the payload twice. The sum is of src, this process's
// own bytes: a hostile process changing the shared copy meanwhile makes
// the record fail its checksum, never carry it. It returns the CRC-32C
// published. A src of another length gives the reservation up (Abort)
// and an error. Whatever it returns, the reservation is used up:
// neither Commit nor Abort it after.
func (r Reservation) CommitCopy(src []byte) (uint32, error) {
	if r.l == nil {
		return 0, ErrAborted
	}
	if len(src) != len(r.buf) {
		r.Abort()
		return 0, fmt.Errorf("mq: %d bytes to commit into a reservation of %d", len(src), len(r.buf))
	}
	return r.commit(copySum(r.buf, src, src))
}

// copySum copies src into dst (as long) and returns the CRC-32C of sum,
// which is one of the two (the caller's private side), a 64 KiB piece at
// a time right after each piece's copy.
func copySum(dst, src, sum []byte) uint32 {
	const piece = 64 << 10
	var crc uint32
	for i := 0; i < len(dst); i += piece {
		j := min(i+piece, len(dst))
		copy(dst[i:j], src[i:j])
		if f := testCopied.Load(); f != nil {
			(*f)(i, j)
		}
		crc = crc32.Update(crc, castagnoli, sum[i:j])
	}
	return crc
}

// testCopied, if set, is called by copySum between a piece's copy and its
// sum: tests change the shared side there.
var testCopied atomic.Pointer[func(from, to int)]

// commit publishes the reservation with checksum crc.
func (r Reservation) commit(crc uint32) (uint32, error) {
	err := r.l.publish(r.pt, r.m, r.at, r.state, r.state&^stateMask|stateCommitted, uint64(crc)|r.offset<<32, r.at+headerSize+uint64(len(r.buf)))
	if err == ErrAborted {
		return 0, err
	}
	return crc, err
}

// Abort gives the space up: readers skip the record.
func (r Reservation) Abort() {
	if r.l != nil {
		abandon(r.pt, r.m, r.at, r.state)
	}
}

// publish turns the claim at offset at of segment m (its header word
// claim) into the committed header h with second word w1, wakes the
// readers, writes [at, end) to disk under FlushEverySend, and lets go of
// the segment: a Reservation's or a Batch's Commit. It fails with
// ErrAborted if a reader aborted the claim.
func (l *Log) publish(pt *partition, m *mapped, at, claim, h, w1, end uint64) error {
	m.words[at/8+1].Store(w1)
	if !m.words[at/8].CompareAndSwap(claim, h) {
		m.release()
		return ErrAborted
	}
	pt.wakeReaders()
	var err error
	if l.cfg.Flush == FlushEverySend {
		err = l.flushRecord(pt, m, at, end)
	}
	m.release()
	return err
}

// abandon aborts the claim at offset at of segment m (its header word
// claim), lets go of the segment and wakes the readers, who skip it.
func abandon(pt *partition, m *mapped, at, claim uint64) {
	m.words[at/8].CompareAndSwap(claim, claim|stateAborted)
	m.release()
	pt.wakeReaders()
}

// wakeReaders wakes the readers asleep on the partition, if any, and the
// waiters on any partition of the log (one load when there are none).
func (pt *partition) wakeReaders() {
	wake(pt.seq, pt.sleepers)
	wake(pt.anySeq, pt.anySleepers)
}

// Loan reserves n bytes of payload at the tail of partition p. Producers of
// every process append concurrently: each claims the header at the tail by
// CAS and then moves the tail on (or helps a claimer that has not). A full
// partition waits or fails by Config.Full; ctx bounds the wait.
func (l *Log) Loan(ctx context.Context, p, n int) (Reservation, error) {
	pt, err := l.part(p)
	if err != nil {
		return Reservation{}, err
	}
	m, t, at, _, claim, err := l.claim(ctx, p, pt, n, 1)
	if err != nil {
		return Reservation{}, err
	}
	end := at + headerSize + uint64(n)
	return Reservation{l: l, pt: pt, m: m, at: at, offset: t, buf: m.data[at+headerSize : end : end], state: claim}, nil
}

// claim claims the header at the tail of partition p for up to count
// records of n bytes each, as many as fit in the rest of the tail's
// segment (at least one), and moves the tail past them. Producers of
// every process append concurrently: each claims the header at the tail
// by CAS and then moves the tail on (or helps a claimer that has not).
// The claim's length is n for one record; for more, their space but the
// first header, so that a reader that aborts the claim skips them all.
// It returns the segment (with a reference), the claim's log offset,
// offset in the segment, record count and header word.
func (l *Log) claim(ctx context.Context, p int, pt *partition, n, count int) (m *mapped, t, at, c, claim uint64, err error) {
	size := uint64(l.cfg.SegmentSize)
	if n < 0 || uint64(n) > size-headerSize {
		return nil, 0, 0, 0, 0, fmt.Errorf("mq: %d bytes in a %d-byte segment: %w", n, size, ErrTooLarge)
	}
	stride := align8(headerSize + uint64(n))
	for {
		t = pt.tail.Load()
		k := t / size
		at = t % size
		if size-at < headerSize {
			pt.tail.CompareAndSwap(t, (k+1)*size)
			continue
		}
		m, err = l.segmentFor(ctx, p, pt, k)
		if err != nil {
			if errors.Is(err, ErrOffsetGone) && pt.tail.Load()/size > k {
				continue // t was stale: retention dropped its segment since
			}
			return nil, 0, 0, 0, 0, err
		}
		hw := &m.words[at/8]
		if fit := (size - at) / stride; fit == 0 {
			// No room in this segment: fill it with a committed pad.
			pad := (size-at-headerSize)<<32 | flagPad | stateCommitted
			if hw.CompareAndSwap(0, pad) {
				pt.padEnds[k%padRing].Store(t)
				m.release()
				pt.tail.CompareAndSwap(t, (k+1)*size)
				pt.wakeReaders()
				continue
			}
		} else {
			c = min(uint64(count), fit)
			length := uint64(n)
			if c > 1 {
				length = c*stride - headerSize
			}
			claim = length<<32 | l.gen<<16 | l.slot<<4 | stateWriting
			if hw.CompareAndSwap(0, claim) {
				pt.tail.CompareAndSwap(t, t+c*stride)
				return m, t, at, c, claim, nil
			}
		}
		// Another producer claimed the header at t: help it move the tail.
		w := hw.Load()
		m.release()
		rl := align8(headerSize + w>>32)
		if at+rl > size {
			return nil, 0, 0, 0, 0, fmt.Errorf("mq: header at %d of partition %d says %d bytes: %w", t, p, w>>32, shm.ErrCorrupt)
		}
		pt.tail.CompareAndSwap(t, t+rl)
	}
}

// onlyPadding reports whether the records of partition p from log offset
// from up to to, which retention dropped, were padding alone: from is
// the padding (or the few bytes too short for a header) that ends its
// segment, and to the start of the next. A consumer group whose next
// offset was there lost nothing. It says false when it cannot tell.
func (l *Log) onlyPadding(p int, from, to uint64) bool {
	size := uint64(l.cfg.SegmentSize)
	k := from / size
	if p < 0 || p >= len(l.parts) || to != (k+1)*size {
		return false
	}
	return size-from%size < headerSize || l.parts[p].padEnds[k%padRing].Load() == from
}

// segmentFor is segment k mapped for a producer, with a reference, after
// the retention and full checks.
func (l *Log) segmentFor(ctx context.Context, p int, pt *partition, k uint64) (*mapped, error) {
	if m := pt.cur.Load(); m != nil && m.index == k && m.acquire() {
		return m, nil
	}
	if err := l.ensureRoom(ctx, p, pt, k); err != nil {
		return nil, err
	}
	return l.segment(p, pt, k, true)
}

// Send appends payload to partition p as one record (Loan, copy, Commit)
// and returns its log offset.
func (l *Log) Send(ctx context.Context, p int, payload []byte) (uint64, error) {
	r, err := l.Loan(ctx, p, len(payload))
	if err != nil {
		return 0, err
	}
	copy(r.buf, payload)
	return r.offset, r.Commit()
}

// Stats is a partition's counters, read from shared memory.
type Stats struct {
	// Tail is the log offset the next record goes to.
	Tail uint64
	// Oldest is the first log offset retention keeps.
	Oldest uint64
	// Aborted counts records readers found stuck in writing with their
	// writer dead, and aborted (reopening a file-backed log counts those
	// it finds so too).
	Aborted uint64
	// Torn counts records that reopening a file-backed log found torn
	// (a machine crash lost part of them) and aborted: see docs/mq.md,
	// "Durability".
	Torn uint64
	// Reused counts the segments made of a segment retention dropped
	// (Config.Recycle), rather than of fresh memory.
	Reused uint64
}

// Stats returns partition p's counters.
func (l *Log) Stats(p int) (Stats, error) {
	pt, err := l.part(p)
	if err != nil {
		return Stats{}, err
	}
	return Stats{Tail: pt.tail.Load(), Oldest: pt.head.Load() * uint64(l.cfg.SegmentSize), Aborted: pt.aborted.Load(), Torn: pt.torn.Load(), Reused: pt.reused.Load()}, nil
}

// bornNow stamps segment m's birth with now, unless it has one.
func (l *Log) bornNow(m *mapped) {
	if w, err := m.seg.Uint64At(l.cfg.SegmentSize); err == nil && w.Load() == 0 {
		w.CompareAndSwap(0, uint64(l.now().UnixNano()))
	}
}

// setBirthAt sets segment m's birth (0: none yet).
func (l *Log) setBirthAt(m *mapped, ns uint64) {
	if w, err := m.seg.Uint64At(l.cfg.SegmentSize); err == nil {
		w.Store(ns)
	}
}

// rebase starts the empty partition p (its tail at its head: no record)
// at log offset base, a segment boundary: a follower's partition starts
// where the leader's replication does, so that offsets are the same on
// both sides. The segments it had (empty, made ahead of a first record)
// are removed. Nobody may use the partition meanwhile.
func (l *Log) rebase(p int, base uint64) error {
	pt, err := l.part(p)
	if err != nil {
		return err
	}
	size := uint64(l.cfg.SegmentSize)
	k := base / size
	if base%size != 0 {
		return fmt.Errorf("mq: partition %d cannot start at %d, within a segment: %w", p, base, ErrDiverged)
	}
	// No segment is being made ahead meanwhile (one made for an earlier
	// base would be left behind the new head): take the flag makeAhead
	// takes, waiting for one under way (it needs pt.mu at its end).
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(5 * time.Second); !pt.ahead.CompareAndSwap(false, true); <-tick.C {
		if time.Now().After(deadline) {
			return fmt.Errorf("mq: partition %d: a segment being made ahead for 5 s", p)
		}
	}
	defer pt.ahead.Store(false)
	pt.mu.Lock()
	defer pt.mu.Unlock()
	h, t := pt.head.Load(), pt.tail.Load()
	if t != h*size {
		return fmt.Errorf("mq: partition %d is not empty (%d to %d): %w", p, h*size, t, ErrDiverged)
	}
	if h == k {
		return nil
	}
	// The tail first (a producer that claims at the old tail meanwhile
	// fails the CAS below), then the head and the count of segments made.
	if !pt.tail.CompareAndSwap(t, base) {
		return fmt.Errorf("mq: partition %d is in use: %w", p, ErrDiverged)
	}
	pt.head.Store(k)
	for i := range pt.padEnds { // they described segments of the old base
		pt.padEnds[i].Store(0)
	}
	made := pt.made.Swap(k)
	for i, m := range pt.segs {
		delete(pt.segs, i)
		l.releaseLater(m)
	}
	pt.cur.Store(nil)
	// Random reads' mappings too: a segment of the old numbering may
	// have the index of one the new base will make.
	pt.readMu.Lock()
	l.dropReads(pt, ^uint64(0))
	pt.readMu.Unlock()
	for i := h; i < made; i++ {
		l.removeSeg(p, i)
	}
	return nil
}
