package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Pool layout, at a cacheLine-aligned offset of a segment:
//
//	header      0: magic u64, version u32, classes u32
//	           64: free sequence u32 (bumped when a buffer is freed and a
//	               loan waits), waiting loans u32 (generation<<16 | count),
//	               fruitless u32 (the waiting loans word at the last wake-up
//	               that woke nobody: see waiter)
//	classes   128: one line per class: size u64, count u64, descriptors u64
//	               (offset), data u64 (offset), free-list head u64
//	descriptors:   per buffer 32 bytes: state u64 (generation<<32 | state),
//	               owner u64 (process word), next u32 (free list, index+1),
//	               pad u32, loaner u64 (the loaning attachment's id)
//	data:          per class count x size bytes, aligned
//
// The free lists are Treiber stacks whose head packs a 32-bit tag with the
// index, so a pop that raced with pop-push-pop of the same buffer fails its
// compare-and-swap (no ABA). Offsets in the header are read and validated
// once, at attach; the hot path uses the validated copy.
const (
	poolMagic = 0x314c_4f4f_504b_4255 // "UBKPOOL1"
	// poolVersion 2: waiting loans carry a generation, and fruitless.
	poolVersion = 2

	poolOffMagic     = 0
	poolOffVersion   = 8
	poolOffClasses   = 12
	poolOffFreeSeq   = 64
	poolOffFreeWait  = 68
	poolOffFruitless = 72
	poolClassTable   = cacheLine
	maxPoolClasses   = 16
	maxPoolBytes     = 1 << 46

	classOffSize  = 0
	classOffCount = 8
	classOffDesc  = 16
	classOffData  = 24
	classOffFree  = 32

	descSize      = 32
	descOffState  = 0
	descOffOwner  = 8
	descOffNext   = 16
	descOffLoaner = 24

	stateFree   = 0
	stateInUse  = 1
	stateCached = 2 // free, kept in its owner's local cache

	// localCacheSize is how many free buffers per class an attachment keeps
	// for itself, so that a loan/return cycle touches no shared cache line.
	localCacheSize = 32
)

// PoolClass is one size class: Count buffers of Size bytes.
type PoolClass struct {
	Size  int
	Count int
}

// PoolConfig lists a pool's size classes.
type PoolConfig struct {
	Classes []PoolClass
}

// DefaultPoolConfig spreads roughly budget bytes over classes from 256 B to
// 1 MiB.
func DefaultPoolConfig(budget int) PoolConfig {
	sizes := []int{256, 4 << 10, 64 << 10, 1 << 20}
	var c PoolConfig
	for _, s := range sizes {
		n := budget / len(sizes) / s
		if n > 0 {
			c.Classes = append(c.Classes, PoolClass{Size: s, Count: n})
		}
	}
	return c
}

type poolClass struct {
	size  uint64
	count uint64
	desc  uint64 // offset of descriptors from pool start
	data  uint64 // offset of data from pool start
}

func (cfg PoolConfig) layout() ([]poolClass, int, error) {
	if len(cfg.Classes) == 0 || len(cfg.Classes) > maxPoolClasses {
		return nil, 0, errorf("pool needs 1 to %d size classes, got %d", maxPoolClasses, len(cfg.Classes))
	}
	cs := slices.Clone(cfg.Classes)
	slices.SortFunc(cs, func(a, b PoolClass) int { return a.Size - b.Size })
	off := poolClassTable + len(cs)*cacheLine
	out := make([]poolClass, len(cs))
	for i, c := range cs {
		if c.Size < 8 || c.Size > 1<<32 || c.Count < 1 || c.Count >= 1<<31 {
			return nil, 0, errorf("pool class %d: size %d and count %d out of range", i, c.Size, c.Count)
		}
		if i > 0 && c.Size == cs[i-1].Size {
			return nil, 0, errorf("pool classes repeat size %d", c.Size)
		}
		out[i] = poolClass{size: uint64(align8(c.Size)), count: uint64(c.Count), desc: uint64(off)}
		off += c.Count * descSize
	}
	// Sizes and counts may come from a hostile header: add with overflow
	// checks and refuse anything larger than a segment can be.
	total := uint64(off)
	for i := range out {
		a := uint64(dataAlign(out[i].size))
		total = (total + a - 1) &^ (a - 1)
		out[i].data = total
		hi, bytes := bits.Mul64(out[i].size, out[i].count)
		var carry uint64
		total, carry = bits.Add64(total, bytes, 0)
		if hi != 0 || carry != 0 || total > maxPoolBytes {
			return nil, 0, errorf("pool of more than %d bytes", uint64(maxPoolBytes))
		}
	}
	return out, int(total), nil
}

