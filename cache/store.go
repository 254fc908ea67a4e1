package cache

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"math/rand/v2"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ubkit-io/ubkit/shm"
)

// Errors.
var (
	// ErrNotFound: no live entry for the key.
	ErrNotFound = errors.New("cache: not found")
	// ErrExists: Add found the key, or a compare-and-swap found another
	// version.
	ErrExists = errors.New("cache: key exists with another version")
	// ErrTooLarge: the key and value do not fit the largest buffer.
	ErrTooLarge = errors.New("cache: value too large")
	// ErrFull: eviction could not make room.
	ErrFull = errors.New("cache: full")
	// ErrCorrupt: the shared memory does not hold a valid table.
	ErrCorrupt = errors.New("cache: corrupt shared memory")
	// ErrBusy: a live process held a bucket's lock for longer than the
	// call waits (a stopped or stuck writer). Nothing is corrupt; try again.
	ErrBusy = errors.New("cache: bucket held by a live writer")
)

// Layout of a store's segment.
//
//	header   0: magic u64, version u32, ready u32, buckets u64, max bytes
//	            u64, pool offset u64, max record u64
//	       128: version counter       256: clock hand
//	       384: bytes in use          512: items
//	       640: 16 stat stripes of 128 bytes (hits, misses, sets, deletes,
//	            evictions, expired, repairs, reclaimed)
//	      2688: recount flag (non-zero: a repair left the item and byte
//	            counters to be recounted)
//	      2816: 128 process words of the attached processes (0: free), so
//	            that a process that died is noticed and what it held taken
//	            back
//	buckets 4096: 512 bytes each: an shm.SeqLock (32 bytes: the holder's
//	            process word, the sequence, odd while written, and its
//	            sleepers), CLOCK hand u64, 24 bytes pad, 14 slots of 32
//	            bytes: hash u64 (0: empty), handle u64 (gen<<32|segment),
//	            offset u64, size u64 (bit 63: referenced, for CLOCK)
//	pool:       an shm.Pool holding the records
//
// A record is a pool buffer: checksum u64 (xxhash of bytes 8..32 and of
// the key and value), key length u32, value length u32, version u64, flags
// u32, pad u32, expiry u64 (unix ns, 0: never; the one mutable field, not
// in the checksum), then the key and the value.
const (
	magic = 0x3148_4341_434b_4255 // "UBKCACH1"
	// layoutVer 2: attached processes and the recount flag in the header
	// (what dead writers held is taken back). 3: a bucket's lock is an
	// shm.SeqLock, which counts its sleepers where the CLOCK hand was (the
	// hand moved from 16 to 32), so that waiters sleep on a futex.
	layoutVer  = 3
	headerSize = 4096

	hOffMagic    = 0
	hOffVersion  = 8
	hOffReady    = 12
	hOffBuckets  = 16
	hOffMaxBytes = 24
	hOffPoolOff  = 32
	hOffMaxRec   = 40
	hOffVerCtr   = 128
	hOffHand     = 256
	hOffBytes    = 384
	hOffItems    = 512
	hOffStats    = 640
	statStripes  = 16
	stripeSize   = 128
	hOffRecount  = 2688
	hOffProcs    = 2816
	maxProcs     = 128

	bucketSize  = 512
	bOffLock    = 0  // the bucket's shm.SeqLock
	bOffHand    = 32 // where the bucket's CLOCK resumes
	bOffSlots   = 64
	slotSize    = 32
	slotsPerBkt = (bucketSize - bOffSlots) / slotSize
	sOffHash    = 0
	sOffHandle  = 8
	sOffOffset  = 16
	sOffSize    = 24
	refBit      = 1 << 63

	recHeader   = 40
	rOffSum     = 0
	rOffKeyLen  = 8
	rOffValLen  = 12
	rOffVersion = 16
	rOffFlags   = 24
	rOffExpire  = 32

	minClass = 128
)

// Stat stripe fields.
const (
	stHits = iota
	stMisses
	stSets
	stDeletes
	stEvictions
	stExpired
	stRepairs
	stReclaimed
	nStats
)

// Config sizes a store when it is created; attaching processes take the
// creator's geometry.
type Config struct {
	// MaxBytes bounds the bytes of live records (keys, values and a 40-byte
	// header each, rounded up to a size class); beyond it, CLOCK evicts.
	// Default 64 MiB.
	MaxBytes int64
	// MaxValue is the largest key plus value. Default 1 MiB.
	MaxValue int
	// Buckets of 14 entries each (rounded up to a power of two). Default:
	// enough for MaxBytes of 256-byte records.
	Buckets int
	// Logger receives what this process's Store noticed and set right:
	// at Warn, a bucket taken over from a writer that died holding it;
	// at Debug, buffers taken back from dead processes and bookkeeping
	// left for later. It is this process's own (the geometry above is
	// the creator's). Nil: nothing is logged.
	Logger *slog.Logger
}

// Options is the old name of Config.
//
// Deprecated: use Config.
type Options = Config

