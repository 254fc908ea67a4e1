package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// SPSC ring layout, at a cacheLine-aligned offset of a segment:
//
//	control line   0: magic u64, version u32, pad u32, capacity u64,
//	                  producer u64 (process word), consumer u64, closed u32
//	producer line 128: tail u64, dataSeq u32 (futex), consumerWaiters u32
//	consumer line 256: head u64, spaceSeq u32 (futex), producerWaiters u32,
//	                  spaceWant u64 (the head a sleeping producer waits for)
//	data          384: capacity bytes of records
//
// head and tail count bytes since the ring was created; they never wrap in
// practice (2^64 bytes). A record is an 8-byte header (payload length u32,
// reserved u32) followed by the payload, padded to 8 bytes. A record never
// wraps around the end of the data area: the producer writes a padding
// header (length padMarker) and starts again at offset 0.
const (
	spscMagic   = 0x3143_5350_534b_4255 // "UBKSPSC1"
	spscVersion = 1

	spscOffMagic    = 0
	spscOffVersion  = 8
	spscOffCap      = 16
	spscOffProducer = 24
	spscOffConsumer = 32
	spscOffClosed   = 40

	spscOffTail            = cacheLine
	spscOffDataSeq         = cacheLine + 8
	spscOffConsumerWaiters = cacheLine + 12

	spscOffHead            = 2 * cacheLine
	spscOffSpaceSeq        = 2*cacheLine + 8
	spscOffProducerWaiters = 2*cacheLine + 12
	spscOffSpaceWant       = 2*cacheLine + 16 // zero in rings made before it: wake at every release

	spscHeaderSize = 3 * cacheLine

	recordHeader = 8
	padMarker    = 0xffff_ffff

	closedProducer = 1
	closedConsumer = 2
)

// SPSCSize returns the number of segment bytes an SPSC ring with the given
// data capacity occupies.
func SPSCSize(capacity int) int { return spscHeaderSize + capacity }

// SPSC is a single-producer single-consumer ring of variable-length records
// in shared memory. One process attaches as Producer and one as Consumer;
// they may be the same process. Records are read in place, without a copy.
type SPSC struct {
	key      endKey
	mem      []byte
	data     []byte
	capacity int
	mask     uint64

	tail, head                 *atomic.Uint64
	dataSeq, consumerWaiters   *atomic.Uint32
	spaceSeq, producerWaiters  *atomic.Uint32
	spaceWant                  *atomic.Uint64
	producerWord, consumerWord *atomic.Uint64
	closed                     *atomic.Uint32
}

// CreateSPSC initializes a ring with capacity data bytes (a power of two, at
// least 64) at offset off of seg's data area, overwriting what was there.
func CreateSPSC(seg *Segment, off, capacity int) (*SPSC, error) {
	if capacity < 64 || capacity&(capacity-1) != 0 || capacity > 1<<31 {
		return nil, errorf("ring capacity %d must be a power of two between 64 and 2^31", capacity)
	}
	mem, err := region(seg, off, SPSCSize(capacity))
	if err != nil {
		return nil, err
	}
	clear(mem[:spscHeaderSize])
	binary.LittleEndian.PutUint32(mem[spscOffVersion:], spscVersion)
	binary.LittleEndian.PutUint64(mem[spscOffCap:], uint64(capacity))
	atomicU64(mem, spscOffMagic).Store(spscMagic)
	return attachSPSC(mem, capacity, endKey{seg.ID(), off}), nil
}

// OpenSPSC attaches to a ring that another process created at offset off of
// seg, validating its header.
func OpenSPSC(seg *Segment, off int) (*SPSC, error) {
	hdr, err := region(seg, off, spscHeaderSize)
	if err != nil {
		return nil, err
	}
	if atomicU64(hdr, spscOffMagic).Load() != spscMagic {
		return nil, corruptf("no SPSC ring at offset %d (bad magic)", off)
	}
	if v := binary.LittleEndian.Uint32(hdr[spscOffVersion:]); v != spscVersion {
		return nil, errorf("SPSC ring version %d, this ubkit speaks %d", v, spscVersion)
	}
	c := binary.LittleEndian.Uint64(hdr[spscOffCap:])
	if c < 64 || c&(c-1) != 0 || c > 1<<31 {
		return nil, corruptf("SPSC ring capacity %d", c)
	}
	mem, err := region(seg, off, SPSCSize(int(c)))
	if err != nil {
		return nil, corruptf("SPSC ring capacity %d: %v", c, err)
	}
	return attachSPSC(mem, int(c), endKey{seg.ID(), off}), nil
}

