package cache

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// A process that dies in the middle of a write leaves behind what it held:
// a bucket lock (taken over and the bucket repaired by the next writer), a
// record it had loaned and not yet linked or one it had unlinked and not
// yet returned (both its own buffers, which shm.Pool.Reclaim takes back),
// and counters it may have changed half-way (recounted). Every attached
// process is noted in a table in the header; the store's writes look at the
// table now and then (maintain) and take back what a dead process held,
// while the others go on writing.

const (
	// maintainEvery: the store's every maintainEvery-th write (by the
	// version counter, whichever process makes it) runs maintain.
	maintainEvery = 256
	// sweepInterval is how often, at most, an attachment looks for
	// attached processes that died.
	sweepInterval = 50 * time.Millisecond
	// recountPatience is how long a recount, which holds every other
	// bucket's lock meanwhile, waits for a bucket a live writer holds
	// before it gives up and leaves the recount for later: a write holds
	// a lock for microseconds, a stopped writer for as long as it is
	// stopped. repairPatience is Repair's, which is asked for.
	recountPatience = 2 * time.Millisecond
	repairPatience  = 100 * time.Millisecond
)

// RepairReport says what Repair set right.
type RepairReport struct {
	// Buckets taken over from a process that died holding their lock.
	Buckets int
	// Entries dropped because their record did not verify.
	Entries int
	// Buffers given back to the pool: held by processes that died, or
	// handed to the table and named by no entry.
	Buffers int
	// Items and Bytes are how far the counters were off (counted minus
	// held) before they were set to what the entries hold.
	Items, Bytes int64
}

// Verify is Repair without the report: it returns the error for what is
// corrupt (ErrCorrupt), or nil. What a live writer held too long to be
// checked (Repair's ErrBusy) is not corruption, and is not reported; a
// check that ctx's end cut short is (errors.Is ctx.Err()), since nil
// would say the whole table verified.
func (p *Store) Verify(ctx context.Context) error {
	_, corrupt, busy := p.check(ctx)
	if err := ctx.Err(); err != nil && errors.Is(busy, err) {
		return errors.Join(corrupt, busy)
	}
	return corrupt
}

// Repair checks the table's invariants and sets right what it finds wrong,
// while other processes go on using the store. Every bucket's lock is taken
// in turn (a dead holder's is taken over and its bucket repaired, as any
// writer would); every entry must name a loaned record whose checksum, key
// hash, bucket and size agree, or it is dropped. Buffers handed to the
// table that no entry names, and buffers of processes that died, go back
// to the pool, and the item and byte counters are recounted with every
// bucket locked (writers wait that long). The report says what was
// repaired; the error lists what was corrupt (ErrCorrupt: an odd sequence
// with no writer, entries that do not verify), which no writer's death
// explains, and what could not be checked because a live writer held it
// for longer than Repair waits (ErrBusy: a bucket, or the recount), which
// is not corruption and is left for the next Repair. errors.Is tells them
// apart.
func (p *Store) Repair(ctx context.Context) (RepairReport, error) {
	rep, corrupt, busy := p.check(ctx)
	return rep, errors.Join(corrupt, busy)
}

// check is Repair, with the errors for what is corrupt and for what was
// busy apart.
func (p *Store) check(ctx context.Context) (rep RepairReport, corrupt, busy error) {
	var errs, busyErrs []error
	live := map[shm.Handle]bool{}
	for i := range p.nbuckets {
		bk := headerSize + int(i)*bucketSize
		repaired, err := p.lockWithin(ctx, bk, lockTimeout)
		if err != nil {
			busyErrs = append(busyErrs, fmt.Errorf("cache: bucket %d not checked: %w", i, err))
			continue
		}
		switch {
		case errors.Is(repaired, shm.ErrCorrupt):
			errs = append(errs, fmt.Errorf("%w: bucket %d: %v", ErrCorrupt, i, repaired))
		case repaired != nil:
			rep.Buckets++
		}
		var bad []int
		for j := range slotsPerBkt {
			s := slotOff(bk, j)
			h := p.word(s + sOffHash).Load()
			switch {
			case h == 0:
				continue
			case h&(p.nbuckets-1) != i:
				errs = append(errs, fmt.Errorf("%w: bucket %d slot %d holds a key of bucket %d", ErrCorrupt, i, j, h&(p.nbuckets-1)))
			case !p.validSlot(s, h):
				errs = append(errs, fmt.Errorf("%w: bucket %d slot %d does not verify", ErrCorrupt, i, j))
			default:
				live[p.slotHandle(s)] = true
				continue
			}
			bad = append(bad, s)
		}
		var freed []record
		if len(bad) > 0 {
			l := p.lockOf(bk)
			l.BeginWrite()
			for _, s := range bad {
				freed = append(freed, p.clearSlot(s))
			}
			l.EndWrite()
			rep.Entries += len(bad)
		}
		p.unlock(bk)
		p.release(freed)
	}
	var orphans []shm.Handle
	p.pool.Shared(func(h shm.Handle) {
		if !live[h] {
			orphans = append(orphans, h)
		}
	})
	for _, h := range orphans {
		if p.returnOrphan(ctx, h) {
			rep.Buffers++
		}
	}
	rep.Buffers += p.reclaim()
	items, bytes, err := p.recount(ctx, repairPatience)
	if err != nil {
		busyErrs = append(busyErrs, err)
	}
	rep.Items, rep.Bytes = items, bytes
	return rep, errors.Join(errs...), errors.Join(busyErrs...)
}