func dataAlign(size uint64) int {
	if size >= 4096 {
		return 4096
	}
	return 64
}

// PoolSize returns the number of segment bytes a pool with cfg occupies.
func PoolSize(cfg PoolConfig) (int, error) {
	_, n, err := cfg.layout()
	return n, err
}

// Pool is a slab allocator of buffers inside a segment, shared by every
// process that maps it. Buffers are named across processes by a Handle.
// Loan, Return, Resolve and Adopt are safe for concurrent use by any number
// of goroutines and processes.
type Pool struct {
	seg     *Segment
	off     uint64
	mem     []byte
	classes []poolClass
	segID   uint32
	local   []localCache
	me      uint64 // Self().word()
	loaner  uint64 // names this attachment in descriptors' loaner field
	// freeSeq is the futex word a waiting loan sleeps on; freeWaiters
	// counts the sleepers, so that a return makes no system call when
	// nobody waits, and fruitless tells it that those it counts are dead
	// (see waiter).
	freeSeq, freeWaiters, fruitless *atomic.Uint32
	// lastReclaim is when (unix ns) a LoanWait of this attachment last
	// reclaimed the buffers of dead processes.
	lastReclaim atomic.Int64
}

// loanWaitReclaimEvery is how often, at most, the LoanWaits of one
// attachment reclaim dead processes' buffers: a Reclaim reads every
// descriptor of the pool.
const loanWaitReclaimEvery = time.Second

// loanWaitReclaimHook, if set (by tests), runs before each Reclaim of a
// LoanWait.
var loanWaitReclaimHook func()

var attachments atomic.Uint64

// attachmentID is unique to one Pool attachment across processes: the
// process word with a per-process counter folded in. A buffer goes back to
// the local cache only of the attachment that loaned it, even when two
// attachments live in one process.
func attachmentID() uint64 { return Self().word() ^ attachments.Add(1)<<48 }

// localCache holds free buffers of one class that this attachment took from
// (or returned instead of to) the shared free list. They are marked
// stateCached with this process as owner, so Reclaim takes them back if the
// process dies.
type localCache struct {
	mu     sync.Mutex
	idx    []uint64
	closed bool // Close was called: returns go to the shared list
}

func attachPool(seg *Segment, off int, mem []byte, classes []poolClass) *Pool {
	p := &Pool{seg: seg, off: uint64(off), mem: mem, classes: classes, segID: seg.ID(), local: make([]localCache, len(classes)), me: Self().word(), loaner: attachmentID(),
		freeSeq: atomicU32(mem, poolOffFreeSeq), freeWaiters: atomicU32(mem, poolOffFreeWait), fruitless: atomicU32(mem, poolOffFruitless)}
	for i := range p.local {
		p.local[i].idx = make([]uint64, 0, localCacheSize)
	}
	return p
}

// CreatePool lays out a pool with cfg at offset off of seg's data area,
// overwriting what was there.
func CreatePool(seg *Segment, off int, cfg PoolConfig) (*Pool, error) {
	classes, size, err := cfg.layout()
	if err != nil {
		return nil, err
	}
	mem, err := region(seg, off, size)
	if err != nil {
		return nil, err
	}
	clear(mem[:poolClassTable+len(classes)*cacheLine])
	binary.LittleEndian.PutUint32(mem[poolOffVersion:], poolVersion)
	binary.LittleEndian.PutUint32(mem[poolOffClasses:], uint32(len(classes)))
	p := attachPool(seg, off, mem, classes)
	for i, c := range classes {
		t := mem[poolClassTable+i*cacheLine:]
		binary.LittleEndian.PutUint64(t[classOffSize:], c.size)
		binary.LittleEndian.PutUint64(t[classOffCount:], c.count)
		binary.LittleEndian.PutUint64(t[classOffDesc:], c.desc)
		binary.LittleEndian.PutUint64(t[classOffData:], c.data)
		for j := range c.count {
			d := p.desc(i, j)
			binary.LittleEndian.PutUint64(d[descOffState:], 1<<32|stateFree)
			binary.LittleEndian.PutUint64(d[descOffOwner:], 0)
			next := uint32(j + 2)
			if j+1 == c.count {
				next = 0
			}
			binary.LittleEndian.PutUint32(d[descOffNext:], next)
		}
		binary.LittleEndian.PutUint64(t[classOffFree:], 1) // tag 0, index 0
	}
	atomicU64(mem, poolOffMagic).Store(poolMagic)
	return p, nil
}