func attachSPSC(mem []byte, capacity int, key endKey) *SPSC {
	return &SPSC{
		key:             key,
		mem:             mem,
		data:            mem[spscHeaderSize:],
		capacity:        capacity,
		mask:            uint64(capacity - 1),
		tail:            atomicU64(mem, spscOffTail),
		head:            atomicU64(mem, spscOffHead),
		dataSeq:         atomicU32(mem, spscOffDataSeq),
		consumerWaiters: atomicU32(mem, spscOffConsumerWaiters),
		spaceSeq:        atomicU32(mem, spscOffSpaceSeq),
		producerWaiters: atomicU32(mem, spscOffProducerWaiters),
		spaceWant:       atomicU64(mem, spscOffSpaceWant),
		producerWord:    atomicU64(mem, spscOffProducer),
		consumerWord:    atomicU64(mem, spscOffConsumer),
		closed:          atomicU32(mem, spscOffClosed),
	}
}

// Capacity returns the ring's data capacity in bytes.
func (r *SPSC) Capacity() int { return r.capacity }

// MaxRecord returns the largest payload a single record can carry.
func (r *SPSC) MaxRecord() int { return r.capacity - recordHeader }

// endKey names a ring end within this process: segment id, ring offset and
// the end (producer or consumer).
type endKey struct {
	seg uint32
	off int
}

// attached records the ring ends this process holds, so that the same
// process cannot attach one end twice (two producers would corrupt the ring,
// and shared memory alone cannot tell them apart: they have the same pid).
var attached = struct {
	sync.Mutex
	ends map[endKey]uint32
}{ends: map[endKey]uint32{}}

func claimEnd(key endKey, bit uint32, word *atomic.Uint64) error {
	attached.Lock()
	defer attached.Unlock()
	if attached.ends[key]&bit != 0 {
		return fmt.Errorf("%w (this process, not yet closed)", ErrBusy)
	}
	me := Self().word()
	for {
		cur := word.Load()
		if cur != 0 && cur != me && aliveWord(cur) {
			p := processFromWord(cur)
			return fmt.Errorf("%w (pid %d)", ErrBusy, p.PID)
		}
		if word.CompareAndSwap(cur, me) {
			attached.ends[key] |= bit
			return nil
		}
	}
}

func releaseEnd(key endKey, bit uint32, word *atomic.Uint64) {
	attached.Lock()
	defer attached.Unlock()
	if attached.ends[key] &^= bit; attached.ends[key] == 0 {
		delete(attached.ends, key)
	}
	word.CompareAndSwap(Self().word(), 0)
}

// peerCheck returns the liveness check for the side whose identity is in
// word and whose close bit is closedBit.
func (r *SPSC) peerCheck(word *atomic.Uint64, closedBit uint32) func() error {
	return func() error {
		if r.closed.Load()&closedBit != 0 {
			return ErrClosed
		}
		w := word.Load()
		if w != 0 && !aliveWord(w) {
			return fmt.Errorf("%w (pid %d)", ErrPeerDead, processFromWord(w).PID)
		}
		return nil
	}
}

// Producer attaches the calling process as the ring's producer. It fails
// with ErrBusy if a live process already is.
func (r *SPSC) Producer(w Wait) (*Producer, error) {
	if err := claimEnd(r.key, closedProducer, r.producerWord); err != nil {
		return nil, err
	}
	// A new producer: whatever an earlier one closed is open again.
	r.closed.And(^uint32(closedProducer))
	t := r.tail.Load()
	if t&7 != 0 {
		return nil, corruptf("ring tail %d is not 8-byte aligned", t)
	}
	p := &Producer{r: r, wait: w, tail: t, claim: t, head: r.head.Load(),
		data: r.data, mask: r.mask, capacity: uint64(r.capacity), maxRecord: uint64(r.capacity - recordHeader)}
	p.peer = r.peerCheck(r.consumerWord, closedConsumer)
	return p, nil
}

