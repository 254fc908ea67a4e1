package mq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// FlushPolicy says when a file-backed log (Config.Dir) writes its records
// to disk. Whatever the policy, a record is in the page cache once its
// Commit (or Send) returns, so it survives the death of every process; the
// policy is about a crash of the machine (docs/mq.md, "Durability").
type FlushPolicy uint8

const (
	// FlushNone leaves writing to the kernel's writeback: a machine crash
	// loses what it had not written yet (typically up to 30 s).
	FlushNone FlushPolicy = iota
	// FlushInterval writes every Config.FlushPeriod, from a goroutine of
	// each Log handle, the segments that handle has been writing, and
	// writes a segment in full when producers move on from it. A machine
	// crash loses at most about one period of records.
	FlushInterval
	// FlushEverySend writes each record's bytes, and the headers of the
	// records before it, before its Commit or Send returns (msync): a
	// record whose Send returned survives a crash of the machine.
	FlushEverySend
)

const (
	maxDir        = 1024 // bytes of Config.Dir
	defaultPeriod = 100 * time.Millisecond
	trailer       = 8 // after a segment's record area: the segment's birth (ns)

	confMagic = 0x31524944_2d514d75 // "uMQ-DIR1", little endian
	confWords = 7
	confSize  = 8 + 8*confWords + 8
)

func (c Config) durableDefaults() (Config, error) {
	if c.Flush == FlushInterval && c.FlushPeriod == 0 {
		c.FlushPeriod = defaultPeriod
	}
	switch {
	case c.Flush > FlushEverySend:
		return c, fmt.Errorf("mq: unknown flush policy %d", c.Flush)
	case c.Flush != FlushNone && c.Dir == "":
		return c, fmt.Errorf("mq: flush policy %d needs a directory (Config.Dir): segments in /dev/shm have no disk to flush to", c.Flush)
	case c.FlushPeriod < 0 || c.FlushPeriod > time.Hour || c.Flush != FlushInterval && c.FlushPeriod != 0:
		return c, fmt.Errorf("mq: flush period %v, want one from 1 ns to an hour with FlushInterval only", c.FlushPeriod)
	case c.MaxAge < 0:
		return c, fmt.Errorf("mq: negative MaxAge %v", c.MaxAge)
	case c.Dir != "" && (len(c.Dir) > maxDir || !filepath.IsAbs(c.Dir) || filepath.Clean(c.Dir) != c.Dir):
		return c, fmt.Errorf("mq: directory %q: want a clean absolute path of at most %d bytes", c.Dir, maxDir)
	}
	return c, nil
}

func configPath(dir, name string) string { return filepath.Join(dir, name+".mqlog") }

func segPrefix(name string, p int) string { return fmt.Sprintf("%s-p%d-s", name, p) }

func (l *Log) segPath(p int, k uint64) string {
	return filepath.Join(l.cfg.Dir, segPrefix(l.name, p)+strconv.FormatUint(k, 10)+".seg")
}

// encodeConfig is the configuration file of a file-backed log: what
// reopening needs of Config (Dir aside), with a checksum.
func encodeConfig(c Config) []byte {
	b := binary.LittleEndian.AppendUint64(nil, confMagic)
	for _, v := range []uint64{uint64(c.Partitions), uint64(c.SegmentSize), uint64(c.Segments), uint64(c.Full),
		uint64(c.Flush), uint64(c.FlushPeriod), uint64(c.MaxAge)} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return binary.LittleEndian.AppendUint64(b, uint64(crc32.Checksum(b, castagnoli)))
}