// OpenPool attaches to a pool another process created at offset off of seg,
// validating its layout.
func OpenPool(seg *Segment, off int) (*Pool, error) {
	hdr, err := region(seg, off, poolClassTable+maxPoolClasses*cacheLine)
	if err != nil {
		hdr, err = region(seg, off, poolClassTable+cacheLine)
		if err != nil {
			return nil, err
		}
	}
	if atomicU64(hdr, poolOffMagic).Load() != poolMagic {
		return nil, corruptf("no pool at offset %d (bad magic)", off)
	}
	if v := binary.LittleEndian.Uint32(hdr[poolOffVersion:]); v != poolVersion {
		return nil, errorf("pool version %d, this ubkit speaks %d", v, poolVersion)
	}
	n := int(binary.LittleEndian.Uint32(hdr[poolOffClasses:]))
	if n < 1 || n > maxPoolClasses || poolClassTable+n*cacheLine > len(hdr) {
		return nil, corruptf("pool with %d size classes", n)
	}
	var cfg PoolConfig
	for i := range n {
		t := hdr[poolClassTable+i*cacheLine:]
		size := binary.LittleEndian.Uint64(t[classOffSize:])
		count := binary.LittleEndian.Uint64(t[classOffCount:])
		if size > 1<<32 || count >= 1<<31 {
			return nil, corruptf("pool class %d: %d buffers of %d bytes", i, count, size)
		}
		cfg.Classes = append(cfg.Classes, PoolClass{Size: int(size), Count: int(count)})
	}
	// Recompute the layout from sizes and counts and insist the stored
	// offsets agree: then every offset we use is one we computed.
	classes, size, err := cfg.layout()
	if err != nil {
		return nil, corruptf("pool layout: %v", err)
	}
	for i, c := range classes {
		t := hdr[poolClassTable+i*cacheLine:]
		if binary.LittleEndian.Uint64(t[classOffDesc:]) != c.desc || binary.LittleEndian.Uint64(t[classOffData:]) != c.data ||
			binary.LittleEndian.Uint64(t[classOffSize:]) != c.size {
			return nil, corruptf("pool class %d offsets disagree with its sizes", i)
		}
	}
	mem, err := region(seg, off, size)
	if err != nil {
		return nil, corruptf("pool of %d bytes: %v", size, err)
	}
	return attachPool(seg, off, mem, classes), nil
}

func (p *Pool) desc(class int, idx uint64) []byte {
	o := p.classes[class].desc + idx*descSize
	return p.mem[o : o+descSize]
}

func (p *Pool) freeHead(class int) *atomic.Uint64 {
	return atomicU64(p.mem, poolClassTable+class*cacheLine+classOffFree)
}

// Buffer is a loaned pool buffer. Its bytes are shared memory: any process
// holding the handle can read and write them.
type Buffer struct {
	pool  *Pool
	class int
	idx   uint64
	gen   uint32
	data  []byte
}

// Bytes returns the whole buffer (its class size, which may exceed the size
// asked for).
func (b Buffer) Bytes() []byte { return b.data }

// Handle returns the name of the buffer that other processes can Resolve.
func (b Buffer) Handle() Handle { return b.pool.handle(b.class, b.idx, b.gen) }

func (p *Pool) handle(class int, idx uint64, gen uint32) Handle {
	c := p.classes[class]
	return Handle{Segment: p.segID, Gen: gen, Offset: p.off + c.data + idx*c.size}
}