// Consumer attaches the calling process as the ring's consumer. It fails
// with ErrBusy if a live process already is.
func (r *SPSC) Consumer(w Wait) (*Consumer, error) {
	if err := claimEnd(r.key, closedConsumer, r.consumerWord); err != nil {
		return nil, err
	}
	r.closed.And(^uint32(closedConsumer))
	h := r.head.Load()
	if h&7 != 0 {
		return nil, corruptf("ring head %d is not 8-byte aligned", h)
	}
	c := &Consumer{r: r, wait: w, head: h, read: h, tail: h,
		data: r.data, mask: r.mask, capacity: uint64(r.capacity), maxRecord: uint64(r.capacity - recordHeader)}
	c.peer = r.peerCheck(r.producerWord, closedProducer)
	return c, nil
}

// Producer is the writing end of an SPSC ring. It is not safe for concurrent
// use; one goroutine produces.
type Producer struct {
	r    *SPSC
	wait Wait
	peer func() error

	// Copies of the ring's geometry for the fast path.
	data                      []byte
	mask, capacity, maxRecord uint64

	tail  uint64 // published tail
	claim uint64 // end of claimed, unpublished records
	head  uint64 // last head seen
	done  bool   // Close was called
}

// Claim reserves room for a record of n payload bytes and returns the
// payload to fill in place. Claimed records become visible to the consumer,
// in order, at the next Commit. It returns ErrRingFull if there is no room
// now; fill every claimed record before the next Claim or ClaimWait.
func (p *Producer) Claim(n int) ([]byte, error) {
	// Fast path: the record fits before the end of
	// the data area and within the space last known to be free.
	need := uint64(recordHeader + (n+7)&^7)
	pos := p.claim & p.mask
	if uint64(n) <= p.maxRecord && pos+need <= p.capacity && p.claim+need-p.head <= p.capacity {
		binary.LittleEndian.PutUint64(p.data[pos:pos+8], uint64(n))
		p.claim += need
		return p.data[pos+8 : pos+8+uint64(n) : pos+8+uint64(n)], nil
	}
	return p.claimSlow(n)
}

func (p *Producer) claimSlow(n int) ([]byte, error) {
	r := p.r
	if p.done {
		return nil, ErrClosed
	}
	if n < 0 || n > r.capacity-recordHeader {
		return nil, fmt.Errorf("%w: record of %d bytes, ring holds at most %d", ErrTooLarge, n, r.capacity-recordHeader)
	}
	need := uint64(recordHeader + align8(n))
	pos := p.claim & r.mask
	toEnd := uint64(r.capacity) - pos
	total := need
	if toEnd < need {
		total += toEnd
	}
	if p.claim+total-p.head > uint64(r.capacity) {
		if err := p.refreshHead(); err != nil {
			return nil, err
		}
		if p.claim+total-p.head > uint64(r.capacity) {
			return nil, ErrRingFull
		}
	}
	if toEnd < need {
		binary.LittleEndian.PutUint32(r.data[pos:], padMarker)
		p.claim += toEnd
		pos = 0
	}
	binary.LittleEndian.PutUint64(r.data[pos:], uint64(n))
	p.claim += need
	start := pos + recordHeader
	return r.data[start : start+uint64(n) : start+uint64(n)], nil
}

func (p *Producer) refreshHead() error {
	h := p.r.head.Load()
	if h < p.head || h > p.tail || h&7 != 0 {
		return corruptf("ring head %d outside [%d, %d]", h, p.head, p.tail)
	}
	p.head = h
	return nil
}

// Commit publishes every record claimed since the last Commit with one store
// and wakes a sleeping consumer.
func (p *Producer) Commit() {
	if p.claim == p.tail {
		return
	}
	p.tail = p.claim
	p.r.tail.Store(p.claim)
	wake(p.r.dataSeq, p.r.consumerWaiters, nil, false)
}