// decodeConfig reads a configuration file (outside input: a disk may
// corrupt it, another program may have written it) for a log in dir.
func decodeConfig(b []byte, dir string) (Config, error) {
	if len(b) != confSize || binary.LittleEndian.Uint64(b) != confMagic {
		return Config{}, fmt.Errorf("mq: a log configuration file of %d bytes without its magic: %w", len(b), shm.ErrCorrupt)
	}
	if binary.LittleEndian.Uint64(b[confSize-8:]) != uint64(crc32.Checksum(b[:confSize-8], castagnoli)) {
		return Config{}, fmt.Errorf("mq: log configuration file fails its checksum: %w", shm.ErrCorrupt)
	}
	var w [confWords]uint64
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[8+8*i:])
	}
	c := Config{
		Partitions:  int(min(w[0], 1<<20)),
		SegmentSize: int(min(w[1], 1<<40)),
		Segments:    int(min(w[2], 1<<20)),
		Full:        FullPolicy(min(w[3], 255)),
		Flush:       FlushPolicy(min(w[4], 255)),
		FlushPeriod: time.Duration(min(w[5], 1<<62)),
		MaxAge:      time.Duration(min(w[6], 1<<62)),
		Dir:         dir,
	}
	d, err := c.withDefaults()
	if err != nil || d != c {
		return Config{}, fmt.Errorf("mq: log configuration %+v: %w", c, shm.ErrCorrupt)
	}
	return c, nil
}

// createDir writes the configuration file of new log name in c.Dir and
// returns it open and locked shared.
func createDir(name string, c Config) (*os.File, error) {
	path := configPath(c.Dir, name)
	if err := shm.WritePrivateFile(path, encodeConfig(c)); err != nil {
		return nil, fmt.Errorf("mq: create %s: %w", name, err)
	}
	f, err := lockDir(name, c.Dir)
	if err != nil {
		os.Remove(path)
	}
	return f, err
}

// lockDir opens the configuration file of log name in dir and takes a
// shared lock on it: reopening refuses to rebuild a log that a live
// process holds.
func lockDir(name, dir string) (*os.File, error) {
	f, err := shm.OpenPrivateFile(configPath(dir, name))
	if err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", name, err)
	}
	if err := shm.LockFile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("mq: open %s: %w", name, err)
	}
	return f, nil
}

// createSeg makes segment k of partition p (its creator holds pt.mu): in
// /dev/shm, or as a file in Config.Dir. Under a flush policy the
// segment before it, whose headers are all written now (the tail has left
// it), goes to disk first, and the new file and its name after it.
func (l *Log) createSeg(p int, pt *partition, k uint64) (*shm.Segment, error) {
	size := l.cfg.SegmentSize + trailer
	opts := &shm.SegmentConfig{Keep: true, Populate: true}
	if l.cfg.Dir == "" {
		if f := testSegClaimed.Load(); f != nil {
			(*f)(l, p, k)
		}
		seg, err := l.newSeg(p, k, true)
		if err != nil {
			unmake(pt, k, err)
			return nil, err
		}
		l.setBirth(seg)
		return seg, nil
	}
	seg, err := shm.CreateFileSegment(l.segPath(p, k), size, opts)
	if err != nil {
		unmake(pt, k, err)
		return nil, err
	}
	return l.madeSeg(p, pt, k, seg)
}

// takeOver makes segment k of partition p, which another producer
// counted as made and has not made for a second: it died, after its
// made CAS (no file yet: made here, O_EXCL) or in CreateFileSegment or
// shm.CreateSegment (a file without a header that no creator holds
// locked: made in place, shm.RepairFileSegment, shm.RepairSegment). It
// fails with an error wrapping os.ErrExist or shm.ErrLocked if the
// segment was made meanwhile, or its maker is still at it. The caller
// holds pt.mu.
func (l *Log) takeOver(p int, pt *partition, k uint64) (*shm.Segment, error) {
	if f := testTakeOver.Load(); f != nil {
		(*f)(l, p, k)
	}
	size := l.cfg.SegmentSize + trailer
	opts := &shm.SegmentConfig{Keep: true, Populate: true}
	if l.cfg.Dir == "" {
		// Its birth is stamped as the tail enters it (entered).
		return shm.RepairSegment(segName(l.name, p, k), size, opts)
	}
	seg, err := shm.CreateFileSegment(l.segPath(p, k), size, opts)
	if errors.Is(err, os.ErrExist) {
		seg, err = shm.RepairFileSegment(l.segPath(p, k), size, opts)
	}
	if err != nil {
		return nil, err
	}
	return l.madeSeg(p, pt, k, seg)
}