// Return gives the buffer back to its pool.
func (b Buffer) Return() error { return b.pool.release(b.class, b.idx, b.gen) }

// Loan takes a buffer of at least n bytes from the smallest class that has
// one free, owned by the calling process until it returns it or another
// process adopts it. It fails at once with ErrPoolExhausted if every
// fitting class is empty; LoanWait waits instead.
func (p *Pool) Loan(n int) (Buffer, error) {
	b, err := p.loan(n)
	if err == ErrPoolExhausted {
		return Buffer{}, fmt.Errorf("%w: no free buffer of %d bytes or more", ErrPoolExhausted, n)
	}
	return b, err
}

// LoanWait is Loan that waits, with w's strategy, until a buffer of at
// least n bytes is free or ctx ends (then it returns ctx.Err()). A return
// by any process wakes it. After 20 ms of waiting, and then at most once a
// second for all the LoanWaits of this attachment, it reclaims the buffers
// of processes that died (a scan of every descriptor), so a dead holder
// does not keep it waiting. Buffers kept in another attachment's local
// cache are not free to it until that attachment loans them or closes.
func (p *Pool) LoanWait(ctx context.Context, n int, w Wait) (Buffer, error) {
	b, err := p.Loan(n)
	if !errors.Is(err, ErrPoolExhausted) {
		return b, err
	}
	err = w.wait(ctx, waiter{
		ready: func() (bool, error) {
			var lerr error
			if b, lerr = p.loan(n); lerr == ErrPoolExhausted {
				return false, nil
			}
			return true, lerr
		},
		seq:       p.freeSeq,
		waiters:   p.freeWaiters,
		fruitless: p.fruitless,
		peer: func() error {
			now := time.Now().UnixNano()
			if last := p.lastReclaim.Load(); now-last >= int64(loanWaitReclaimEvery) && p.lastReclaim.CompareAndSwap(last, now) {
				if loanWaitReclaimHook != nil {
					loanWaitReclaimHook()
				}
				p.Reclaim()
			}
			return nil
		},
	})
	return b, err
}

// loan is Loan returning the bare ErrPoolExhausted, without allocating, for
// waiters that try again and again.
func (p *Pool) loan(n int) (Buffer, error) {
	if n < 0 {
		return Buffer{}, errorf("loan of %d bytes", n)
	}
	first := -1
	for i := range p.classes {
		if p.classes[i].size < uint64(n) {
			continue
		}
		if first < 0 {
			first = i
		}
		if b, ok, err := p.fromLocal(i); ok || err != nil {
			return b, err
		}
		b, err := p.pop(i)
		if err != ErrPoolExhausted {
			return b, err
		}
	}
	if first < 0 {
		return Buffer{}, fmt.Errorf("%w: %d bytes, largest pool buffer is %d", ErrTooLarge, n, p.classes[len(p.classes)-1].size)
	}
	return Buffer{}, ErrPoolExhausted
}

// freed wakes loans waiting for a buffer, if any; a buffer was just made
// free.
func (p *Pool) freed() { wake(p.freeSeq, p.freeWaiters, p.fruitless, true) }

func (p *Pool) pop(class int) (Buffer, error) {
	c := p.classes[class]
	head := p.freeHead(class)
	for {
		h := head.Load()
		idx := h & 0xffffffff
		if idx == 0 {
			return Buffer{}, ErrPoolExhausted
		}
		if idx > c.count {
			return Buffer{}, corruptf("pool class %d free list names buffer %d of %d", class, idx-1, c.count)
		}
		d := p.desc(class, idx-1)
		next := uint64(atomicU32(d, descOffNext).Load())
		if next > c.count {
			// Possibly a stale read that the compare-and-swap would reject.
			if head.Load() != h {
				continue
			}
			return Buffer{}, corruptf("pool class %d buffer %d links to %d of %d", class, idx-1, next-1, c.count)
		}
		if !head.CompareAndSwap(h, (h>>32+1)<<32|next) {
			continue
		}
		st := atomicU64(d, descOffState)
		s := st.Load()
		if s&0xffffffff != stateFree {
			return Buffer{}, corruptf("pool class %d buffer %d on the free list is in use", class, idx-1)
		}
		atomicU64(d, descOffOwner).Store(p.me)
		atomicU64(d, descOffLoaner).Store(p.loaner)
		if !st.CompareAndSwap(s, s&^0xffffffff|stateInUse) {
			return Buffer{}, corruptf("pool class %d buffer %d changed while being loaned", class, idx-1)
		}
		o := c.data + (idx-1)*c.size
		return Buffer{pool: p, class: class, idx: idx - 1, gen: uint32(s >> 32), data: p.mem[o : o+c.size : o+c.size]}, nil
	}
}