// ClaimWait is Claim that waits, with the producer's wait strategy, until
// there is room, ctx ends, or the consumer dies or closes. It commits the
// records claimed so far before it waits.
func (p *Producer) ClaimWait(ctx context.Context, n int) ([]byte, error) {
	if p.r.closed.Load()&closedConsumer != 0 {
		return nil, fmt.Errorf("%w: the consumer closed the ring", ErrClosed)
	}
	b, err := p.Claim(n)
	if err != ErrRingFull {
		return b, err
	}
	p.Commit()
	if p.wait.Room > 0 {
		// Ask the consumer not to wake us before Room bytes (at least
		// this claim's) are free: fewer, larger refills when it is the
		// slower side, each a wake-up fewer.
		want := uint64(max(p.wait.Room, recordHeader+align8(n)))
		want = min(want, p.capacity)
		p.r.spaceWant.Store(p.claim + want - p.capacity)
		defer p.r.spaceWant.Store(0)
	}
	err = p.wait.wait(ctx, waiter{
		ready: func() (bool, error) {
			b, err = p.Claim(n)
			if err == ErrRingFull {
				return false, nil
			}
			return true, err
		},
		seq:     p.r.spaceSeq,
		waiters: p.r.producerWaiters,
		peer:    p.peer,
	})
	return b, err
}

// Send writes one record holding a copy of payload and commits it, waiting
// for room as ClaimWait does.
func (p *Producer) Send(ctx context.Context, payload []byte) error {
	b, err := p.ClaimWait(ctx, len(payload))
	if err != nil {
		return err
	}
	copyCached(b, payload)
	p.Commit()
	return nil
}

// copyCached copies src into dst in pieces small enough that the runtime's
// memmove uses ordinary stores: for 1 MiB and more it switches to
// non-temporal stores, which push the data out to DRAM just before the
// consumer reads it.
func copyCached(dst, src []byte) {
	const piece = 256 << 10
	for len(src) > piece {
		copy(dst[:piece], src[:piece])
		dst, src = dst[piece:], src[piece:]
	}
	copy(dst, src)
}

// Close commits pending records and tells the consumer no more will come:
// once it has read everything, it gets ErrClosed. Later calls on this
// Producer fail with ErrClosed. Another Producer may attach afterwards.
func (p *Producer) Close() error {
	if p.done {
		return nil
	}
	p.Commit()
	p.done = true
	p.capacity, p.maxRecord = 0, 0 // every Claim takes the slow path
	p.r.closed.Or(closedProducer)
	p.r.dataSeq.Add(1)
	futexWake(p.r.dataSeq, 1)
	releaseEnd(p.r.key, closedProducer, p.r.producerWord)
	return nil
}

// Consumer is the reading end of an SPSC ring. It is not safe for concurrent
// use; one goroutine consumes.
type Consumer struct {
	r    *SPSC
	wait Wait
	peer func() error

	// Copies of the ring's geometry for the fast path.
	data                      []byte
	mask, capacity, maxRecord uint64

	head uint64 // published head
	read uint64 // end of records returned, not yet released
	tail uint64 // last tail seen
	done bool   // Close was called
}

// Next returns the payload of the next record, in place in shared memory, or
// ErrRingEmpty. The bytes stay valid until Release (or a NextWait that has to
// wait); the producer cannot reuse them before. It returns ErrClosed once the
// producer closed and every record was read.
func (c *Consumer) Next() ([]byte, error) {
	// Fast path: a whole record lies between what we
	// read and the tail we last saw.
	if c.read != c.tail {
		pos := c.read & c.mask
		n := binary.LittleEndian.Uint64(c.data[pos : pos+8])
		need := recordHeader + (n+7)&^7
		if n <= c.maxRecord && c.read+need <= c.tail && pos+need <= c.capacity {
			c.read += need
			return c.data[pos+8 : pos+8+n : pos+8+n], nil
		}
	}
	return c.nextSlow()
}