// madeSeg finishes segment file seg, k of partition p, just made: its
// birth, and under a flush policy the syncs.
func (l *Log) madeSeg(p int, pt *partition, k uint64, seg *shm.Segment) (*shm.Segment, error) {
	l.setBirth(seg)
	if f := testSegMade.Load(); f != nil {
		(*f)(l, p, k)
	}
	var err error
	if l.cfg.Flush != FlushNone {
		// The new file and its name first (a producer of another
		// handle that opens it syncs both too: syncMade), then the
		// segments left behind, in full. (A failure leaves segment k
		// made: the next Loan opens it.)
		err = seg.SyncAll()
		if err == nil {
			err = shm.SyncDir(l.cfg.Dir)
		}
		if err == nil {
			err = l.syncBehind(p, pt, k)
		}
		if err != nil {
			seg.Close()
			return nil, fmt.Errorf("mq: segment %d of partition %d: %w", k, p, err)
		}
	}
	return seg, nil
}

// unmake gives back segment k of pt, which its maker counted as made and
// then failed to create (a full disk, /dev/shm full): the next producer
// that needs it makes it again, rather than every later one finding it
// made and missing. Nobody moved made beyond k+1 meanwhile: that takes a
// tail in segment k+1, which takes segment k. A file that exists is
// left counted (os.ErrExist: not this maker's to give back).
func unmake(pt *partition, k uint64, err error) {
	if !errors.Is(err, os.ErrExist) {
		pt.made.CompareAndSwap(k+1, k)
	}
}

// testTakeOver, if set, is called by takeOver: tests that no maker is
// taken for dead fail there.
var testTakeOver atomic.Pointer[func(l *Log, p int, k uint64)]

// testSegMade, if set, is called by createSeg just after it created a
// segment file: tests stop a maker there.
var testSegMade atomic.Pointer[func(l *Log, p int, k uint64)]

// syncMade makes segment seg, which a producer of another handle made and
// this one is about to write in, durable as a file: its header and its
// name. Its maker may not have synced either yet (it may be about to, be
// slow, or have died), and a record of this handle must not be on disk in
// a file that a machine crash would unname, or leave without a header
// (a reopen takes such a file for one nothing was written in). Once per
// segment and handle, under a flush policy.
// skip says there is nothing to do (this handle made it, or reads only).
func (l *Log) syncMade(seg *shm.Segment, skip bool) error {
	if skip || l.cfg.Dir == "" || l.cfg.Flush == FlushNone {
		return nil
	}
	if err := seg.SyncAll(); err != nil {
		return err
	}
	return shm.SyncDir(l.cfg.Dir)
}

// syncBehind writes the segments before segment k to disk in full, from
// the one the watermark (pt.synced) is in, normally k-1 (more if the
// maker of one of them died or failed before it got here), and then moves
// the watermark to the start of k: every header below it is on disk, as
// the tail has left those segments and every header in them is written.
// FlushInterval needs it too: its ticker covers only the two newest
// segments a handle maps. The caller holds pt.mu.
func (l *Log) syncBehind(p int, pt *partition, k uint64) error {
	size := uint64(l.cfg.SegmentSize)
	for j := max(pt.synced.Load()/size, pt.head.Load()); j < k; j++ {
		if err := l.syncSeg(p, pt, j); err != nil {
			return err
		}
	}
	for {
		s := pt.synced.Load()
		if s >= k*size || pt.synced.CompareAndSwap(s, k*size) {
			return nil
		}
	}
}

// syncSeg writes segment k of partition p to disk; the caller holds pt.mu.
func (l *Log) syncSeg(p int, pt *partition, k uint64) error {
	if m := pt.segs[k]; m != nil {
		return l.noteSync(m, m.seg.SyncAll())
	}
	seg, err := l.openSeg(p, k)
	if errors.Is(err, os.ErrNotExist) {
		return nil // retention dropped it
	}
	if err != nil {
		return err
	}
	defer seg.Close()
	return seg.SyncAll()
}