// fromLocal loans a buffer from this attachment's cache of class.
func (p *Pool) fromLocal(class int) (Buffer, bool, error) {
	lc := &p.local[class]
	lc.mu.Lock()
	n := len(lc.idx)
	if n == 0 {
		lc.mu.Unlock()
		return Buffer{}, false, nil
	}
	idx := lc.idx[n-1]
	lc.idx = lc.idx[:n-1]
	lc.mu.Unlock()
	st := atomicU64(p.desc(class, idx), descOffState)
	s := st.Load()
	if s&0xffffffff != stateCached || !st.CompareAndSwap(s, s&^0xffffffff|stateInUse) {
		return Buffer{}, false, corruptf("pool class %d buffer %d in our cache changed state to %x", class, idx, s)
	}
	c := p.classes[class]
	o := c.data + idx*c.size
	return Buffer{pool: p, class: class, idx: idx, gen: uint32(s >> 32), data: p.mem[o : o+c.size : o+c.size]}, true, nil
}

func (p *Pool) push(class int, idx uint64) {
	head := p.freeHead(class)
	d := p.desc(class, idx)
	for {
		h := head.Load()
		atomicU32(d, descOffNext).Store(uint32(h))
		if head.CompareAndSwap(h, (h>>32+1)<<32|(idx+1)) {
			return
		}
	}
}

// locate validates a handle against the pool's own layout and returns the
// class and index it names.
func (p *Pool) locate(h Handle) (int, uint64, error) {
	if h.Segment != p.segID {
		return 0, 0, fmt.Errorf("%w: %v belongs to segment %08x, not this pool's %08x", ErrInvalidHandle, h, h.Segment, p.segID)
	}
	if h.Offset < p.off {
		return 0, 0, fmt.Errorf("%w: %v is before the pool", ErrInvalidHandle, h)
	}
	rel := h.Offset - p.off
	for i, c := range p.classes {
		if rel < c.data || rel >= c.data+c.size*c.count {
			continue
		}
		o := rel - c.data
		if c.size&(c.size-1) == 0 {
			if o&(c.size-1) != 0 {
				return 0, 0, fmt.Errorf("%w: %v is not at a buffer boundary", ErrInvalidHandle, h)
			}
			return i, o >> bits.TrailingZeros64(c.size), nil
		}
		if o%c.size != 0 {
			return 0, 0, fmt.Errorf("%w: %v is not at a buffer boundary", ErrInvalidHandle, h)
		}
		return i, o / c.size, nil
	}
	return 0, 0, fmt.Errorf("%w: %v is not inside any size class", ErrInvalidHandle, h)
}

// Resolve returns the buffer a handle names, checking that it is loaned and
// that the generation matches. It does not change the owner.
func (p *Pool) Resolve(h Handle) (Buffer, error) {
	class, idx, err := p.locate(h)
	if err != nil {
		return Buffer{}, err
	}
	s := atomicU64(p.desc(class, idx), descOffState).Load()
	if uint32(s>>32) != h.Gen || s&0xffffffff != stateInUse {
		return Buffer{}, fmt.Errorf("%w: %v", ErrStaleHandle, h)
	}
	c := p.classes[class]
	o := c.data + idx*c.size
	return Buffer{pool: p, class: class, idx: idx, gen: h.Gen, data: p.mem[o : o+c.size : o+c.size]}, nil
}