// Store is a key-value store in shared memory that every process on the
// host opens by name. Each bucket has an shm.SeqLock: reads take no lock
// (the lock's sequence tells a reader to retry); writers lock one bucket
// at a time, and a lock whose holder died is taken over and the bucket
// repaired. Values live in an shm.Pool in the same segment.
//
// A call that takes a context may wait for a bucket whose lock a live
// writer holds (a write takes microseconds; a writer that is stopped, or
// descheduled under load, holds it longer): it waits at most 5 s, then
// returns an error wrapping ErrBusy, and ends sooner, with an error
// matching ctx.Err() (errors.Is(err, context.Canceled) or
// context.DeadlineExceeded), when ctx does. A call that need not wait
// succeeds whatever ctx.
type Store struct {
	seg      *shm.Segment
	mem      []byte
	pool     *shm.Pool
	nbuckets uint64
	maxBytes int64
	maxRec   int
	me       uint64
	log      *slog.Logger
	words    []atomic.Uint64 // the header and the buckets
	locks    *shm.SeqTable   // the buckets' locks

	verCtr, hand, used, items *atomic.Uint64
	lastSweep                 atomic.Int64 // unix ns of this attachment's last look for dead processes
}

// Pool is the old name of Store.
//
// Deprecated: use Store.
type Pool = Store

// Open attaches to the store named name, creating it with cfg if it does
// not exist. Every process that opens the same name shares the entries.
func Open(name string, cfg Config) (*Store, error) {
	seg, err := shm.OpenSegment(segName(name))
	if errors.Is(err, os.ErrNotExist) {
		p, cerr := create(name, cfg)
		if !errors.Is(cerr, os.ErrExist) {
			return p, cerr
		}
		seg, err = shm.OpenSegment(segName(name)) // lost the race to create it
	}
	if err != nil {
		return nil, fmt.Errorf("cache: open %s: %w", name, err)
	}
	p, err := attach(seg, cfg.Logger)
	if err != nil {
		seg.Close()
		return nil, fmt.Errorf("cache: open %s: %w", name, err)
	}
	return p, nil
}

// Remove unlinks the store's segment: processes attached keep their
// mapping, and the next Open of the name creates a new, empty store. Close
// never removes the name (not even the creator's), so that a store does
// not split in two when its creator exits while others use it; Remove is
// the only way to delete it.
func Remove(name string) error {
	seg, err := shm.OpenSegment(segName(name))
	if err != nil {
		return err
	}
	defer seg.Close()
	return seg.Unlink()
}

func segName(name string) string { return "cache-" + name }

func (o Config) withDefaults() Config {
	if o.MaxBytes <= 0 {
		o.MaxBytes = 64 << 20
	}
	if o.MaxValue <= 0 {
		o.MaxValue = 1 << 20
	}
	if o.Buckets <= 0 {
		o.Buckets = int(o.MaxBytes / 256 / slotsPerBkt)
	}
	o.Buckets = 1 << bits.Len(uint(max(o.Buckets, 16)-1))
	return o
}

// poolConfig has power-of-two classes from 128 bytes to the largest
// record; each could hold MaxBytes alone (memory is committed only as
// buffers are touched), so any mix of sizes fits the byte limit.
func poolConfig(o Config) shm.PoolConfig {
	var c shm.PoolConfig
	top := 1 << bits.Len(uint(recHeader+o.MaxValue-1))
	for size := minClass; size <= top; size *= 2 {
		c.Classes = append(c.Classes, shm.PoolClass{Size: size, Count: int(max(o.MaxBytes/int64(size), 2))})
	}
	return c
}

func create(name string, opts Config) (*Store, error) {
	o := opts.withDefaults()
	cfg := poolConfig(o)
	psize, err := shm.PoolSize(cfg)
	if err != nil {
		return nil, fmt.Errorf("cache: create %s: %w", name, err)
	}
	poolOff := headerSize + o.Buckets*bucketSize
	poolOff = (poolOff + 4095) &^ 4095
	// Keep: the name outlives its creator's Close. Every process on the
	// host finds the same store by it for as long as the store is used;
	// only Remove deletes it.
	seg, err := shm.CreateSegment(segName(name), poolOff+psize, &shm.SegmentConfig{Keep: true})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Store, error) {
		seg.Unlink()
		seg.Close()
		return nil, fmt.Errorf("cache: create %s: %w", name, err)
	}
	if _, err := shm.CreatePool(seg, poolOff, cfg); err != nil {
		return fail(err)
	}
	d := seg.Data()
	binary.LittleEndian.PutUint64(d[hOffMagic:], magic)
	binary.LittleEndian.PutUint32(d[hOffVersion:], layoutVer)
	binary.LittleEndian.PutUint64(d[hOffBuckets:], uint64(o.Buckets))
	binary.LittleEndian.PutUint64(d[hOffMaxBytes:], uint64(o.MaxBytes))
	binary.LittleEndian.PutUint64(d[hOffPoolOff:], uint64(poolOff))
	binary.LittleEndian.PutUint64(d[hOffMaxRec:], uint64(recHeader+o.MaxValue))
	ready, _ := seg.Uint32At(hOffReady)
	ready.Store(1)
	shm.Wake(ready)
	p, err := attach(seg, opts.Logger)
	if err != nil {
		return fail(err)
	}
	return p, nil
}