// openSeg maps segment k of partition p.
func (l *Log) openSeg(p int, k uint64) (*shm.Segment, error) {
	if l.cfg.Dir == "" {
		return l.parts[p].maps.OpenSegment(segName(l.name, p, k))
	}
	return shm.OpenFileSegment(l.segPath(p, k))
}

// removeSeg removes segment k of partition p; mappings of it stay valid.
func (l *Log) removeSeg(p int, k uint64) error {
	if l.cfg.Dir != "" {
		if err := os.Remove(l.segPath(p, k)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return removeShm(segName(l.name, p, k))
}

// removeShm removes the segment name in /dev/shm, if it is there: a log's
// segment or spare.
func removeShm(name string) error {
	s, err := shm.OpenSegment(name)
	if errors.Is(err, shm.ErrCorrupt) {
		// Counted as made, and not (yet) sized or without a header:
		// its maker died there, or is making it this moment. Made
		// here (in place, when no maker holds it), to remove it; a
		// malformed file is left alone.
		s, err = shm.RepairSegment(name, 1, nil)
	}
	if err != nil {
		return nil
	}
	return errors.Join(s.Unlink(), s.Close())
}

// testSyncFault, if set, is the result of the next syncs of segments
// this package makes through a handle's mappings (flushRecord, flushAll)
// when it returns an error: tests play a disk that failed a write, which
// the kernel reports once per open file.
var testSyncFault atomic.Pointer[func(m *mapped) error]

// noteSync keeps the first error of a flush of segment m through this
// handle, and returns err, or else the error kept. The kernel reports a
// writeback error once per open file and marks the page that failed clean:
// a later sync of the same pages succeeds though that page, with headers
// the records after it depend on, is on no disk. So once a flush of a
// segment failed, every later flush of it through the handle fails too
// (a Commit in it, the FlushInterval goroutine's), and Close says so.
func (l *Log) noteSync(m *mapped, err error) error {
	if err != nil {
		err = fmt.Errorf("mq: flush of segment %d: %w", m.index, err)
		m.syncErr.CompareAndSwap(nil, &err)
		l.flushErr.CompareAndSwap(nil, &err)
		return err
	}
	if p := m.syncErr.Load(); p != nil {
		return fmt.Errorf("mq: an earlier flush failed, this handle's records in the segment may not be on disk: %w", *p)
	}
	return nil
}

// flushRecord writes the record that ends at end of segment m to disk,
// with every header before it in the segment that no earlier flush
// covered (another producer's claim, a pad): reopening walks headers from
// the segment's start, so a header missing on disk would hide the records
// after it. pt.synced says how far headers are known to be on disk. It
// enters segment m only when m's maker has written the segments before
// m in full (syncBehind): until then a record in m syncs m from its
// start and leaves the watermark where it is, since a late Commit in the
// segment before m must still sync from the watermark there (a header
// in writing before it may be on no disk yet).
func (l *Log) flushRecord(pt *partition, m *mapped, at, end uint64) error {
	base := m.index * uint64(l.cfg.SegmentSize)
	lo := uint64(0)
	if s := pt.synced.Load(); s > base {
		lo = min(s-base, at)
	}
	err := m.seg.Sync(int(lo), int(end-lo))
	if f := testSyncFault.Load(); f != nil && err == nil {
		err = (*f)(m)
	}
	if err := l.noteSync(m, err); err != nil {
		return err // the watermark stays: what failed may be on no disk
	}
	for {
		s := pt.synced.Load()
		if s < base || s >= base+end || pt.synced.CompareAndSwap(s, base+end) {
			return nil
		}
	}
}

// flushAll writes the segments this handle has mapped for producing to
// disk (FlushInterval).
func (l *Log) flushAll() error {
	var errs []error
	for _, pt := range l.parts {
		pt.mu.Lock()
		var ms []*mapped
		for _, m := range pt.segs {
			if m.acquire() {
				ms = append(ms, m)
			}
		}
		pt.mu.Unlock()
		for _, m := range ms {
			err := m.seg.SyncAll()
			if f := testSyncFault.Load(); f != nil && err == nil {
				err = (*f)(m)
			}
			errs = append(errs, l.noteSync(m, err))
			m.release()
		}
	}
	return errors.Join(errs...)
}

// now is the log's clock: time.Now, or a test's.
func (l *Log) now() time.Time {
	if f := l.clock.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

func (l *Log) setBirth(seg *shm.Segment) {
	if w, err := seg.Uint64At(l.cfg.SegmentSize); err == nil {
		w.Store(uint64(l.now().UnixNano()))
	}
}

// birth is when segment k of partition p was made, or for a segment made
// ahead when the tail entered it, in ns, or 0 if it is not there (or not
// yet stamped). Either is no earlier than the time the tail left segment
// k-1, so it bounds the time of segment k-1's newest record from above.
func (l *Log) birth(p int, k uint64) int64 {
	seg, err := l.openSeg(p, k)
	if err != nil {
		return 0
	}
	defer l.parts[p].maps.Release(seg)
	w, err := seg.Uint64At(l.cfg.SegmentSize)
	if err != nil {
		return 0
	}
	return int64(min(w.Load(), 1<<62))
}

// Expire drops, in every partition, the segments whose newest record is
// older than Config.MaxAge (a segment is that old once the segment after
// it was made longer than MaxAge ago; the segment the tail is in always
// stays), and returns how many it dropped. Readers in a dropped segment
// get ErrOffsetGone when they move on; age retention does not wait for
// readers (the topic asked for it). Producers call it when they move to a
// new segment, and a goroutine of every Log handle with a MaxAge calls it
// periodically (every MaxAge/8, from 10 ms to a minute), so records age
// out without producers and whatever readers do.
func (l *Log) Expire() (int, error) {
	if l.closed.Load() {
		return 0, ErrClosed
	}
	n := 0
	for p, pt := range l.parts {
		n += l.expire(p, pt)
	}
	return n, nil
}

func (l *Log) expire(p int, pt *partition) int {
	if l.cfg.MaxAge <= 0 {
		return 0
	}
	size := uint64(l.cfg.SegmentSize)
	now := l.now().UnixNano()
	for {
		h := pt.head.Load()
		last := pt.tail.Load() / size
		newHead := h
		for k := h; k < last && k < h+uint64(l.cfg.Segments); k++ {
			b := l.birth(p, k+1)
			if b == 0 || now-b <= int64(l.cfg.MaxAge) {
				break
			}
			newHead = k + 1
		}
		if newHead == h {
			return 0
		}
		if pt.head.CompareAndSwap(h, newHead) {
			l.removeSegs(p, h, newHead)
			l.wakeBlocked(pt)
			return int(newHead - h)
		}
	}
}

// startJanitor starts the handle's goroutine for FlushInterval and
// MaxAge, if it needs one.
func (l *Log) startJanitor() {
	var period time.Duration
	if l.cfg.Flush == FlushInterval {
		period = l.cfg.FlushPeriod
	}
	if l.cfg.MaxAge > 0 {
		a := min(max(l.cfg.MaxAge/8, 10*time.Millisecond), time.Minute)
		if period == 0 || a < period {
			period = a
		}
	}
	if period == 0 {
		return
	}
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(l.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-l.stop:
				return
			case <-t.C:
			}
			if l.cfg.Flush == FlushInterval {
				l.flushAll() // an error sticks (noteSync): Commits and Close return it
			}
			l.Expire()
		}
	}()
}

// stopJanitor ends the janitor and, under FlushInterval, flushes a last
// time.
func (l *Log) stopJanitor() error {
	if l.stop == nil {
		return nil
	}
	close(l.stop)
	<-l.done
	if l.cfg.Flush == FlushInterval {
		err := l.flushAll()
		if p := l.flushErr.Load(); err == nil && p != nil {
			err = *p // met by the goroutine, in a segment no longer mapped
		}
		return err
	}
	return nil
}

// OpenDir opens the file-backed log name in dir (Config.Dir): the log
// itself if its meta segment is in /dev/shm, or else the log rebuilt from
// its files, as after a reboot or once every process that had it open
// died and its meta segment was removed (docs/mq.md, "Durability"). It
// fails with an error wrapping shm.ErrLocked if a live process still
// holds the log while its meta segment is gone (rebuilding it then would
// race that process's writes).
func OpenDir(name, dir string) (*Log, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", name, err)
	}
	deadline := time.Now().Add(time.Second)
	for raced := 0; ; {
		l, err := Open(name)
		if errors.Is(err, shm.ErrCorrupt) {
			// A meta segment without its magic (Open waited a second
			// for it): another process is creating or rebuilding the
			// log, for as long as it lives, or died doing so.
			switch making, serr := staleMeta(name, dir); {
			case serr != nil:
				return nil, serr
			case making:
				continue
			case time.Now().Before(deadline):
				// Not sized yet (its maker is in CreateSegment), or
				// removed since: look again.
				time.Sleep(time.Millisecond)
				continue
			}
		}
		if err == nil {
			if l.cfg.Dir != dir {
				l.Close()
				return nil, fmt.Errorf("mq: log %s is open on directory %q, not %q: %w", name, l.cfg.Dir, dir, os.ErrExist)
			}
			return l, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		l, err = rebuild(name, dir)
		if !errors.Is(err, os.ErrExist) {
			return l, err
		}
		// Another process made the meta segment this moment: open it.
		if raced++; raced == 3 {
			return nil, fmt.Errorf("mq: open %s: its meta segment keeps coming and going: %w", name, err)
		}
	}
}

// staleMeta looks at the meta segment of log name, which Open found
// without its magic. If its maker lives (creating or rebuilding the log),
// it says making: wait more. If its maker died before the magic (a Create
// or a rebuild killed midway), nothing uses it, and it removes it, under
// the configuration file's exclusive lock (a live handle holds it shared:
// then ErrLocked, as for a rebuild; a concurrent remover holds it
// exclusive: looked at again) and only if the name still holds that
// segment; the caller then opens or rebuilds again (making). Else (no
// sized meta segment, or one with its magic: Open failed on something
// else) it says neither.
func staleMeta(name, dir string) (making bool, err error) {
	meta, err := shm.OpenSegment(metaName(name))
	if err != nil {
		return false, nil
	}
	defer meta.Close()
	if meta.Size() < metaSize {
		return false, nil
	}
	if w, _ := meta.Uint64At(offMagic); w.Load() == metaMagic {
		return false, nil
	}
	if meta.Creator().Alive() {
		return true, nil
	}
	f, err := shm.OpenPrivateFile(configPath(dir, name))
	if err != nil {
		return false, fmt.Errorf("mq: open %s: %w", name, err)
	}
	defer f.Close()
	if err := shm.TryLockFile(f); err != nil {
		if errors.Is(err, shm.ErrLocked) && lockedShared(f) {
			return false, fmt.Errorf("mq: reopen %s: %w", name, err)
		}
		return true, nil
	}
	if err := meta.Unlink(); err != nil {
		return false, fmt.Errorf("mq: reopen %s: removing the meta segment of a dead maker: %w", name, err)
	}
	return true, nil
}

// lockedShared says whether f's lock is held shared (by live handles of
// the log), rather than exclusive (by a reopening process).
func lockedShared(f *os.File) bool {
	if err := shm.TryLockFileShared(f); err != nil {
		return false
	}
	shm.UnlockFile(f)
	return true
}

// rebuild makes log name's meta segment again from its files in dir.
func rebuild(name, dir string) (*Log, error) {
	if err := shm.CheckDir(dir); err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", name, err)
	}
	f, err := shm.OpenPrivateFile(configPath(dir, name))
	if err != nil {
		return nil, fmt.Errorf("mq: open %s: %w", name, err)
	}
	fail := func(err error) (*Log, error) {
		f.Close()
		return nil, fmt.Errorf("mq: reopen %s from %s: %w", name, dir, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, confSize+1))
	if err != nil {
		return fail(err)
	}
	c, err := decodeConfig(b, dir)
	if err != nil {
		return fail(err)
	}
	// The meta segment first: of processes reopening the log at once,
	// the one that makes it rebuilds, and the others' Open waits for its
	// magic. Then the lock: a live process that still has the log open
	// (its meta segment removed under it) holds it shared.
	meta, err := shm.CreateSegment(metaName(name), metaSize, &shm.SegmentConfig{Keep: true})
	if err != nil {
		return fail(err)
	}
	if err := shm.TryLockFile(f); err != nil {
		meta.Unlink()
		meta.Close()
		return fail(err)
	}
	writeConfig(meta, c)
	l := &Log{name: name, cfg: c} // for the segment helpers
	entries, err := os.ReadDir(dir)
	if err == nil {
		for p := range c.Partitions {
			if f := testRebuilding.Load(); f != nil {
				(*f)(name, p)
			}
			if err = l.rebuildPartition(meta, entries, p); err != nil {
				break
			}
		}
	}
	if err != nil {
		meta.Unlink()
		meta.Close()
		return fail(err)
	}
	publish(meta)
	if err := shm.LockFile(f); err != nil { // from exclusive to shared
		meta.Unlink()
		meta.Close()
		return fail(err)
	}
	lg, err := open(name, meta, f)
	if err != nil {
		unlinkMeta(name)
	}
	return lg, err
}