// Adopt resolves a handle and makes the calling process the buffer's owner,
// so it is reclaimed with this process rather than with the sender. Adopt a
// buffer received from another process before relying on it.
func (p *Pool) Adopt(h Handle) (Buffer, error) {
	b, err := p.Resolve(h)
	if err != nil {
		return b, err
	}
	d := p.desc(b.class, b.idx)
	owner := atomicU64(d, descOffOwner)
	w := owner.Load()
	if w == p.me {
		return b, nil
	}
	if w == 0 || !owner.CompareAndSwap(w, p.me) {
		// Reclaim is taking it back from a dead owner.
		return Buffer{}, fmt.Errorf("%w: %v is being reclaimed", ErrStaleHandle, h)
	}
	// The buffer may have been returned, and loaned again, between Resolve
	// and the swap: then the owner we replaced is the new holder's, and goes
	// back.
	if s := atomicU64(d, descOffState).Load(); uint32(s>>32) != h.Gen || s&0xffffffff != stateInUse {
		owner.CompareAndSwap(p.me, w)
		return Buffer{}, fmt.Errorf("%w: %v", ErrStaleHandle, h)
	}
	return b, nil
}

// Return gives the buffer a handle names back to the pool. Returning a
// buffer twice, or with a stale handle, fails with ErrStaleHandle. The buffer
// may go to this attachment's local cache rather than the shared free list;
// Close gives cached buffers back.
func (p *Pool) Return(h Handle) error {
	class, idx, err := p.locate(h)
	if err != nil {
		return err
	}
	return p.release(class, idx, h.Gen)
}

func (p *Pool) release(class int, idx uint64, gen uint32) error {
	d := p.desc(class, idx)
	// Take ownership first: once the owner is us (alive), Reclaim leaves the
	// buffer alone; if Reclaim got there first, the owner reads 0 and the
	// buffer is already on its way back.
	me := p.me
	st := atomicU64(d, descOffState)
	inUse := uint64(gen)<<32 | stateInUse
	// A stale handle must not touch the owner of whoever holds the buffer now.
	if st.Load() != inUse {
		return fmt.Errorf("%w: buffer %d of class %d generation %d (double return?)", ErrStaleHandle, idx, class, gen)
	}
	owner := atomicU64(d, descOffOwner)
	w := owner.Load()
	if w != me && (w == 0 || !owner.CompareAndSwap(w, me)) {
		return fmt.Errorf("%w: buffer %d of class %d is being reclaimed", ErrStaleHandle, idx, class)
	}
	// If the state changes under us from here on, the buffer went back and
	// out again: restore the owner we replaced.
	restore := func() {
		if w != me {
			owner.CompareAndSwap(me, w)
		}
	}
	next := uint64(gen + 1)
	if next>>32 != 0 || next == 0 {
		next = 1
	}
	// A buffer this process loaned and returns itself goes to the local
	// cache; one that came from another process goes back to the shared list
	// where its loaner can find it again.
	lc := &p.local[class]
	mine := atomicU64(d, descOffLoaner).Load() == p.loaner
	lc.mu.Lock()
	if mine && !lc.closed && len(lc.idx) < localCacheSize {
		if !st.CompareAndSwap(inUse, next<<32|stateCached) {
			lc.mu.Unlock()
			restore()
			return fmt.Errorf("%w: buffer %d of class %d generation %d (double return?)", ErrStaleHandle, idx, class, gen)
		}
		lc.idx = append(lc.idx, idx)
		lc.mu.Unlock()
		p.freed()
		return nil
	}
	lc.mu.Unlock()
	if !st.CompareAndSwap(inUse, next<<32|stateFree) {
		restore()
		return fmt.Errorf("%w: buffer %d of class %d generation %d (double return?)", ErrStaleHandle, idx, class, gen)
	}
	owner.Store(0)
	p.push(class, idx)
	p.freed()
	return nil
}

// Close gives the buffers in this attachment's local caches back to the
// shared free lists. Loaned buffers stay loaned. The Pool may still be used
// after Close, without local caches: buffers returned through it go to the
// shared lists, where other attachments find them.
func (p *Pool) Close() error {
	var errs []error
	pushed := false
	for class := range p.local {
		lc := &p.local[class]
		lc.mu.Lock()
		idxs := lc.idx
		lc.idx = nil
		lc.closed = true
		lc.mu.Unlock()
		for _, idx := range idxs {
			d := p.desc(class, idx)
			st := atomicU64(d, descOffState)
			s := st.Load()
			if s&0xffffffff != stateCached || !st.CompareAndSwap(s, s&^0xffffffff|stateFree) {
				errs = append(errs, corruptf("pool class %d buffer %d in our cache changed state to %x", class, idx, s))
				continue
			}
			atomicU64(d, descOffOwner).Store(0)
			p.push(class, idx)
			pushed = true
		}
	}
	// Only then: a Close with nothing cached touches no shared memory
	// (callers close twice, the second time after unmapping).
	if pushed {
		p.freed()
	}
	return errors.Join(errs...)
}