// attach validates the header once; the hot paths use the checked copy.
func attach(seg *shm.Segment, log *slog.Logger) (*Store, error) {
	d := seg.Data()
	if len(d) < headerSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrCorrupt, len(d))
	}
	ready, _ := seg.Uint32At(hOffReady)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	if err := (shm.Wait{}).Until(ctx, ready, func(v uint32) bool { return v == 1 }); err != nil {
		return nil, fmt.Errorf("%w: its creator did not finish it within %v (remove it with cache.Remove)", ErrCorrupt, readyTimeout)
	}
	if binary.LittleEndian.Uint64(d[hOffMagic:]) != magic {
		return nil, fmt.Errorf("%w: not a cache store (bad magic)", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(d[hOffVersion:]); v != layoutVer {
		// A different ubkit, not corruption.
		return nil, fmt.Errorf("cache: a store of layout %d, and this ubkit speaks layout %d: open it with the ubkit that made it, "+
			"or cache.Remove it once no process uses it", v, layoutVer)
	}
	nb := binary.LittleEndian.Uint64(d[hOffBuckets:])
	maxBytes := binary.LittleEndian.Uint64(d[hOffMaxBytes:])
	poolOff := binary.LittleEndian.Uint64(d[hOffPoolOff:])
	maxRec := binary.LittleEndian.Uint64(d[hOffMaxRec:])
	if nb == 0 || nb&(nb-1) != 0 || nb > 1<<40 || poolOff < headerSize+nb*bucketSize || poolOff >= uint64(len(d)) ||
		maxRec < recHeader || maxRec > 1<<40 || maxBytes == 0 || maxBytes > 1<<50 {
		return nil, fmt.Errorf("%w: bad geometry", ErrCorrupt)
	}
	pool, err := shm.OpenPool(seg, int(poolOff))
	if err != nil {
		return nil, err
	}
	words, err := seg.Uint64s(0, headerSize/8+int(nb)*bucketSize/8)
	if err != nil {
		return nil, err
	}
	locks, err := shm.NewSeqTable(seg, headerSize+bOffLock, int(nb), bucketSize)
	if err != nil {
		return nil, err
	}
	me := shm.Self()
	p := &Store{seg: seg, mem: d, pool: pool, nbuckets: nb, maxBytes: int64(maxBytes), maxRec: int(maxRec),
		me: me.Word(), log: orDiscard(log), words: words, locks: locks}
	p.verCtr = p.word(hOffVerCtr)
	p.hand = p.word(hOffHand)
	p.used = p.word(hOffBytes)
	p.items = p.word(hOffItems)
	p.register()
	return p, nil
}

// orDiscard is l, or a logger that logs nothing.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// word is an atomic view of a validated, aligned offset of the header or
// the buckets.
func (p *Store) word(off int) *atomic.Uint64 { return &p.words[off>>3] }

// MaxValue is the largest key plus value an entry can hold.
func (p *Store) MaxValue() int { return p.maxRec - recHeader }

// Close detaches; entries stay for other processes.
func (p *Store) Close() error {
	p.pool.Close()
	return p.seg.Close()
}

func hashKey(key []byte) uint64 { return xxhash.Sum64(key) | 1 }

func (p *Store) bucketOff(h uint64) int { return headerSize + int(h&(p.nbuckets-1))*bucketSize }

// lockOf is the lock of the bucket at offset bk.
func (p *Store) lockOf(bk int) shm.SeqLock { return p.locks.At((bk - headerSize) / bucketSize) }

func slotOff(b, i int) int { return b + bOffSlots + i*slotSize }

// stat is a counter in a stripe picked at random per call, so that
// goroutines and processes counting at once rarely share a cache line.
func (p *Store) stat(i int) *atomic.Uint64 {
	return p.word(hOffStats + int(rand.Uint32()%statStripes)*stripeSize + i*8)
}

// Info describes an entry.
type Info struct {
	Version uint64
	Flags   uint32
	// Expires is zero for an entry that does not expire.
	Expires time.Time
}

// record is a resolved record buffer.
type record struct {
	buf    shm.Buffer
	handle shm.Handle
}

func (r record) b() []byte { return r.buf.Bytes() }

// parse bounds-checks a record's lengths against its buffer.
func (r record) parse() (key, val []byte, ok bool) {
	b := r.b()
	if len(b) < recHeader {
		return nil, nil, false
	}
	kl := int(binary.LittleEndian.Uint32(b[rOffKeyLen:]))
	vl := int(binary.LittleEndian.Uint32(b[rOffValLen:]))
	if kl > len(b)-recHeader || vl > len(b)-recHeader-kl {
		return nil, nil, false
	}
	return b[recHeader : recHeader+kl], b[recHeader+kl : recHeader+kl+vl], true
}

func (r record) info() Info {
	b := r.b()
	in := Info{Version: binary.LittleEndian.Uint64(b[rOffVersion:]), Flags: binary.LittleEndian.Uint32(b[rOffFlags:])}
	if e := r.expire(); e != 0 {
		in.Expires = time.Unix(0, e)
	}
	return in
}

func (r record) expire() int64 {
	w, err := shm.WordIn(r.b(), rOffExpire)
	if err != nil {
		return 0
	}
	return int64(w.Load())
}

func checksum(b []byte, kl, vl int) uint64 {
	d := xxhash.New()
	d.Write(b[8:32])
	d.Write(b[recHeader : recHeader+kl+vl])
	return d.Sum64()
}

// resolve turns a slot's handle words into a record, or reports it stale.
func (p *Store) resolve(hw, off uint64) (record, bool) {
	h := handleOf(hw, off)
	buf, err := p.pool.Resolve(h)
	if err != nil {
		return record{}, false
	}
	return record{buf: buf, handle: h}, true
}

func handleOf(hw, off uint64) shm.Handle {
	return shm.Handle{Segment: uint32(hw), Gen: uint32(hw >> 32), Offset: off}
}

// slotHandle is the handle slot s names.
func (p *Store) slotHandle(s int) shm.Handle {
	return handleOf(p.word(s+sOffHandle).Load(), p.word(s+sOffOffset).Load())
}

// stillLoaned checks, after reading a record, that it was not returned and
// reused meanwhile.
func (p *Store) stillLoaned(r record) bool {
	_, err := p.pool.Resolve(r.handle)
	return err == nil
}

// lookup finds key's live record in a bucket as a reader: no lock; the
// caller validates the bucket's sequence afterwards.
//
// now is the time in unix ns, or 0 to read the clock only if the entry
// expires (most do not, and the clock costs a quarter of a read).
func (p *Store) lookup(b int, h uint64, key []byte, now int64) (record, int, bool) {
	for i := range slotsPerBkt {
		s := slotOff(b, i)
		if p.word(s+sOffHash).Load() != h {
			continue
		}
		r, ok := p.resolve(p.word(s+sOffHandle).Load(), p.word(s+sOffOffset).Load())
		if !ok {
			continue
		}
		k, _, ok := r.parse()
		if !ok || !bytes.Equal(k, key) {
			continue
		}
		if e := r.expire(); e != 0 {
			if now == 0 {
				now = time.Now().UnixNano()
			}
			if e <= now {
				return record{}, -1, false
			}
		}
		return r, i, true
	}
	return record{}, -1, false
}

// read runs fn on key's value under the bucket's sequence number, retrying
// while writers intervene; fn may run more than once.
func (p *Store) read(ctx context.Context, key []byte, fn func(val []byte, in Info)) (bool, error) {
	return p.readCounted(ctx, key, fn, true)
}

func (p *Store) readCounted(ctx context.Context, key []byte, fn func(val []byte, in Info), count bool) (bool, error) {
	h := hashKey(key)
	b := p.bucketOff(h)
	l := p.lockOf(b)
	for {
		s1, err := l.BeginContext(ctx, lockTimeout)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
				return false, fmt.Errorf("cache: waiting for bucket %d: %w", (b-headerSize)/bucketSize, err)
			}
			if !errors.Is(err, shm.ErrOwnerDied) {
				return false, fmt.Errorf("%w: %w", ErrBusy, err)
			}
			// The bucket's writer died in the middle of a write: take
			// it over (which repairs it) and read again.
			if err := p.lock(ctx, b); err != nil {
				return false, err
			}
			p.unlock(b)
			continue
		}
		r, i, ok := p.lookup(b, h, key, 0)
		if ok {
			_, v, _ := r.parse()
			fn(v, r.info())
			if !p.stillLoaned(r) || !l.Validate(s1) {
				continue
			}
			if sz := p.word(slotOff(b, i) + sOffSize); sz.Load()&refBit == 0 {
				sz.Or(refBit)
			}
			if count {
				p.stat(stHits).Add(1)
			}
			return true, nil
		}
		if !l.Validate(s1) {
			continue
		}
		if count {
			p.stat(stMisses).Add(1)
		}
		return false, nil
	}
}