// returnOrphan returns a buffer handed to the table that no entry named
// when Repair's scan passed its bucket. A writer may have linked it since,
// so it looks again under the lock of the bucket of the record's key: a
// writer links a record there before it shares it, and takes a record
// back before it unlinks it, so a shared record that its bucket does not
// name while the lock is held is named by nobody.
func (p *Store) returnOrphan(ctx context.Context, h shm.Handle) bool {
	buf, err := p.pool.Resolve(h)
	if err != nil {
		return false
	}
	if k, _, ok := (record{buf: buf, handle: h}).parse(); ok {
		bk := p.bucketOff(hashKey(k))
		if p.lock(ctx, bk) != nil {
			return false
		}
		defer p.unlock(bk)
		for j := range slotsPerBkt {
			if s := slotOff(bk, j); p.word(s+sOffHash).Load() != 0 && p.slotHandle(s) == h {
				return false
			}
		}
	}
	if _, err := p.pool.Adopt(h); err != nil {
		return false
	}
	return p.pool.Return(h) == nil
}

// reclaim takes back the buffers of processes that died, and counts them.
func (p *Store) reclaim() int {
	n := p.pool.Reclaim()
	if n > 0 {
		p.stat(stReclaimed).Add(uint64(n))
		p.log.Debug("cache: took back buffers of processes that died", "buffers", n)
	}
	return n
}

// recount sets the item and byte counters to what the entries hold and
// returns how far they were off (counted minus held). It holds every
// bucket's lock at once, taken in order (a writer holds one lock at a
// time, so this cannot deadlock), so that no write is counted half. It
// gives up, changing nothing, if a live writer holds a bucket for over
// patience.
func (p *Store) recount(ctx context.Context, patience time.Duration) (items, bytes int64, err error) {
	held := 0
	defer func() {
		for i := range held {
			p.unlock(headerSize + i*bucketSize)
		}
	}()
	for ; held < int(p.nbuckets); held++ {
		if _, err := p.lockWithin(ctx, headerSize+held*bucketSize, patience); err != nil {
			return 0, 0, fmt.Errorf("cache: counters not recounted (the next repair or sweep tries again): %w", err)
		}
	}
	// Repairs made while the locks were taken are counted below.
	p.word(hOffRecount).Store(0)
	var n, b uint64
	for i := range held {
		for j := range slotsPerBkt {
			s := slotOff(headerSize+i*bucketSize, j)
			if p.word(s+sOffHash).Load() != 0 {
				n++
				b += p.word(s+sOffSize).Load() &^ refBit
			}
		}
	}
	items, bytes = int64(p.items.Load()-n), int64(p.used.Load()-b)
	p.items.Store(n)
	p.used.Store(b)
	return items, bytes, nil
}

// maintain keeps the store's bookkeeping true as processes come and go: at
// most every sweepInterval it looks for attached processes that died, and
// recounts the counters if a repair asked.
func (p *Store) maintain(ctx context.Context) {
	now := time.Now().UnixNano()
	last := p.lastSweep.Load()
	if now-last < int64(sweepInterval) || !p.lastSweep.CompareAndSwap(last, now) {
		return
	}
	p.sweepDead(ctx)
	if p.word(hOffRecount).Load() != 0 {
		if _, _, err := p.recount(ctx, recountPatience); err != nil {
			p.log.Debug("cache: recount left for later", "err", err)
		}
	}
}

// procWord is entry i of the table of attached processes.
func (p *Store) procWord(i int) *atomic.Uint64 { return p.word(hOffProcs + 8*i) }

// register notes this process in the table of attached processes, so that
// the others take back what it holds should it die. With the table full of
// live processes it stays out: what it holds when it dies is then taken
// back only when a size class runs out, or by Repair.
func (p *Store) register() {
	ctx := context.Background() // Open's: the sweep's waits are short
	for attempt := range 3 {
		free := -1
		for i := range maxProcs {
			switch p.procWord(i).Load() {
			case p.me:
				return
			case 0:
				if free < 0 {
					free = i
				}
			}
		}
		if free < 0 {
			if attempt > 0 {
				return
			}
			p.sweepDead(ctx) // the entries of dead processes free up
			continue
		}
		if p.procWord(free).CompareAndSwap(0, p.me) {
			return
		}
	}
}

// sweepDead takes back what the attached processes that died held, then
// frees their entries of the table.
func (p *Store) sweepDead(ctx context.Context) RepairReport {
	var dead []int
	var words []uint64
	for i := range maxProcs {
		if w := p.procWord(i).Load(); w != 0 && w != p.me && !shm.AliveWord(w) {
			dead = append(dead, i)
			words = append(words, w)
		}
	}
	if len(dead) == 0 {
		return RepairReport{}
	}
	rep := p.reclaimDead(ctx)
	for k, i := range dead {
		p.procWord(i).CompareAndSwap(words[k], 0)
	}
	return rep
}

// reclaimDead repairs the buckets whose lock a dead process holds, takes
// back the buffers of dead processes and recounts if a repair asks.
func (p *Store) reclaimDead(ctx context.Context) RepairReport {
	var rep RepairReport
	for i := range p.nbuckets {
		bk := headerSize + int(i)*bucketSize
		if !p.lockOf(bk).OwnerDead() {
			continue
		}
		repaired, err := p.lockWithin(ctx, bk, recountPatience)
		if err != nil {
			continue // a live writer has it now, and the repair was done
		}
		p.unlock(bk)
		if repaired != nil {
			rep.Buckets++
		}
	}
	rep.Buffers = p.reclaim()
	if p.word(hOffRecount).Load() != 0 {
		var err error
		if rep.Items, rep.Bytes, err = p.recount(ctx, recountPatience); err != nil {
			p.log.Debug("cache: recount left for later", "err", err)
		}
	}
	return rep
}