// testRebuilding, if set, is called by a rebuild before each partition:
// tests stop or kill a rebuilder there.
var testRebuilding atomic.Pointer[func(name string, p int)]

// rebuildPartition finds partition p's segments among the files of the
// directory, repairs them (scanSegment) and writes the partition's words
// in the new meta segment: the head is the oldest segment kept, the tail
// where the newest segment's records end.
func (l *Log) rebuildPartition(meta *shm.Segment, entries []os.DirEntry, p int) error {
	prefix := segPrefix(l.name, p)
	var ks []uint64
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		num, ok2 := strings.CutSuffix(rest, ".seg")
		if !ok || !ok2 {
			continue
		}
		if k, err := strconv.ParseUint(num, 10, 63); err == nil && strconv.FormatUint(k, 10) == num {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	size := uint64(l.cfg.SegmentSize)
	base := offParts0 + p*partStride
	word := func(off int) *atomic.Uint64 { w, _ := meta.Uint64At(off); return w }
	// The newest file may be one its creator died making (no valid
	// header): nothing was ever in it.
	made := uint64(0)
	// One segment mapped at a time: a partition may have more segments
	// than the process may open files.
	var seg *shm.Segment
	defer func() {
		if seg != nil {
			seg.Close()
		}
	}()
	openKept := func(k uint64) (*shm.Segment, error) {
		seg, err := l.openSeg(p, k)
		if err == nil && seg.Size() < int(size) {
			seg.Close()
			err = fmt.Errorf("%d bytes, want %d: %w", seg.Size(), size, shm.ErrCorrupt)
		}
		return seg, err
	}
	for len(ks) > 0 {
		k := ks[len(ks)-1]
		s, err := openKept(k)
		if err == nil {
			seg, made = s, k+1 // made again from here, if a file without a header was removed above it
			break
		}
		// Only a file without a header is one nothing was written in; a
		// file refused for anything else (another owner, mode or name, a
		// damaged header) stops the rebuild: it may hold records.
		if !errors.Is(err, shm.ErrNoHeader) {
			return fmt.Errorf("segment %d of partition %d: %w", k, p, err)
		}
		if err := l.removeSeg(p, k); err != nil {
			return err
		}
		made = k // made again, as nothing was in it
		ks = ks[:len(ks)-1]
	}
	for i := range padRing { // they described the segments as they were
		word(base + offPadEnds + 8*i).Store(0)
	}
	if len(ks) == 0 {
		word(base + line + 16).Store(made)
		word(base + line).Store(made)
		word(base).Store(made * size)
		return nil
	}
	newest := ks[len(ks)-1]
	// The head: the oldest of the run of segments that ends at the
	// newest, at most Segments long; older files were being dropped.
	head := newest
	for i := len(ks) - 2; i >= 0 && ks[i] == head-1 && newest-ks[i] < uint64(l.cfg.Segments); i-- {
		head = ks[i]
	}
	for _, k := range ks {
		if k < head {
			if err := l.removeSeg(p, k); err != nil {
				return err
			}
		}
	}
	var aborted, torn, tail uint64
	for k := newest; ; k-- { // the newest first
		if k != newest {
			s, err := openKept(k)
			if err != nil {
				return fmt.Errorf("segment %d of partition %d: %w", k, p, err)
			}
			seg.Close()
			seg = s
		}
		words, err := seg.Uint64s(0, int(size/8))
		if err != nil {
			return err
		}
		end, a, t := scanSegment(words, seg.Data()[:size:size], k, k == newest)
		aborted, torn = aborted+a, torn+t
		if k == newest {
			tail = k*size + end
		}
		// Under a flush policy the repairs go to disk, and so does the
		// newest segment whatever it holds: a producer killed between
		// its Commit's CAS and its msync left a committed header only
		// in the page cache, which the records sent after the reopen
		// depend on (the watermark is set to the tail).
		if l.cfg.Flush != FlushNone && (a+t > 0 || k == newest) {
			if err := seg.SyncAll(); err != nil {
				return err
			}
		}
		if k == head {
			break
		}
	}
	word(base).Store(tail)
	word(base + line).Store(head)
	word(base + line + 8).Store(aborted)
	word(base + line + 16).Store(made)
	word(base + line + 24).Store(torn)
	word(base + line + 32).Store(tail)
	return nil
}

// scanSegment walks the records of segment k (its words and data, read
// from a file: anything may be there) from its start, as reopening does,
// and repairs what a crash left: a record still in writing (its writer
// is dead: every process was) is aborted; a committed record that fails
// its checksum or offset (a machine crash wrote part of it) is aborted and
// counted torn; at the first header that is zero or makes no sense the
// records end. In the newest segment that is the tail: every word from
// there on is zeroed, so that no stale header resurfaces when producers
// write there again. In an older segment (a machine crash lost a page of
// headers) a committed pad covers the rest, so readers move on. It returns
// where the records end in the segment and the counts of aborted and torn
// records.
func scanSegment(words []atomic.Uint64, data []byte, k uint64, newest bool) (end, aborted, torn uint64) {
	size := uint64(len(data))
	at := uint64(0)
	bad := false
	for at+headerSize <= size {
		hw := &words[at/8]
		w := hw.Load()
		if w == 0 {
			break
		}
		_, next, err := decode(data, at, w, words[at/8+1].Load(), k*size+at)
		switch {
		case err != nil:
			// A header that is sound as an aborted record's: its
			// payload or offset word is what is wrong.
			if _, n, herr := decode(data, at, w|stateAborted, 0, 0); herr == nil {
				hw.Store(w | stateAborted)
				torn++
				next = n
				break
			}
			bad = true
		case w&stateMask == stateWriting:
			hw.Store(w | stateAborted)
			aborted++
		}
		if bad {
			break
		}
		at += next
	}
	if at+headerSize > size {
		// The records reach the end: nothing after them, and no room
		// for a header (producers and readers skip such a rest).
		return size, aborted, torn
	}
	if bad || !newest {
		torn++
	}
	if newest {
		for i := at / 8; i < size/8; i++ {
			if words[i].Load() != 0 {
				words[i].Store(0)
			}
		}
		return at, aborted, torn
	}
	words[at/8+1].Store(0)
	words[at/8].Store((size-at-headerSize)<<32 | flagPad | stateCommitted)
	return size, aborted, torn
}