// Version returns key's version and whether it is there, without reading
// its value (nor counting a hit or a miss: it is for bookkeeping entries).
// Like Get, it fails when it cannot read the key's bucket: ctx ended
// (errors.Is ctx.Err()) or a live writer held it too long (ErrBusy).
func (p *Store) Version(ctx context.Context, key []byte) (uint64, bool, error) {
	var v uint64
	found, err := p.readCounted(ctx, key, func(_ []byte, in Info) { v = in.Version }, false)
	if err != nil {
		return 0, false, err
	}
	return v, found, nil
}

// A Stamp moves whenever the entry of the key it was made for may have
// changed: it is the sequence number of the key's bucket, which every
// change to the bucket (a write, a delete, an eviction, a repair) moves
// by two, and which is odd while one is under way. Reading it is one
// atomic load, and it is the same word for every process on the store, so
// a reader can remember what it last found for a key together with the
// stamp it read before and after, and trust that memory while the stamp
// has not moved. Writes to other keys of the bucket move it too: a moved
// stamp says "look again", not "changed".
type Stamp struct{ l shm.SeqLock }

// StampOf returns key's stamp.
func (p *Store) StampOf(key []byte) Stamp {
	return Stamp{p.lockOf(p.bucketOff(hashKey(key)))}
}

// Load reads the stamp; an odd value means a change is under way.
func (s Stamp) Load() uint64 { return s.l.Seq() }

// Get copies key's value into dst (grown as needed) and returns it.
func (p *Store) Get(ctx context.Context, key, dst []byte) ([]byte, Info, error) {
	var out Info
	found, err := p.read(ctx, key, func(v []byte, in Info) {
		dst = append(dst[:0], v...)
		out = in
	})
	if err != nil {
		return nil, Info{}, err
	}
	if !found {
		return nil, Info{}, ErrNotFound
	}
	return dst, out, nil
}