// sharedOwner marks a buffer that belongs to a structure in shared memory
// rather than to a process (no process has PID 0).
const sharedOwner = 1

// Share hands a loaned buffer over to a structure in shared memory (a table
// that points at it, say): it stops belonging to this process, so Reclaim
// leaves it alone when the process exits, and any process may Return it by
// its handle. Publish the handle before sharing, so that a crash in
// between leaves a buffer Reclaim takes back rather than one nobody frees.
func (b Buffer) Share() error {
	p := b.pool
	d := p.desc(b.class, b.idx)
	if atomicU64(d, descOffState).Load() != uint64(b.gen)<<32|stateInUse {
		return fmt.Errorf("%w: buffer %d of class %d generation %d", ErrStaleHandle, b.idx, b.class, b.gen)
	}
	owner := atomicU64(d, descOffOwner)
	if w := owner.Load(); w != sharedOwner && !owner.CompareAndSwap(p.me, sharedOwner) {
		return fmt.Errorf("%w: buffer %d of class %d is not this process's", ErrStaleHandle, b.idx, b.class)
	}
	return nil
}

// Shared calls fn with the handle of every loaned buffer that was shared,
// for sweeps that free the ones a crashed process left unreferenced.
func (p *Pool) Shared(fn func(Handle)) {
	for class, c := range p.classes {
		for idx := range c.count {
			d := p.desc(class, idx)
			s := atomicU64(d, descOffState).Load()
			if s&0xffffffff != stateInUse || atomicU64(d, descOffOwner).Load() != sharedOwner {
				continue
			}
			fn(p.handle(class, idx, uint32(s>>32)))
		}
	}
}

// Reclaim returns to the pool every buffer whose owning process has exited,
// loaned or kept in its local cache, and reports how many it took back.
func (p *Pool) Reclaim() int {
	alive := map[uint64]bool{}
	n := 0
	for class, c := range p.classes {
		for idx := range c.count {
			d := p.desc(class, idx)
			st := atomicU64(d, descOffState)
			s := st.Load()
			state := s & 0xffffffff
			if state != stateInUse && state != stateCached {
				continue
			}
			owner := atomicU64(d, descOffOwner)
			w := owner.Load()
			if w == sharedOwner {
				continue
			}
			// Owner 0 on a loaned or cached buffer: another Reclaim is
			// between its two swaps, or died there. The state swap below
			// lets exactly one finish.
			if w != 0 {
				a, seen := alive[w]
				if !seen {
					a = aliveWord(w)
					alive[w] = a
				}
				if a || !owner.CompareAndSwap(w, 0) {
					continue
				}
			}
			gen := s >> 32
			if state == stateInUse {
				// Outstanding handles of the dead owner must go stale.
				if gen++; uint32(gen) == 0 {
					gen = 1
				}
			}
			if st.CompareAndSwap(s, gen<<32|stateFree) {
				p.push(class, idx)
				n++
			}
		}
	}
	if n > 0 {
		p.freed()
	}
	return n
}

// ClassStats describes one size class.
type ClassStats struct {
	Size  int
	Count int
	InUse int
}

// Stats reports every class's size, buffer count and buffers loaned, by
// scanning the descriptors: it is meant for monitoring, not hot paths.
func (p *Pool) Stats() []ClassStats {
	out := make([]ClassStats, len(p.classes))
	for i, c := range p.classes {
		inUse := 0
		for idx := range c.count {
			if atomicU64(p.desc(i, idx), descOffState).Load()&0xffffffff == stateInUse {
				inUse++
			}
		}
		out[i] = ClassStats{Size: int(c.size), Count: int(c.count), InUse: inUse}
	}
	return out
}