// NextBatch appends to recs[:0] the payloads of up to cap(recs) records, in
// place as Next returns them, and returns the slice. It returns ErrRingEmpty
// only when there is no record at all; the records stay valid until Release.
func (c *Consumer) NextBatch(recs [][]byte) ([][]byte, error) {
	if cap(recs) == 0 {
		return recs, errorf("NextBatch needs a slice with room for at least one record")
	}
	recs = recs[:0]
	for len(recs) < cap(recs) {
		if c.read != c.tail {
			pos := c.read & c.mask
			n := binary.LittleEndian.Uint64(c.data[pos : pos+8])
			need := recordHeader + (n+7)&^7
			if n <= c.maxRecord && c.read+need <= c.tail && pos+need <= c.capacity {
				c.read += need
				recs = append(recs, c.data[pos+8:pos+8+n:pos+8+n])
				continue
			}
		}
		b, err := c.nextSlow()
		if err != nil {
			if len(recs) > 0 && err == ErrRingEmpty {
				return recs, nil
			}
			if len(recs) > 0 && errors.Is(err, ErrClosed) {
				// Report the records first; the next call returns ErrClosed.
				return recs, nil
			}
			return recs, err
		}
		recs = append(recs, b)
	}
	return recs, nil
}

func (c *Consumer) nextSlow() ([]byte, error) {
	r := c.r
	if c.done {
		return nil, ErrClosed
	}
	for range 2 {
		if c.read == c.tail {
			t := r.tail.Load()
			if t < c.tail || t-c.head > uint64(r.capacity) || t&7 != 0 {
				return nil, corruptf("ring tail %d outside [%d, %d]", t, c.tail, c.head+uint64(r.capacity))
			}
			c.tail = t
			if c.read == t {
				if r.closed.Load()&closedProducer != 0 && r.tail.Load() == t {
					return nil, ErrClosed
				}
				return nil, ErrRingEmpty
			}
		}
		pos := c.read & r.mask
		n := binary.LittleEndian.Uint64(r.data[pos:])
		if uint32(n) == padMarker {
			toEnd := uint64(r.capacity) - pos
			if pos == 0 || c.read+toEnd > c.tail {
				return nil, corruptf("padding record at %d runs past tail %d", c.read, c.tail)
			}
			c.read += toEnd
			continue
		}
		need := recordHeader + (n+7)&^7
		if n > uint64(r.capacity-recordHeader) || c.read+need > c.tail || pos+need > uint64(r.capacity) {
			return nil, corruptf("record of %d bytes at %d does not fit (tail %d)", n, c.read, c.tail)
		}
		c.read += need
		start := pos + recordHeader
		return r.data[start : start+n : start+n], nil
	}
	return nil, corruptf("two padding records in a row at %d", c.read)
}

// Release gives the space of every record returned by Next back to the
// producer with one store, and wakes a producer waiting for room.
func (c *Consumer) Release() {
	if c.read == c.head {
		return
	}
	c.head = c.read
	c.r.head.Store(c.read)
	if w := c.r.spaceWant.Load(); w != 0 && c.read < w {
		return // the producer asked to sleep until more is free
	}
	wake(c.r.spaceSeq, c.r.producerWaiters, nil, false)
}

// NextWait is Next that waits, with the consumer's wait strategy, until a
// record arrives, ctx ends, or the producer dies. It never releases records
// by itself: a consumer that keeps a whole ring's worth of records without
// calling Release leaves the producer no room and waits for ever (or until
// ctx ends).
func (c *Consumer) NextWait(ctx context.Context) ([]byte, error) {
	b, err := c.Next()
	if err != ErrRingEmpty {
		return b, err
	}
	err = c.wait.wait(ctx, waiter{
		ready: func() (bool, error) {
			b, err = c.Next()
			if err == ErrRingEmpty {
				return false, nil
			}
			return true, err
		},
		seq:     c.r.dataSeq,
		waiters: c.r.consumerWaiters,
		peer:    c.peer,
	})
	return b, err
}

// Close releases what was read and tells the producer nobody reads any more:
// its ClaimWait and Send fail with ErrClosed. Another Consumer may attach
// afterwards.
func (c *Consumer) Close() error {
	if c.done {
		return nil
	}
	c.Release()
	c.done = true
	c.tail = c.read // Next takes the slow path, which reports ErrClosed
	c.r.closed.Or(closedConsumer)
	c.r.spaceSeq.Add(1)
	futexWake(c.r.spaceSeq, 1)
	releaseEnd(c.r.key, closedConsumer, c.r.consumerWord)
	return nil
}