// View calls fn with key's value in shared memory, without copying. fn
// must not keep the slice or modify it, and may be called more than once
// (when a writer replaced the value meanwhile, the last call saw the
// current one). It reports whether the key was found.
func (p *Store) View(ctx context.Context, key []byte, fn func(val []byte, in Info)) (bool, error) {
	return p.read(ctx, key, fn)
}

// Mode says when Set stores.
type Mode uint8

const (
	// Always stores.
	Always Mode = iota
	// IfAbsent stores only if the key has no live entry (memcached add).
	IfAbsent
	// IfPresent stores only if it has one (memcached replace).
	IfPresent
	// IfVersion stores only if the entry's version is SetOptions.Version
	// (compare-and-swap).
	IfVersion
)

// SetOptions qualify a Set.
type SetOptions struct {
	Mode    Mode
	Version uint64
	// TTL: 0 never expires.
	TTL   time.Duration
	Flags uint32
}

// Set stores value under key and returns the entry's new version.
func (p *Store) Set(ctx context.Context, key, value []byte, o SetOptions) (uint64, error) {
	n := recHeader + len(key) + len(value)
	if n > p.maxRec || len(key) > 1<<20 {
		return 0, ErrTooLarge
	}
	buf, err := p.loan(ctx, n)
	if err != nil {
		return 0, err
	}
	b := buf.Bytes()
	ver := p.verCtr.Add(1)
	if ver%maintainEvery == 0 {
		defer p.maintain(ctx)
	}
	binary.LittleEndian.PutUint32(b[rOffKeyLen:], uint32(len(key)))
	binary.LittleEndian.PutUint32(b[rOffValLen:], uint32(len(value)))
	binary.LittleEndian.PutUint64(b[rOffVersion:], ver)
	binary.LittleEndian.PutUint32(b[rOffFlags:], o.Flags)
	binary.LittleEndian.PutUint32(b[rOffFlags+4:], 0)
	var exp int64
	if o.TTL > 0 {
		exp = time.Now().Add(o.TTL).UnixNano()
	}
	binary.LittleEndian.PutUint64(b[rOffExpire:], uint64(exp))
	copy(b[recHeader:], key)
	copy(b[recHeader+len(key):], value)
	binary.LittleEndian.PutUint64(b[rOffSum:], checksum(b, len(key), len(value)))
	size := uint64(len(b))
	if err := p.makeRoom(ctx, size); err != nil {
		buf.Return()
		return 0, err
	}
	h := hashKey(key)
	bk := p.bucketOff(h)
	if err := p.lock(ctx, bk); err != nil {
		buf.Return()
		return 0, err
	}
	l := p.lockOf(bk)
	l.BeginWrite()
	var freed []record
	now := time.Now().UnixNano()
	freed = p.dropExpired(bk, now, freed)
	cur, i, found := p.lookup(bk, h, key, now)
	switch {
	case o.Mode == IfAbsent && found, o.Mode == IfVersion && found && cur.info().Version != o.Version:
		err = ErrExists
	case (o.Mode == IfPresent || o.Mode == IfVersion) && !found:
		err = ErrNotFound
	}
	if err == nil {
		if found {
			freed = append(freed, p.take(slotOff(bk, i)))
			p.used.Add(-(p.word(slotOff(bk, i)+sOffSize).Load() &^ refBit))
		} else if i = p.freeSlot(bk); i >= 0 {
			p.items.Add(1)
		} else {
			var victim record
			i, victim = p.victim(bk)
			freed = append(freed, victim)
			p.stat(stEvictions).Add(1)
		}
		s := slotOff(bk, i)
		bh := buf.Handle()
		p.word(s + sOffHash).Store(h)
		p.word(s + sOffHandle).Store(uint64(bh.Gen)<<32 | uint64(bh.Segment))
		p.word(s + sOffOffset).Store(bh.Offset)
		if testHookMidWrite != nil {
			testHookMidWrite()
		}
		p.word(s + sOffSize).Store(size)
		// The bytes count from here, under the lock, and the record
		// becomes the table's: a writer that dies before leaves nothing
		// counted and a buffer of its own, which Reclaim takes back (or,
		// if it dies holding the lock, a bucket whose repair shares the
		// record or drops it).
		p.used.Add(size)
		buf.Share()
	}
	l.EndWrite()
	p.unlock(bk)
	p.release(freed)
	if err != nil {
		buf.Return()
		return 0, err
	}
	if p.used.Load() > uint64(p.maxBytes) {
		// Writers at the same time went over together. The write is
		// done: what could not be evicted now is evicted by the next.
		if err := p.makeRoom(ctx, 0); err != nil {
			p.log.Debug("cache: over the byte limit after a write", "err", err)
		}
	}
	p.stat(stSets).Add(1)
	return ver, nil
}

// loan takes a buffer, evicting when its class has none left.
func (p *Store) loan(ctx context.Context, n int) (shm.Buffer, error) {
	for attempt := 0; ; attempt++ {
		buf, err := p.pool.Loan(n)
		if err == nil {
			return buf, nil
		}
		if errors.Is(err, shm.ErrTooLarge) {
			return shm.Buffer{}, ErrTooLarge
		}
		// Buffers of processes that died are the first to take back.
		if attempt == 0 && p.reclaim() > 0 {
			continue
		}
		if attempt > 64 || p.evict(ctx) == 0 {
			return shm.Buffer{}, fmt.Errorf("%w: no buffer of %d bytes: %v", ErrFull, n, err)
		}
	}
}

// makeRoom evicts until size more bytes fit under the limit. The bytes
// are not counted yet (a writer counts its entry once it is in its bucket,
// under the lock, so that one killed before leaves nothing counted):
// writers at the same time may together go over by what they write, and
// each evicts back under the limit after its write.
func (p *Store) makeRoom(ctx context.Context, size uint64) error {
	for range 1 << 16 {
		if p.used.Load()+size <= uint64(p.maxBytes) {
			return nil
		}
		if p.evict(ctx) == 0 {
			break
		}
	}
	if u := p.used.Load(); u+size > uint64(p.maxBytes) {
		return fmt.Errorf("%w: %d bytes over the limit of %d", ErrFull, u+size-uint64(p.maxBytes), p.maxBytes)
	}
	return nil
}

// evict advances the CLOCK hand one bucket: referenced entries lose their
// bit, the others go. It returns how many it removed (it gives up, with 0,
// after a full turn found nothing).
func (p *Store) evict(ctx context.Context) int {
	for range p.nbuckets * 2 {
		bk := headerSize + int(p.hand.Add(1)&(p.nbuckets-1))*bucketSize
		if p.lock(ctx, bk) != nil {
			continue
		}
		l := p.lockOf(bk)
		l.BeginWrite()
		var freed []record
		for i := range slotsPerBkt {
			s := slotOff(bk, i)
			if p.word(s+sOffHash).Load() == 0 {
				continue
			}
			sz := p.word(s + sOffSize)
			if v := sz.Load(); v&refBit != 0 {
				sz.Store(v &^ refBit)
				continue
			}
			freed = append(freed, p.clearSlot(s))
		}
		l.EndWrite()
		p.unlock(bk)
		p.release(freed)
		if n := len(freed); n > 0 {
			p.stat(stEvictions).Add(uint64(n))
			return n
		}
	}
	return 0
}

// take makes this process the owner of the record slot s names (lock
// held) before the slot lets go of it. A shared record that no slot names
// would be nobody's; one of this process's is taken back by Reclaim should
// the process die before it returns the record.
func (p *Store) take(s int) record {
	h := p.slotHandle(s)
	if _, err := p.pool.Adopt(h); err != nil {
		return record{} // stale: already taken back
	}
	return record{handle: h}
}

// clearSlot empties slot s (lock held) and returns what it held, for
// release after the unlock.
func (p *Store) clearSlot(s int) record {
	r := p.take(s)
	size := p.word(s+sOffSize).Load() &^ refBit
	p.word(s + sOffHash).Store(0)
	p.word(s + sOffSize).Store(0)
	p.items.Add(^uint64(0))
	p.used.Add(-size)
	return r
}

// release gives removed records' buffers back.
func (p *Store) release(rs []record) {
	for _, r := range rs {
		if r.handle != (shm.Handle{}) {
			p.pool.Return(r.handle) // a stale handle was already taken back
		}
	}
}

func (p *Store) freeSlot(bk int) int {
	for i := range slotsPerBkt {
		if p.word(slotOff(bk, i)+sOffHash).Load() == 0 {
			return i
		}
	}
	return -1
}

// victim picks the entry to replace in a full bucket by CLOCK: from the
// bucket's hand, referenced entries lose their bit and the first entry
// without one goes; the hand moves past it, so an entry whose bit was
// cleared gets a full turn to be read again.
func (p *Store) victim(bk int) (int, record) {
	hand := p.word(bk + bOffHand)
	start := int(hand.Load() % slotsPerBkt)
	for k := 0; ; k++ {
		i := (start + k) % slotsPerBkt
		s := slotOff(bk, i)
		sz := p.word(s + sOffSize)
		if v := sz.Load(); v&refBit != 0 && k < slotsPerBkt {
			sz.Store(v &^ refBit)
			continue
		}
		hand.Store(uint64(i + 1))
		p.used.Add(-(sz.Load() &^ refBit))
		return i, p.take(s)
	}
}

// dropExpired removes expired entries of a locked bucket.
func (p *Store) dropExpired(bk int, now int64, freed []record) []record {
	for i := range slotsPerBkt {
		s := slotOff(bk, i)
		if p.word(s+sOffHash).Load() == 0 {
			continue
		}
		r, ok := p.resolve(p.word(s+sOffHandle).Load(), p.word(s+sOffOffset).Load())
		if !ok {
			continue
		}
		if e := r.expire(); e != 0 && e <= now {
			freed = append(freed, p.clearSlot(s))
			p.stat(stExpired).Add(1)
		}
	}
	return freed
}

// Delete removes key and reports whether it was there.
func (p *Store) Delete(ctx context.Context, key []byte) (bool, error) {
	return p.deleteIf(ctx, key, 0, false)
}

// DeleteIfVersion removes key's entry only if its version is version
// (compare-and-delete, under the bucket lock): ErrNotFound without a live
// entry, ErrExists if the version differs.
func (p *Store) DeleteIfVersion(ctx context.Context, key []byte, version uint64) error {
	found, err := p.deleteIf(ctx, key, version, true)
	if err == nil && !found {
		return ErrNotFound
	}
	return err
}

// deleteIf removes key's entry, if cond only when version is the entry's.
func (p *Store) deleteIf(ctx context.Context, key []byte, version uint64, cond bool) (bool, error) {
	h := hashKey(key)
	bk := p.bucketOff(h)
	if err := p.lock(ctx, bk); err != nil {
		return false, err
	}
	l := p.lockOf(bk)
	l.BeginWrite()
	cur, i, found := p.lookup(bk, h, key, time.Now().UnixNano())
	var freed []record
	var err error
	switch {
	case found && cond && cur.info().Version != version:
		err = ErrExists
	case found:
		freed = append(freed, p.clearSlot(slotOff(bk, i)))
	}
	l.EndWrite()
	p.unlock(bk)
	if err != nil {
		return true, err
	}
	p.release(freed)
	if found {
		p.stat(stDeletes).Add(1)
	}
	return found, nil
}

// Touch sets a live entry's time to live (0: never expires).
func (p *Store) Touch(ctx context.Context, key []byte, ttl time.Duration) error {
	h := hashKey(key)
	bk := p.bucketOff(h)
	if err := p.lock(ctx, bk); err != nil {
		return err
	}
	defer p.unlock(bk)
	r, _, found := p.lookup(bk, h, key, time.Now().UnixNano())
	if !found {
		return ErrNotFound
	}
	var exp int64
	if ttl > 0 {
		exp = time.Now().Add(ttl).UnixNano()
	}
	w, err := shm.WordIn(r.b(), rOffExpire)
	if err != nil {
		return err
	}
	w.Store(uint64(exp))
	return nil
}

// Flush removes every entry.
func (p *Store) Flush(ctx context.Context) error {
	for i := range p.nbuckets {
		bk := headerSize + int(i)*bucketSize
		if err := p.lock(ctx, bk); err != nil {
			return err
		}
		l := p.lockOf(bk)
		l.BeginWrite()
		var freed []record
		for j := range slotsPerBkt {
			s := slotOff(bk, j)
			if p.word(s+sOffHash).Load() != 0 {
				freed = append(freed, p.clearSlot(s))
			}
		}
		l.EndWrite()
		p.unlock(bk)
		p.release(freed)
	}
	return nil
}

// testHookMidWrite runs in the middle of a Set's change to its bucket, so
// crash tests can kill a writer there.
var testHookMidWrite func()

// lockTimeout bounds the wait for a live writer's bucket lock, or for its
// write to end (tests shorten it).
var lockTimeout = 5 * time.Second

// readyTimeout bounds Open's wait for the store's creator to finish it.
const readyTimeout = 2 * time.Second

// lock takes a bucket's lock. A lock whose holder died is taken over, and
// the bucket repaired, since its writer may have stopped half-way.
func (p *Store) lock(ctx context.Context, bk int) error {
	_, err := p.lockWithin(ctx, bk, lockTimeout)
	return err
}

// lockWithin is lock waiting at most patience for a live holder. If it
// took the lock over, from a writer that died or from a write left open
// with nobody holding the lock (then wrapping shm.ErrCorrupt), it repairs
// the bucket and says why in repaired.
func (p *Store) lockWithin(ctx context.Context, bk int, patience time.Duration) (repaired, err error) {
	err = p.lockOf(bk).LockContext(ctx, patience)
	switch {
	case err == nil:
		return nil, nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return nil, fmt.Errorf("cache: waiting for bucket %d: %w", (bk-headerSize)/bucketSize, err)
	case errors.Is(err, shm.ErrOwnerDied):
		p.repair(bk)
		p.log.Warn("cache: took over a bucket whose writer died holding it, and repaired it",
			"bucket", (bk-headerSize)/bucketSize, "err", err)
		return err, nil
	case errors.Is(err, shm.ErrHeld):
		return nil, fmt.Errorf("%w: bucket %d: %w (a stopped or stuck writer; its lock is taken over once it exits)",
			ErrBusy, (bk-headerSize)/bucketSize, err)
	}
	return nil, err
}

func (p *Store) unlock(bk int) { p.lockOf(bk).Unlock() }

// repair checks every entry of a bucket that Lock took over with its
// write open (lock held). An entry whose record does not verify is
// dropped; the others' records are handed to the table again, since the
// writer may have died after linking its new record and before sharing
// it, or after taking an old one back and before unlinking it. Then the
// write is closed. The writer may also have left the counters half
// changed: repair asks for a recount (maintain and Repair do it, with
// every bucket locked).
func (p *Store) repair(bk int) {
	p.stat(stRepairs).Add(1)
	p.word(hOffRecount).Store(1)
	var freed []record
	for i := range slotsPerBkt {
		s := slotOff(bk, i)
		h := p.word(s + sOffHash).Load()
		if h == 0 {
			continue
		}
		if !p.validSlot(s, h) || !p.reshare(s) {
			freed = append(freed, p.clearSlot(s))
		}
	}
	p.lockOf(bk).EndWrite()
	p.release(freed)
}

// reshare hands the record slot s names to the table (lock held), from
// whichever process held it; false if it is gone.
func (p *Store) reshare(s int) bool {
	b, err := p.pool.Adopt(p.slotHandle(s))
	return err == nil && b.Share() == nil
}

// validSlot checks that a slot names a loaned record whose checksum, key
// hash and size agree with it.
func (p *Store) validSlot(s int, h uint64) bool {
	r, ok := p.resolve(p.word(s+sOffHandle).Load(), p.word(s+sOffOffset).Load())
	if !ok {
		return false
	}
	k, v, ok := r.parse()
	if !ok || hashKey(k) != h {
		return false
	}
	b := r.b()
	return binary.LittleEndian.Uint64(b[rOffSum:]) == checksum(b, len(k), len(v)) &&
		p.word(s+sOffSize).Load()&^refBit == uint64(len(b))
}

// Stats are a store's counters, summed over every process.
type Stats struct {
	Hits, Misses, Sets, Deletes, Evictions, Expired uint64
	// Repairs counts buckets taken over from a writer that died holding
	// their lock.
	Repairs uint64
	// Reclaimed counts buffers taken back from processes that died
	// (records being written or being freed, buffers they kept).
	Reclaimed uint64
	// Items and Bytes are the live entries and the bytes they hold
	// (rounded up to size classes); MaxBytes is the limit.
	Items, Bytes, MaxBytes uint64
}

// Stats reads the counters.
func (p *Store) Stats() Stats {
	var s Stats
	for i := range statStripes {
		base := hOffStats + i*stripeSize
		s.Hits += p.word(base + stHits*8).Load()
		s.Misses += p.word(base + stMisses*8).Load()
		s.Sets += p.word(base + stSets*8).Load()
		s.Deletes += p.word(base + stDeletes*8).Load()
		s.Evictions += p.word(base + stEvictions*8).Load()
		s.Expired += p.word(base + stExpired*8).Load()
		s.Repairs += p.word(base + stRepairs*8).Load()
		s.Reclaimed += p.word(base + stReclaimed*8).Load()
	}
	s.Items, s.Bytes, s.MaxBytes = p.items.Load(), p.used.Load(), uint64(p.maxBytes)
	return s
}

// ErrNotNumber: Incr or Decr found a value that is not a decimal number.
var ErrNotNumber = errors.New("cache: cannot increment or decrement non-numeric value")

// Incr adds delta to key's decimal value and returns the result, as
// memcached's incr does: the number wraps at 64 bits, and a result shorter
// than the old value is padded with spaces to its length.
func (p *Store) Incr(ctx context.Context, key []byte, delta uint64) (uint64, error) {
	return p.addNumber(ctx, key, func(cur uint64) uint64 { return cur + delta })
}

// Decr subtracts delta from key's decimal value, stopping at 0, and
// returns the result, as memcached's decr does (padded as Incr pads).
func (p *Store) Decr(ctx context.Context, key []byte, delta uint64) (uint64, error) {
	return p.addNumber(ctx, key, func(cur uint64) uint64 { return cur - min(delta, cur) })
}

// addNumber replaces key's decimal value cur with next(cur), by
// compare-and-swap, retrying while other writers intervene.
func (p *Store) addNumber(ctx context.Context, key []byte, next func(cur uint64) uint64) (uint64, error) {
	for {
		old, in, err := p.Get(ctx, key, nil)
		if err != nil {
			return 0, err
		}
		cur, perr := strconv.ParseUint(string(bytes.TrimRight(old, " ")), 10, 64)
		if perr != nil || len(old) == 0 {
			return 0, ErrNotNumber
		}
		cur = next(cur)
		nv := strconv.AppendUint(nil, cur, 10)
		for len(nv) < len(old) {
			nv = append(nv, ' ')
		}
		if _, err = p.Set(ctx, key, nv, p.sameAs(in)); err == nil {
			return cur, nil
		}
		if !errors.Is(err, ErrExists) && !errors.Is(err, ErrNotFound) {
			return 0, err
		}
	}
}

// Append adds data after key's value, keeping its flags and expiry.
func (p *Store) Append(ctx context.Context, key, data []byte) error {
	return p.edit(ctx, key, func(old []byte) []byte { return append(old, data...) })
}

// Prepend adds data before key's value, keeping its flags and expiry.
func (p *Store) Prepend(ctx context.Context, key, data []byte) error {
	return p.edit(ctx, key, func(old []byte) []byte {
		return append(append(make([]byte, 0, len(old)+len(data)), data...), old...)
	})
}

// edit replaces key's value old with change(old), by compare-and-swap,
// retrying while other writers intervene.
func (p *Store) edit(ctx context.Context, key []byte, change func(old []byte) []byte) error {
	for {
		old, in, err := p.Get(ctx, key, nil)
		if err != nil {
			return err
		}
		_, err = p.Set(ctx, key, change(old), p.sameAs(in))
		if err == nil || (!errors.Is(err, ErrExists) && !errors.Is(err, ErrNotFound)) {
			return err
		}
	}
}

// sameAs is a compare-and-swap on in's version that keeps its flags and
// expiry.
func (p *Store) sameAs(in Info) SetOptions {
	o := SetOptions{Mode: IfVersion, Version: in.Version, Flags: in.Flags}
	if !in.Expires.IsZero() {
		o.TTL = max(time.Until(in.Expires), time.Nanosecond)
	}
	return o
}

// ExpTime turns memcached's exptime (seconds; beyond 30 days a unix time)
// into a TTL for Set: 0 never expires, negative means already expired.
func ExpTime(seconds int64) time.Duration {
	switch {
	case seconds == 0:
		return 0
	case seconds < 0:
		return -1
	case seconds > 30*24*3600:
		if d := time.Until(time.Unix(seconds, 0)); d > 0 {
			return d
		}
		return -1
	}
	return time.Duration(seconds) * time.Second
}
