package mq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// Errors of consumer groups. Match them with errors.Is.
var (
	// ErrNotHeld: Ack or Nack of a message this consumer no longer holds:
	// it was redelivered since (its visibility timeout passed, or its
	// partition's new owner found this consumer gone), or already acked.
	ErrNotHeld = errors.New("mq: message no longer held by this consumer")
	// ErrGroupFull: every member slot of the group is taken by a live
	// consumer.
	ErrGroupFull = errors.New("mq: consumer group full")
)

// GroupConfig is how a consumer takes part in a group. The zero value
// redelivers a message 30 s after its delivery unless acked, forever, with
// at most 256 messages in flight per partition.
type GroupConfig struct {
	// VisibilityTimeout is how long a delivered message stays with its
	// consumer before it is redelivered, unless acked (default 30 s).
	VisibilityTimeout time.Duration
	// MaxAttempts, if positive, is how many deliveries a message gets:
	// once its last delivery is nacked or times out it is written to
	// DeadLetter (which must then be set) and acked. Zero redelivers
	// forever.
	MaxAttempts int
	// DeadLetter is the log that messages out of attempts go to (see
	// ParseDeadLetter), partition Partition mod its partitions. Its
	// segments must be at least 24 bytes larger than the log's, for the
	// largest record and the dead-letter header.
	DeadLetter *Log
	// MaxInFlight is how many messages of one partition may be delivered
	// and not yet acked (default 256, at most 4096); Receive waits when
	// every partition it owns is at it. The group's first member sets it
	// for the group; a member asking for another value is refused.
	MaxInFlight int
	// Logger gets the group's events: rebalances, members found dead,
	// messages dead-lettered or lost. Default: slog.Default().
	Logger *slog.Logger

	// now is the clock of deadlines (time.Now); tests replace it. The
	// deadlines are in shared memory: every member must use one clock.
	now func() time.Time
	// parkFor bounds a sleep that only a wake-up or a deadline should end
	// (default parkFor); tests make it long, so that a missing wake-up
	// fails them instead of costing its bound.
	parkFor time.Duration
}

func (c GroupConfig) withDefaults() (GroupConfig, error) {
	if c.VisibilityTimeout == 0 {
		c.VisibilityTimeout = 30 * time.Second
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 256
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.parkFor == 0 {
		c.parkFor = parkFor
	}
	switch {
	case c.VisibilityTimeout < 0:
		return c, fmt.Errorf("mq: visibility timeout %v", c.VisibilityTimeout)
	case c.MaxAttempts < 0 || c.MaxAttempts >= maxAttempts:
		// The dead-letter copy holds the entry as one attempt more.
		return c, fmt.Errorf("mq: %d attempts, want 0 to %d", c.MaxAttempts, maxAttempts-1)
	case c.MaxAttempts > 0 && c.DeadLetter == nil:
		return c, errors.New("mq: MaxAttempts without a DeadLetter log")
	case c.MaxInFlight < 1 || c.MaxInFlight > maxInFlight:
		return c, fmt.Errorf("mq: %d in flight, want 1 to %d", c.MaxInFlight, maxInFlight)
	}
	return c, nil
}

// Layout of a group segment, mq-<log>-g-<group> (docs/mq.md, "Consumer
// groups"). Offsets in its data area; partition words are indexed in
// 8-byte words from the partition's base.
const (
	groupMagic   = 0x315052472d514d75 // "uMQ-GRP1", little endian
	gOffMagic    = 0
	gOffParts    = 8
	gOffInFlight = 16
	// gOffGen is the generation, bumped at each join, leave and death.
	gOffGen = line
	// gOffBell is the group's futex word (u32) and its sleeper count
	// (u32): members that a commit cannot make ready (no partition, or
	// every owned ring full) sleep on it, and only ring wakes it
	// (Consumer.sleep). The words were the old, unused bell: an old
	// segment has the bell's count there, which is a futex word's value
	// like any other, and zero sleepers.
	gOffBell      = line + 8
	gOffLock      = 2 * line // SeqLock over the member table and the generation
	gOffMembers   = 3 * line // maxMembers of {owner, memGen}
	maxMembers    = 64
	gOffParts0    = gOffMembers + maxMembers*16
	maxInFlight   = 4096
	maxAttempts   = 0xffff
	partHeader    = 32 // words before a partition's entries
	entryWords    = 3  // offset, meta, deadline
	livenessEvery = 10 * time.Millisecond
)

// Words of a partition's state in a group segment.
const (
	pwLock        = 0 // SeqLock, 4 words
	pwOwner       = 4 // owning member's slot+1 (0: none) | its memGen<<32
	pwOwnerGen    = 5 // the group generation in which the owner took it
	pwNext        = 6 // log offset of the next record not yet delivered
	pwHead        = 7 // index of the oldest entry (counts up; position head%cap)
	pwCount       = 8 // entries in flight or acked above the oldest unacked
	pwMinDue      = 9 // no in-flight entry is due before this (unix ns)
	pwRedelivered = 10
	pwDeadLetters = 11
	pwLost        = 12
	// pwPins is a table of maxPins pins held in a buddy's name: {the log
	// reader slot+1 | the holding member's holder word<<8, the process
	// word the slot is held in the name of}. A member records a pin
	// before it is in the buddy's name and clears it once it is closed,
	// so whenever a member dies, every pin it left in a live name is
	// here; the partition's next owner releases those of members gone
	// (releaseOrphans). A pin that finds the table full stays in its
	// holder's own name.
	pwPins  = 13
	maxPins = 8
	// pwDL* record the dead-letter copy in progress (deadLetter): the
	// entry's index, the copy's offset in the dead-letter log, and a tag
	// (dlTag: the dead-letter log's name hash<<32 | its partition<<8 | 1;
	// 0 for none). They are written after the copy's space is claimed and
	// before it is committed, and cleared with the ack, so that the next
	// owner of an entry whose copier died can tell from the copy's state
	// whether to copy it again: a copy committed is acked, not made twice.
	// (Old segments have zeros there: nothing in progress.)
	pwDLIndex = 29
	pwDLAt    = 30
	pwDLTag   = 31
)

// Entry meta word: attempts (bits 0-15), state (16-17), holder's member
// slot+1 (24-31), holder's memGen (32-63).
const (
	entryInFlight = 1
	entryAcked    = 2
)

func entryMeta(attempts int, state uint64, holder uint64) uint64 {
	return uint64(attempts)&0xffff | state<<16 | holder<<24
}

func metaAttempts(m uint64) int                 { return int(m & 0xffff) }
func metaState(m uint64) uint64                 { return (m >> 16) & 3 }
func metaHolder(m uint64) uint64                { return m >> 24 }
func holderWord(slot int, memGen uint64) uint64 { return uint64(slot+1) | memGen<<8 }

// The holder packs slot+1 in its low 8 bits and the memGen above (in the
// entry meta the memGen keeps 32 bits).
func holderSlot(h uint64) int { return int(h&0xff) - 1 }

func groupName(log, group string) string { return "mq-" + log + "-g-" + group }

func partWords(inFlight int) int { return partHeader + entryWords*inFlight }

func groupSize(parts, inFlight int) int {
	return gOffParts0 + parts*partWords(inFlight)*8
}

// Message is a record delivered to a group consumer.
type Message struct {
	// Partition and Offset name the record in the log.
	Partition int
	Offset    uint64
	// Payload is the record's bytes in shared memory, valid until the
	// consumer's next Receive or Close (see Record.Payload).
	Payload []byte
	// Attempt counts the deliveries of this record to the group: 1 the
	// first time, 2 after one redelivery, and so on.
	Attempt int

	index uint64 // the entry's index in its partition's in-flight ring
}

// Consumer is a member of a consumer group of a log: it receives the
// records of the partitions the group assigns it, acks or nacks each, and
// takes over partitions when members join, leave or die. Receive is for one
// goroutine at a time; Ack and Nack may be called from any.
type Consumer struct {
	l     *Log
	name  string
	cfg   GroupConfig
	seg   *shm.Segment
	gen   *atomic.Uint64
	lock  shm.SeqLock
	mem   []atomic.Uint64 // member slots: {owner, memGen}
	parts []*groupPart
	cap   int
	// bell and bellSleepers: the group's futex word (gOffBell).
	bell, bellSleepers *atomic.Uint32

	slot   int
	memGen uint64
	tag    uint64 // the group's identity in its pins' reader slots (pinTag)
	me     uint64 // holderWord(slot, memGen)
	pw     uint64 // process word

	mu    sync.Mutex // Receive's state below
	view  uint64     // the generation the assignment below is for
	owned []int
	next  int // round-robin start among owned
	// assigned is a copy of owned for Assigned, which must not wait for
	// a Receive (it holds mu while it waits).
	assigned  atomic.Pointer[[]int]
	redo      func() // releases the last redelivered record's mapping (Log.ReadAt)
	lastAlive time.Time
	naps      atomic.Uint64 // sleeps in Receive, for tests to tell a poll from a sleep
	// torn, if set, runs between an optimistic read of the member table
	// or a partition's state and its validation (tests: a writer that
	// keeps changing the sequence word).
	torn func()
	// pinStep, if set, runs between the steps of a pin's tagging
	// (closePin, recordHandOver, releaseOrphans), named by step (tests:
	// a member that dies there).
	pinStep func(step string)
	// buddy is the process word pins are held in the name of: the next
	// live member's (this process's when alone), so that a pin outlives
	// its owner until a survivor takes the partition over.
	buddy  atomic.Uint64
	closed atomic.Bool
	// closing ends when Close begins: a wait without a bound of its own
	// (a dead-letter copy to a full FullBlock log) ends with it, so that
	// Close does not wait for it.
	closing     context.Context
	stopClosing context.CancelFunc
	// life keeps the group segment mapped while Ack, Nack or Stats use
	// it: Close takes it for writing before it unmaps.
	life sync.RWMutex
}

// groupPart is a partition's state in the group segment and, while this
// consumer owns it, its readers.
type groupPart struct {
	lock shm.SeqLock
	w    []atomic.Uint64 // partHeader words then the entries

	// mu guards the readers below; it is taken after lock, never before.
	mu     sync.Mutex
	stream *Reader // at pwNext, while owned
	pin    *Reader // at the committed offset's segment, while owned
	// stuck is 1 + the stream offset at which the last read gave up on
	// a record still being written, or 0 (Receive's goroutine only): a
	// member asleep on the partition then waits for its commit (which
	// wakes it) rather than for the tail to pass the stream.
	stuck uint64
	// bad: the last poll found the partition's state corrupt, and
	// Receive said so (Receive's goroutine only).
	bad bool
}

// JoinGroup makes this handle a member of consumer group name of the log,
// creating the group (its shm segment mq-<log>-g-<name>) if it is new. The
// members of a group share its partitions: each partition is owned by one
// member at a time. A new group starts at each partition's oldest record.
func (l *Log) JoinGroup(name string, c GroupConfig) (*Consumer, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	if dl := c.DeadLetter; dl != nil && dl.cfg.SegmentSize < l.cfg.SegmentSize+deadLetterHeader {
		return nil, fmt.Errorf("mq: dead-letter log %s has %d-byte segments: a record of %s needs %d (its segment size and the %d-byte dead-letter header)",
			dl.name, dl.cfg.SegmentSize, l.name, l.cfg.SegmentSize+deadLetterHeader, deadLetterHeader)
	}
	seg, err := openGroup(l, name, c.MaxInFlight, c.Logger)
	if err != nil {
		return nil, err
	}
	g, err := newConsumer(l, name, c, seg)
	if err != nil {
		seg.Close()
		return nil, err
	}
	if err := g.join(); err != nil {
		seg.Close()
		return nil, err
	}
	return g, nil
}

// groupHook, if set, is told of group creation's steps (tests): "created"
// when this process made a group segment, before it initializes it;
// "waiting" when a joiner waits for a live creator to finish.
var groupHook func(step, name string)

// openGroup creates or opens the group segment, and initializes it if
// nobody has: under the group lock, so that a creator that dies before it
// wrote the magic (which comes last) leaves the group to the next member
// to join, not unusable until RemoveGroup.
func openGroup(l *Log, name string, inFlight int, logger *slog.Logger) (*shm.Segment, error) {
	gname := groupName(l.name, name)
	size := groupSize(l.cfg.Partitions, inFlight)
	// Marked before the create, so that a joiner of this process never
	// finds a segment this process is making unmarked.
	creating.add(gname, 1)
	seg, err := shm.CreateSegment(gname, size, &shm.SegmentConfig{Keep: true})
	created := err == nil
	if created {
		defer creating.add(gname, -1)
		if groupHook != nil {
			groupHook("created", name)
		}
	} else {
		creating.add(gname, -1)
	}
	if errors.Is(err, os.ErrExist) {
		// Its creator may be making it this moment (then RepairSegment
		// says ErrLocked for a little while), or may have died before
		// the segment had a header (RepairSegment makes it in place).
		deadline := time.Now().Add(time.Second)
		for {
			seg, err = shm.RepairSegment(gname, size, &shm.SegmentConfig{Keep: true})
			if err == nil || !errors.Is(err, shm.ErrLocked) || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mq: group %s of %s: %w", name, l.name, err)
	}
	if err := initGroup(l, name, seg, inFlight, created, logger); err != nil {
		seg.Close()
		return nil, err
	}
	return seg, nil
}

// creating counts, per group segment name, the JoinGroups of this
// process between their create of the segment and its initialization:
// a joiner waits for a creator of its own process only then (a segment
// that RepairSegment remade names this process as its creator too).
var creating = nameCounts{n: map[string]int{}}

type nameCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *nameCounts) add(name string, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[name] += d; c.n[name] == 0 {
		delete(c.n, name)
	}
}

func (c *nameCounts) has(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name] > 0
}

// creatorPatience bounds how long a joiner waits for the live creator of
// a group segment to initialize it before it does so itself.
const creatorPatience = time.Second

// initGroup writes a new group's header and partition starts, unless
// there is a group already (its magic is set). The segment's creator does
// it: a joiner that opened it first waits for its magic while the creator
// lives (up to creatorPatience; the creator's MaxInFlight is the group's,
// not the first to take the lock's). The group lock makes one member do
// it; a member that died doing it (the lock's owner dead) left it to the
// next, which starts over.
func initGroup(l *Log, name string, seg *shm.Segment, inFlight int, created bool, logger *slog.Logger) error {
	if seg.Size() < gOffParts0 {
		return fmt.Errorf("mq: group %s: segment of %d bytes: %w", name, seg.Size(), shm.ErrCorrupt)
	}
	magic, _ := seg.Uint64At(gOffMagic)
	switch m := magic.Load(); {
	case m == groupMagic:
		return nil
	case m != 0:
		// Not a creator that died before it wrote it: garbage, which
		// is not wiped.
		return fmt.Errorf("mq: group %s is not a group (bad magic %#x): %w", name, m, shm.ErrCorrupt)
	}
	if c, me := seg.Creator().Word(), shm.Self().Word(); !created && (c == me && creating.has(seg.Name()) || c != me && shm.AliveWord(c)) {
		if groupHook != nil {
			groupHook("waiting", name)
		}
		// Polled: the creator has no word to wake a joiner on before
		// its header exists, and this happens once per group.
		deadline := time.Now().Add(creatorPatience)
		for magic.Load() == 0 && seg.Creator().Alive() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if m := magic.Load(); m == groupMagic {
			return nil
		}
	}
	lock, err := shm.SeqLockAt(seg, gOffLock)
	if err != nil {
		return err
	}
	err = lock.Lock(time.Second)
	if err != nil && !errors.Is(err, shm.ErrOwnerDied) {
		return fmt.Errorf("mq: group %s: initialize: %w", name, err)
	}
	defer lock.Unlock()
	if err != nil {
		logger.Warn("mq: group lock taken over from a dead member before the group was made", "group", name, "err", err)
		defer lock.EndWrite() // before the Unlock
	}
	if m := magic.Load(); m != 0 {
		if m != groupMagic {
			return fmt.Errorf("mq: group %s is not a group (bad magic %#x): %w", name, m, shm.ErrCorrupt)
		}
		return nil // made while this member waited for the lock
	}
	if need := groupSize(l.cfg.Partitions, inFlight); seg.Size() < need {
		fit := inFlight
		for fit > 0 && groupSize(l.cfg.Partitions, fit) > seg.Size() {
			fit--
		}
		return fmt.Errorf("mq: group %s: an unfinished group segment of %d bytes holds MaxInFlight up to %d, not %d (join with that, or RemoveGroup it): %w", name, seg.Size(), fit, inFlight, shm.ErrCorrupt)
	}
	for i, v := range []uint64{uint64(l.cfg.Partitions), uint64(inFlight)} {
		w, _ := seg.Uint64At(gOffParts + 8*i)
		w.Store(v)
	}
	size := uint64(l.cfg.SegmentSize)
	for p := range l.cfg.Partitions {
		// A new group starts at each partition's oldest record.
		w, _ := seg.Uint64At(gOffParts0 + p*partWords(inFlight)*8 + pwNext*8)
		w.Store(l.parts[p].head.Load() * size)
	}
	magic.Store(groupMagic)
	return nil
}

// newConsumer checks the group segment's shape against the log and c and
// maps its parts.
func newConsumer(l *Log, name string, c GroupConfig, seg *shm.Segment) (*Consumer, error) {
	word := func(off int) *atomic.Uint64 { w, _ := seg.Uint64At(off); return w }
	parts, inFlight := word(gOffParts).Load(), word(gOffInFlight).Load()
	if parts != uint64(l.cfg.Partitions) || inFlight < 1 || inFlight > maxInFlight {
		return nil, fmt.Errorf("mq: group %s: %d partitions and %d in flight, the log has %d partitions: %w", name, parts, inFlight, l.cfg.Partitions, shm.ErrCorrupt)
	}
	if inFlight != uint64(c.MaxInFlight) {
		return nil, fmt.Errorf("mq: group %s has MaxInFlight %d, not %d", name, inFlight, c.MaxInFlight)
	}
	if seg.Size() < groupSize(int(parts), int(inFlight)) {
		return nil, fmt.Errorf("mq: group %s: segment of %d bytes: %w", name, seg.Size(), shm.ErrCorrupt)
	}
	lock, err := shm.SeqLockAt(seg, gOffLock)
	if err != nil {
		return nil, err
	}
	mem, err := seg.Uint64s(gOffMembers, 2*maxMembers)
	if err != nil {
		return nil, err
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	g := &Consumer{l: l, name: name, cfg: c, seg: seg, gen: word(gOffGen), lock: lock, mem: mem, cap: int(inFlight), pw: shm.Self().Word(),
		tag: 1<<32 | uint64(h.Sum32())}
	g.closing, g.stopClosing = context.WithCancel(context.Background())
	g.bell, _ = seg.Uint32At(gOffBell)
	g.bellSleepers, _ = seg.Uint32At(gOffBell + 4)
	stride := partWords(g.cap) * 8
	for p := range l.cfg.Partitions {
		base := gOffParts0 + p*stride
		pl, err := shm.SeqLockAt(seg, base)
		if err != nil {
			return nil, err
		}
		w, err := seg.Uint64s(base, partWords(g.cap))
		if err != nil {
			return nil, err
		}
		g.parts = append(g.parts, &groupPart{lock: pl, w: w})
	}
	return g, nil
}

// lockGroup takes the group lock; a holder that died left at most a member
// slot or the generation half written, which the generation bump that
// every locked change ends with repairs.
func (g *Consumer) lockGroup() error {
	err := g.lock.Lock(time.Second)
	if errors.Is(err, shm.ErrOwnerDied) {
		g.cfg.Logger.Warn("mq: group lock taken over from a dead member", "group", g.name, "err", err)
		g.gen.Add(1)
		g.lock.EndWrite()
		g.ring(-1)
		return nil
	}
	return err
}

func (g *Consumer) bumpGeneration() {
	g.lock.BeginWrite()
	g.gen.Add(1)
	g.lock.EndWrite()
	g.ring(-1)
}

// ring wakes the members asleep in Receive. Those that a commit may make
// ready sleep on the log's futex words, which its producers wake: a member
// that owns one partition on the partition's, the others on the log's word
// for any partition; the others on the group's bell, which only ring wakes
// (sleep). p is the partition concerned, or -1 for all (a new generation:
// the group does not record who sleeps where; a wake of a word nobody
// sleeps on is one load).
func (g *Consumer) ring(p int) {
	wake(g.bell, g.bellSleepers)
	if p >= 0 {
		g.l.parts[p].wakeReaders() // and the log's word for any partition
		return
	}
	for _, pt := range g.l.parts {
		pt.wakeReaders()
	}
}

// join takes a member slot.
func (g *Consumer) join() error {
	if err := g.lockGroup(); err != nil {
		return fmt.Errorf("mq: join group %s: %w", g.name, err)
	}
	defer g.lock.Unlock()
	for i := range maxMembers {
		w := g.mem[2*i].Load()
		if w != 0 && shm.AliveWord(w) {
			continue
		}
		g.lock.BeginWrite()
		g.mem[2*i].Store(g.pw)
		g.memGen = g.mem[2*i+1].Add(1) & 0xffffffff
		g.slot = i
		g.me = holderWord(i, g.memGen)
		g.bumpGeneration()
		g.cfg.Logger.Debug("mq: joined group", "group", g.name, "member", i)
		return nil
	}
	return fmt.Errorf("mq: group %s: %d members: %w", g.name, maxMembers, ErrGroupFull)
}

// optimisticReads is how many lock-free reads of a seqlocked record a
// reader tries before it reads under the lock: a writer that keeps
// changing the sequence word (or garbage that does) cannot make it retry
// forever.
const optimisticReads = 64

// members reads the member table: the slots of live members, sorted, as of
// generation gen.
func (g *Consumer) members() (slots []int, gen uint64, err error) {
	read := func() {
		slots = slots[:0]
		gen = g.gen.Load()
		for i := range maxMembers {
			if g.mem[2*i].Load() != 0 {
				slots = append(slots, i)
			}
		}
	}
	for range optimisticReads {
		seq, err := g.lock.Begin(time.Second)
		if errors.Is(err, shm.ErrOwnerDied) {
			if err := g.lockGroup(); err != nil {
				return nil, 0, err
			}
			g.lock.Unlock()
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		read()
		if g.torn != nil {
			g.torn()
		}
		if g.lock.Validate(seq) {
			return slots, gen, nil
		}
	}
	if err := g.lockGroup(); err != nil {
		return nil, 0, fmt.Errorf("mq: group %s: members: %w", g.name, err)
	}
	defer g.lock.Unlock()
	read()
	return slots, gen, nil
}

// holderAlive reports whether the member named by holder word h (slot+1,
// memGen) is still that member and alive.
func (g *Consumer) holderAlive(h uint64) bool {
	s := holderSlot(h)
	if s < 0 || s >= maxMembers {
		return false
	}
	w := g.mem[2*s].Load()
	return w != 0 && g.mem[2*s+1].Load()&0xffffffff == h>>8 && shm.AliveWord(w)
}

// reapDead removes members whose process died, bumping the generation.
func (g *Consumer) reapDead() error {
	var dead []int
	for i := range maxMembers {
		if w := g.mem[2*i].Load(); w != 0 && !shm.AliveWord(w) {
			dead = append(dead, i)
		}
	}
	if len(dead) == 0 {
		return nil
	}
	if err := g.lockGroup(); err != nil {
		return err
	}
	defer g.lock.Unlock()
	found := false
	for _, i := range dead {
		if w := g.mem[2*i].Load(); w != 0 && !shm.AliveWord(w) {
			g.lock.BeginWrite()
			g.mem[2*i].Store(0)
			found = true
			g.cfg.Logger.Info("mq: group member found dead", "group", g.name, "member", i, "pid", w>>32)
		}
	}
	if found {
		g.bumpGeneration()
	}
	return nil
}

// assignment is the partitions member slot me gets among the sorted live
// members: partition p goes to the (p mod n)-th member.
func assignment(members []int, me, partitions int) []int {
	var mine []int
	for i, s := range members {
		if s != me {
			continue
		}
		for p := i; p < partitions; p += len(members) {
			mine = append(mine, p)
		}
	}
	return mine
}

// Assigned returns the partitions this consumer owned at its last Receive
// (without waiting for a Receive under way).
func (g *Consumer) Assigned() []int {
	if a := g.assigned.Load(); a != nil {
		return append([]int(nil), (*a)...)
	}
	return nil
}

// publishOwned updates what Assigned returns (g.mu held).
func (g *Consumer) publishOwned() {
	a := append([]int(nil), g.owned...)
	g.assigned.Store(&a)
}

// rebalance brings the consumer's partitions up to the group's generation:
// it lets go of partitions no longer its own and takes the new ones.
func (g *Consumer) rebalance() error {
	members, gen, err := g.members()
	if err != nil {
		return err
	}
	want := assignment(members, g.slot, len(g.parts))
	if !contains(members, g.slot) {
		return fmt.Errorf("mq: group %s: this member (slot %d) was removed: %w", g.name, g.slot, ErrClosed)
	}
	keep := g.owned[:0]
	for _, p := range g.owned {
		if contains(want, p) {
			keep = append(keep, p)
		} else {
			g.handOver(p)
		}
	}
	g.owned = keep
	g.setBuddy(members) // before the takes: they pin in its name
	for _, p := range want {
		if contains(g.owned, p) && g.parts[p].w[pwOwner].Load() == g.me {
			// Kept: say so as of gen, so that a take by a member
			// still working from an older member list is refused.
			if err := g.keep(p, gen); err != nil {
				return err
			}
			continue
		}
		ok, err := g.take(p, gen)
		if ok && !contains(g.owned, p) {
			g.owned = append(g.owned, p)
		}
		if err != nil {
			return err
		}
	}
	for _, p := range g.owned {
		gp := g.parts[p]
		if err := g.lockPart(p); err != nil {
			return err
		}
		var err error
		if gp.w[pwOwner].Load() == g.me {
			// A member that left or died since this one took the
			// partition may have held some of its entries.
			gp.lock.BeginWrite()
			g.dueGone(gp)
			gp.lock.EndWrite()
			err = g.repin(p, gp) // in the new buddy's name, if it changed
			// A member that died since this one took the partition may
			// have left a pin it had not closed yet.
			g.releaseOrphans(p, gp)
		}
		gp.lock.Unlock()
		if err != nil {
			return err
		}
	}
	g.view = gen
	g.publishOwned()
	g.cfg.Logger.Debug("mq: group rebalanced", "group", g.name, "member", g.slot, "generation", gen, "partitions", g.owned)
	return nil
}

// setBuddy picks the name pins are held in: the first live member after
// this one among the sorted members whose process is not this one (a pin
// in this process's name dies with it); this process when there is none.
func (g *Consumer) setBuddy(members []int) {
	buddy := g.pw
	at := 0
	for i, s := range members {
		if s == g.slot {
			at = i
		}
	}
	for i := 1; i < len(members); i++ {
		if w := g.mem[2*members[(at+i)%len(members)]].Load(); w != 0 && w != g.pw && shm.AliveWord(w) {
			buddy = w
			break
		}
	}
	g.buddy.Store(buddy)
}

// keep records that this consumer owns partition p as of generation gen,
// if it still owns it.
func (g *Consumer) keep(p int, gen uint64) error {
	gp := g.parts[p]
	if err := g.lockPart(p); err != nil {
		return err
	}
	defer gp.lock.Unlock()
	if gp.w[pwOwner].Load() == g.me && gp.w[pwOwnerGen].Load() < gen {
		gp.lock.BeginWrite()
		gp.w[pwOwnerGen].Store(gen)
		gp.lock.EndWrite()
	}
	return nil
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// drop lets go of partition p's readers (its new owner takes it).
func (g *Consumer) drop(p int) {
	gp := g.parts[p]
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.stream != nil {
		gp.stream.Close()
		gp.stream = nil
	}
	if gp.pin != nil {
		g.closePin(gp, gp.pin)
		gp.pin = nil
	}
}

// handOver lets go of partition p as drop does, except that a pin still
// needed stays held: while this consumer is still the partition's owner
// (its next owner has not taken it), nothing else pins its unacked and
// unread records, so the pin's reader slot is left held in the name it is
// in, recorded in pwPins with no holder, and the next owner's
// releaseOrphans frees it once its own pin is in place (or the group's
// last member, at its Close). A partition already taken by another member
// is pinned by it: the pin is closed.
func (g *Consumer) handOver(p int) {
	gp := g.parts[p]
	if err := g.lockPart(p); err != nil {
		g.drop(p)
		return
	}
	defer gp.lock.Unlock()
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.stream != nil {
		gp.stream.Close()
		gp.stream = nil
	}
	pin := gp.pin
	if pin == nil {
		return
	}
	gp.pin = nil
	if gp.w[pwOwner].Load() == g.me {
		if rs := g.readerSlot(pin); rs >= 0 && g.recordHandOver(gp, rs, pin.me) {
			pin.me = 0 // its Close unmaps and leaves the slot held
			pin.Close()
			return
		}
	}
	g.closePin(gp, pin)
}

// recordHandOver records in pwPins that reader slot rs, held in the name
// of owner, has no holder (see handOver): this consumer's record of it
// becomes so, or a free entry (the partition's lock held). The record
// changes before the tag: a member that dies between the two leaves a
// record with no holder and a tag naming it, which releaseOrphans takes
// for a match (the tag's holder is gone). A new record (the pin had none:
// it is in this process's name, and dies with it) is tagged after it is
// written.
func (g *Consumer) recordHandOver(gp *groupPart, rs int, owner uint64) bool {
	mine := uint64(rs+1) | g.me<<8
	for i := range maxPins {
		w := &gp.w[pwPins+2*i]
		if w.Load() == mine && gp.w[pwPins+2*i+1].Load() == owner {
			w.Store(uint64(rs + 1))
			g.step("handOver:recorded")
			pinTag(g.l, rs)[1].CompareAndSwap(mine, uint64(rs+1))
			g.step("handOver:tagged")
			return true
		}
	}
	for i := range maxPins {
		w := &gp.w[pwPins+2*i]
		if w.Load() == 0 {
			gp.w[pwPins+2*i+1].Store(owner)
			if w.CompareAndSwap(0, uint64(rs+1)) {
				g.tagPin(rs, uint64(rs+1))
				return true
			}
		}
	}
	return false
}

// lockPart takes partition p's lock. A member that died holding it may have
// left the state half changed: if it no longer makes sense, the in-flight
// ring is emptied and delivery resumes from the committed offset (the
// records above it are redelivered: at-least-once).
func (g *Consumer) lockPart(p int) error {
	gp := g.parts[p]
	err := gp.lock.Lock(time.Second)
	if errors.Is(err, shm.ErrOwnerDied) {
		if verr := checkPart(gp.w, g.cap); verr != nil {
			g.cfg.Logger.Warn("mq: partition state repaired after a dead member", "group", g.name, "partition", p, "err", verr)
			resetPart(gp.w, g.cap)
		}
		gp.lock.EndWrite()
		return nil
	}
	if err != nil {
		return fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	return nil
}

// resetPart empties a partition's ring, resuming from its oldest entry's
// offset if that is sane, else from its next offset.
func resetPart(w []atomic.Uint64, capacity int) {
	head, count := w[pwHead].Load(), w[pwCount].Load()
	if count > 0 && count <= uint64(capacity) {
		if o := w[partHeader+int(head%uint64(capacity))*entryWords].Load(); o%8 == 0 && o <= w[pwNext].Load() {
			w[pwNext].Store(o)
		}
	}
	w[pwNext].Store(w[pwNext].Load() &^ 7)
	if holderSlot(w[pwOwner].Load()) >= maxMembers {
		w[pwOwner].Store(0) // its assigned member takes it again (dropLost)
	}
	w[pwHead].Store(0)
	w[pwCount].Store(0)
	w[pwMinDue].Store(0)
	w[pwDLTag].Store(0) // entry indices start again: a record would name another entry
	w[pwDLIndex].Store(0)
	w[pwDLAt].Store(0)
}

// checkPart validates partition state read from shared memory (the lock
// held, or a snapshot): the ring's bounds and every live entry. An error
// wraps shm.ErrCorrupt.
func checkPart(w []atomic.Uint64, capacity int) error {
	if len(w) < partWords(capacity) {
		return fmt.Errorf("partition state of %d words: %w", len(w), shm.ErrCorrupt)
	}
	next, head, count := w[pwNext].Load(), w[pwHead].Load(), w[pwCount].Load()
	if next%8 != 0 || count > uint64(capacity) {
		return fmt.Errorf("partition state next %d, %d entries of %d: %w", next, count, capacity, shm.ErrCorrupt)
	}
	if o := w[pwOwner].Load(); o != 0 && holderSlot(o) >= maxMembers {
		return fmt.Errorf("partition owner %#x: %w", o, shm.ErrCorrupt)
	}
	prev := uint64(0)
	for i := range count {
		e := w[partHeader+int((head+i)%uint64(capacity))*entryWords:]
		o, m := e[0].Load(), e[1].Load()
		s := metaState(m)
		switch {
		case o%8 != 0 || o >= next || i > 0 && o <= prev:
			return fmt.Errorf("entry %d at offset %d (previous %d, next %d): %w", head+i, o, prev, next, shm.ErrCorrupt)
		case s != entryInFlight && s != entryAcked || metaAttempts(m) == 0 || holderSlot(metaHolder(m)) >= maxMembers:
			return fmt.Errorf("entry %d meta %#x: %w", head+i, m, shm.ErrCorrupt)
		case i == 0 && s == entryAcked:
			return fmt.Errorf("entry %d: the oldest entry is acked: %w", head, shm.ErrCorrupt)
		}
		prev = o
	}
	return nil
}

// checkRing is the part of checkPart that costs nothing: the ring's
// bounds. Receive, Ack and Nack check it each time; the entries they then
// use are checked where they are used (a redelivered offset must be a
// record's), and checkPart checks all of them when a partition changes
// hands.
func checkRing(w []atomic.Uint64, capacity int) error {
	if next, count := w[pwNext].Load(), w[pwCount].Load(); next%8 != 0 || count > uint64(capacity) {
		return fmt.Errorf("partition state next %d, %d entries of %d: %w", next, count, capacity, shm.ErrCorrupt)
	}
	return nil
}

// take makes this consumer partition p's owner as of generation gen,
// unless a member took it in a later generation. Entries delivered to
// members that are gone are made due at once; a live member's keep their
// deadlines (it may still ack them).
func (g *Consumer) take(p int, gen uint64) (bool, error) {
	gp := g.parts[p]
	if err := g.lockPart(p); err != nil {
		return false, err
	}
	defer gp.lock.Unlock()
	if err := checkPart(gp.w, g.cap); err != nil {
		return false, fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	if og := gp.w[pwOwnerGen].Load(); og > gen {
		if og > g.gen.Load() {
			return false, fmt.Errorf("mq: group %s partition %d: taken in generation %d, the group is at %d: %w", g.name, p, og, g.gen.Load(), shm.ErrCorrupt)
		}
		return false, nil
	}
	gp.lock.BeginWrite()
	defer gp.lock.EndWrite()
	prev := gp.w[pwOwner].Load()
	gp.w[pwOwner].Store(g.me)
	gp.w[pwOwnerGen].Store(gen)
	count := g.dueGone(gp)
	if err := g.openReaders(p, gp); err != nil {
		return true, err // owned: its polls try to open the readers again
	}
	g.releaseOrphans(p, gp) // now that this consumer's pin holds the segments
	if prev != g.me && prev != 0 {
		g.cfg.Logger.Info("mq: group partition taken", "group", g.name, "member", g.slot, "partition", p, "from", holderSlot(prev), "committed", committed(gp.w, g.cap), "inflight", count)
	}
	return true, nil
}

// ringCount is the partition's entry count, at most the ring's capacity:
// the word is in shared memory, and a writer may change it between a check
// and a loop over it.
func (g *Consumer) ringCount(gp *groupPart) uint64 {
	return min(gp.w[pwCount].Load(), uint64(g.cap))
}

// dueGone makes the in-flight entries held by members that are gone due at
// once (the partition's lock held, its write open) and returns the count.
func (g *Consumer) dueGone(gp *groupPart) uint64 {
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	for i := range count {
		e := g.entry(gp, head+i)
		m := e[1].Load()
		if metaState(m) == entryInFlight && metaHolder(m) != g.me && e[2].Load() != 0 && !g.holderAlive(metaHolder(m)) {
			e[2].Store(0)
			gp.w[pwMinDue].Store(0)
		}
	}
	return count
}

func (g *Consumer) entry(gp *groupPart, index uint64) []atomic.Uint64 {
	at := partHeader + int(index%uint64(g.cap))*entryWords
	return gp.w[at : at+entryWords : at+entryWords]
}

// committed is the offset below which every record of the partition is
// acked: the oldest entry's, or the next offset when none is in flight.
func committed(w []atomic.Uint64, capacity int) uint64 {
	if w[pwCount].Load() == 0 {
		return w[pwNext].Load()
	}
	return w[partHeader+int(w[pwHead].Load()%uint64(capacity))*entryWords].Load()
}

// openReaders opens the partition's stream reader at its next offset and
// its pin at the committed offset (the partition's lock held). Records
// retention dropped before the group got to them are counted lost.
func (g *Consumer) openReaders(p int, gp *groupPart) error {
	next := gp.w[pwNext].Load()
	if tail := g.l.parts[p].tail.Load(); next > tail || next%8 != 0 {
		return fmt.Errorf("mq: group %s partition %d: next offset %d, the log's tail %d: %w", g.name, p, next, tail, shm.ErrCorrupt)
	}
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.stream != nil {
		gp.stream.Close()
		gp.stream = nil
	}
	// The old pin stays until repinLocked has the new one.
	r, err := g.l.NewReader(p, next)
	if errors.Is(err, ErrOffsetGone) {
		r, err = g.l.NewReader(p, Oldest)
		if err == nil {
			if !g.l.onlyPadding(p, next, r.Offset()) {
				g.lost(p, gp, "retention dropped records the group had not read", next, r.Offset())
			}
			gp.w[pwNext].Store(r.Offset())
		}
	}
	if err != nil {
		return fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	gp.stream = r
	return g.repinLocked(p, gp)
}

// repin moves the partition's pin to the segment of its committed offset
// if it is elsewhere: the pin is a Reader slot, which keeps producers
// under FullBlock and FullFail from dropping the segments of unacked
// records. The new pin is taken before the old one goes.
func (g *Consumer) repin(p int, gp *groupPart) error {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	if gp.stream == nil {
		return nil // not owned here
	}
	return g.repinLocked(p, gp)
}

func (g *Consumer) repinLocked(p int, gp *groupPart) error {
	size := uint64(g.l.cfg.SegmentSize)
	c := committed(gp.w, g.cap)
	buddy := g.buddy.Load()
	if gp.pin != nil && gp.pin.Offset()/size == c/size && (buddy == 0 || gp.pin.me == buddy) {
		return nil
	}
	pin, err := g.l.NewReader(p, c/size*size)
	if errors.Is(err, ErrOffsetGone) {
		pin, err = g.l.NewReader(p, Oldest)
	}
	if err != nil {
		return fmt.Errorf("mq: group %s partition %d: pin: %w", g.name, p, err)
	}
	// Hold the pin in the buddy's name: the log frees the slots of dead
	// processes, and this one must outlive this process until a survivor
	// takes the partition (take releases it). Its Close frees it as ever.
	// The partition state names the pins in a buddy's name before they
	// are so (a slot still in this process's name dies with it), and the
	// old one until it is closed: whenever this process dies, take finds
	// every pin it left.
	if buddy != 0 && buddy != pin.me {
		if rs := g.readerSlot(pin); rs >= 0 && g.recordPin(gp, rs, buddy) {
			if pin.owner.CompareAndSwap(pin.me, buddy) {
				pin.me = buddy
			}
		}
	}
	if gp.pin != nil {
		g.closePin(gp, gp.pin)
	}
	gp.pin = pin
	return nil
}

// recordPin records in partition state that this consumer holds reader
// slot rs in the name of owner (see pwPins), if the table has room.
func (g *Consumer) recordPin(gp *groupPart, rs int, owner uint64) bool {
	g.tagPin(rs, uint64(rs+1)|g.me<<8)
	for i := range maxPins {
		w := &gp.w[pwPins+2*i]
		if w.Load() == 0 {
			gp.w[pwPins+2*i+1].Store(owner)
			if w.CompareAndSwap(0, uint64(rs+1)|g.me<<8) {
				return true
			}
		}
	}
	return false
}

// closePin closes pin r and then clears its record, if it has one. Only
// the recording member clears its records while alive, so this needs no
// lock. Its steps are ordered so that a death between any two leaks
// nothing (TestGroupPinCrashWindows): the slot first goes into this
// process's name (a death from there on frees it with the process; before,
// the record and tag still match and the next owner releases it), then its
// tag goes (while the slot is held, so that a stale tag never names a
// slot a reader takes next; a compare, so that it is this pin's), then
// the slot, then the record (a stale record matches no tag).
func (g *Consumer) closePin(gp *groupPart, r *Reader) {
	rs := g.readerSlot(r)
	if rs < 0 {
		r.Close()
		return
	}
	rec := uint64(rs+1) | g.me<<8
	if r.me != g.pw && r.owner.CompareAndSwap(r.me, g.pw) {
		r.me = g.pw
	}
	g.step("closePin:own")
	pinTag(g.l, rs)[1].CompareAndSwap(rec, 0)
	g.step("closePin:untagged")
	r.Close()
	g.step("closePin:closed")
	for i := range maxPins {
		w := &gp.w[pwPins+2*i]
		w.CompareAndSwap(rec, 0)
	}
}

// releaseOrphans frees the reader slots that members now gone held
// partition p's pins in, in a live member's name (the partition's lock
// held, and this consumer's own pin in place). A slot is freed only if it
// is still held for p in that name, and tagged as this group's pin with
// this very record (pinTag), or, for a handed-over record (no holder),
// with the record a gone holder had before (it died between rewriting the
// record and the tag: recordHandOver): a garbage record, or a stale one
// whose slot has been taken since for another reader, frees nothing. The
// untag after the free compares: a reader that took the slot meanwhile,
// and the member that tagged it, keep their tag (TestGroupReleaseLateUntag).
//
// What remains: a stale tag can sit in a free slot (a member died between
// freeing it and untagging it, here or in closePin's last steps), and
// NewReader zeroes a slot's tag just after it takes it. A release that
// looks in between, at a reader taken in the buddy's process for this
// partition in that very slot, would free it: a death and a take within
// a few instructions of each other, which no test makes.
func (g *Consumer) releaseOrphans(p int, gp *groupPart) {
	for i := range maxPins {
		w := gp.w[pwPins+2*i].Load()
		if w == 0 || w>>8 == g.me || g.holderAlive(w>>8) {
			continue
		}
		owner := gp.w[pwPins+2*i+1].Load()
		if rs := w & 0xff; rs >= 1 && rs <= maxReaders && owner != 0 {
			base := offReaders + int(rs-1)*line
			o, _ := g.l.meta.Uint64At(base)
			part, _ := g.l.meta.Uint64At(base + 8)
			tag := pinTag(g.l, int(rs-1))
			tv := tag[1].Load()
			match := tv == w || w>>8 == 0 && tv&0xff == w && tv>>8 != 0 && !g.holderAlive(tv>>8)
			if part.Load() == uint64(p) && tag[0].Load() == g.tag && match && o.CompareAndSwap(owner, 0) {
				g.step("release:freed")
				tag[1].CompareAndSwap(tv, 0)
				g.l.wakeBlocked(g.l.parts[p])
				g.cfg.Logger.Debug("mq: released a gone member's pin", "group", g.name, "partition", p, "slot", rs-1)
			}
		}
		gp.w[pwPins+2*i].CompareAndSwap(w, 0)
	}
}

// step runs the pinStep hook, if set.
func (g *Consumer) step(name string) {
	if g.pinStep != nil {
		g.pinStep(name)
	}
}

// pinTag is the two words of reader slot rs that say whether a consumer
// group's pin holds it: the group's tag (Consumer.tag) and the pin's
// record in the partition state (pwPins), or zeros. NewReader zeroes them
// when it takes the slot.
func pinTag(l *Log, rs int) [2]*atomic.Uint64 {
	base := offReaders + rs*line
	group, _ := l.meta.Uint64At(base + 24)
	rec, _ := l.meta.Uint64At(base + 32)
	return [2]*atomic.Uint64{group, rec}
}

// tagPin tags reader slot rs, which this consumer holds, as this group's
// pin recorded as rec (or untags it: rec 0).
func (g *Consumer) tagPin(rs int, rec uint64) {
	t := pinTag(g.l, rs)
	if rec == 0 {
		t[1].Store(0)
		t[0].Store(0)
		return
	}
	t[0].Store(g.tag)
	t[1].Store(rec)
}

// readerSlot is the index of r's slot among the log's reader slots.
func (g *Consumer) readerSlot(r *Reader) int {
	for i := range maxReaders {
		if w, _ := g.l.meta.Uint64At(offReaders + i*line); w == r.owner {
			return i
		}
	}
	return -1
}

func (g *Consumer) lost(p int, gp *groupPart, why string, from, to uint64) {
	gp.w[pwLost].Add(1)
	g.cfg.Logger.Warn("mq: group lost records", "group", g.name, "partition", p, "why", why, "from", from, "to", to)
}

// Receive returns the next message for this consumer: a record due for
// redelivery (nacked, or not acked within the visibility timeout) or the
// next record of a partition it owns. It waits until one comes or ctx ends.
// A message past its attempts goes to the dead-letter log instead.
func (g *Consumer) Receive(ctx context.Context) (Message, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() || g.l.closed.Load() {
		return Message{}, ErrClosed
	}
	if g.redo != nil {
		g.redo()
		g.redo = nil
	}
	var bo shm.Backoff
	for {
		if g.closed.Load() {
			return Message{}, ErrClosed
		}
		if time.Since(g.lastAlive) > livenessEvery {
			g.lastAlive = time.Now()
			if err := g.reapDead(); err != nil {
				return Message{}, err
			}
		}
		if g.gen.Load() != g.view {
			if err := g.rebalance(); err != nil {
				return Message{}, err
			}
		}
		for i := range len(g.owned) {
			p := g.owned[(g.next+i)%len(g.owned)]
			m, ok, err := g.poll(ctx, p)
			gp := g.parts[p]
			if err != nil && errors.Is(err, shm.ErrCorrupt) {
				// One corrupt partition does not starve the others:
				// Receive reports it once, then goes on without it
				// until a poll of it succeeds.
				if !gp.bad {
					gp.bad = true
					g.cfg.Logger.Error("mq: group partition state corrupt; serving the others", "group", g.name, "partition", p, "err", err)
					return Message{}, err
				}
				continue
			}
			if err != nil {
				return Message{}, err
			}
			gp.bad = false
			if ok {
				g.next = (g.next + i + 1) % max(len(g.owned), 1)
				return m, nil
			}
		}
		g.dropLost()
		if bo.Pause() {
			continue
		}
		if err := ctx.Err(); err != nil {
			return Message{}, err
		}
		g.sleep(ctx)
	}
}

// dropLost forgets partitions whose ownership another member took (it saw a
// newer generation first, or took it from a stale member list, or the
// owner word is garbage). It forces a rebalance: one from a newer
// generation leaves the partition to its taker, and a stale or bogus owner
// loses it again to this member (take refuses only a later generation's).
func (g *Consumer) dropLost() {
	keep := g.owned[:0]
	for _, p := range g.owned {
		switch g.parts[p].w[pwOwner].Load() {
		case g.me:
			keep = append(keep, p)
		case 0:
			// Nobody's: a repair of corrupt state reset it. Take it
			// again at the next rebalance, which this forces.
			keep = append(keep, p)
			g.view = ^uint64(0)
		default:
			g.handOver(p)
			g.view = ^uint64(0)
		}
	}
	g.owned = keep
	g.publishOwned()
}

// sleep waits for something to do, at most until the earliest deadline of
// an owned partition, else for cfg.parkFor (the liveness of the others is
// looked at after it). A member that a commit may make ready (an owned
// partition with room in its ring) sleeps on the log's futex words, which
// its producers wake at every commit and abort: on the partition's when it
// owns one, else on the log's word for any partition (a member with
// several is woken by commits to partitions it does not own as well, once
// per sleep). A member that no commit can make ready (it owns nothing, or
// every owned ring is full) sleeps on the group's bell, which commits do
// not wake. ring (Nack, an Ack that makes room, a new generation, Close)
// wakes all three.
func (g *Consumer) sleep(ctx context.Context) {
	d := g.cfg.parkFor
	now := uint64(g.cfg.now().UnixNano())
	var room []int // owned partitions a commit may make ready
	for _, p := range g.owned {
		gp := g.parts[p]
		if due := gp.w[pwMinDue].Load(); due <= now {
			d = 50 * time.Microsecond
		} else if due-now < uint64(d) {
			d = time.Duration(due - now)
		}
		if gp.stream != nil && gp.w[pwCount].Load() < uint64(g.cap) {
			room = append(room, p)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	g.naps.Add(1)
	// The generation this member acted on, not the current one: a
	// join or leave during the poll pass rang before this sleeper
	// registered.
	view := g.view
	due := func(p int) bool { return g.parts[p].w[pwMinDue].Load() <= uint64(g.cfg.now().UnixNano()) }
	// ready: something to do in partition p. A record being written at
	// the stream's head (stuck) is not, while its live producer holds it:
	// its commit or abort wakes the sleeper. It is looked at again here,
	// as the commit may have come between the poll's look and this
	// sleeper's registration, whose wake-up then found nobody.
	ready := func(p int) bool {
		gp := g.parts[p]
		if due(p) {
			return true
		}
		if gp.stream == nil || gp.w[pwCount].Load() >= uint64(g.cap) {
			return false // ring wakes it when an Ack makes room
		}
		at := gp.stream.Offset()
		if gp.stuck == at+1 {
			return !gp.stream.held()
		}
		return g.l.parts[p].tail.Load() > at
	}
	others := func() bool { return g.gen.Load() != view || g.closed.Load() }
	switch {
	case len(room) == 0:
		// On the bell. Ready also when a ring got room after the look
		// above (its Ack rang before this sleeper registered): the
		// member goes round and sleeps where commits wake it.
		sleepOn(sctx, g.bell, g.bellSleepers, func() bool {
			if others() {
				return true
			}
			for _, p := range g.owned {
				if gp := g.parts[p]; due(p) || gp.stream != nil && gp.w[pwCount].Load() < uint64(g.cap) {
					return true
				}
			}
			return false
		})
	case len(g.owned) == 1:
		p := g.owned[0]
		pt := g.l.parts[p]
		sleepOn(sctx, pt.seq, pt.sleepers, func() bool { return others() || ready(p) })
	default:
		anyReady := func() bool {
			if others() {
				return true
			}
			for _, p := range g.owned {
				if ready(p) {
					return true
				}
				// A ring full at the look above with room now: its
				// Ack rang the bell before this sleeper registered, and
				// its partition's word is not slept on. Go round.
				if gp := g.parts[p]; gp.stream != nil && gp.w[pwCount].Load() < uint64(g.cap) && !slices.Contains(room, p) {
					return true
				}
			}
			return false
		}
		// On the words of the owned partitions with room, which their
		// commits wake, and on the bell, which a ring for the others (an
		// Ack making room) and for the group wakes: commits to
		// partitions this member does not own do not wake it.
		words := []*atomic.Uint32{g.bell}
		sleepers := []*atomic.Uint32{g.bellSleepers}
		for _, p := range room {
			words, sleepers = append(words, g.l.parts[p].seq), append(sleepers, g.l.parts[p].sleepers)
		}
		if !sleepOnAny(sctx, words, sleepers, anyReady) {
			// No futex_waitv: on the log's word, which every commit in
			// any partition wakes.
			pt0 := g.l.parts[0] // its anySeq is the log's
			sleepOn(sctx, pt0.anySeq, pt0.anySleepers, anyReady)
		}
	}
}

// poll looks for a message in partition p: a due entry first, then the
// next record of the stream.
func (g *Consumer) poll(ctx context.Context, p int) (Message, bool, error) {
	gp := g.parts[p]
	if gp.stream != nil && gp.w[pwOwner].Load() == g.me && gp.w[pwMinDue].Load() > uint64(g.cfg.now().UnixNano()) && gp.w[pwNext].Load() == gp.stream.Offset() {
		// Nothing is due: the stream, with one lock round trip, not two.
		// (A Nack read stale here is seen at the next poll.)
		if gp.w[pwCount].Load() < uint64(g.cap) && g.l.parts[p].tail.Load() > gp.stream.Offset() {
			return g.pollStream(ctx, p, gp)
		}
		return Message{}, false, nil
	}
	if err := g.lockPart(p); err != nil {
		return Message{}, false, err
	}
	act, err := g.pollLocked(p, gp)
	gp.lock.Unlock()
	if err != nil || act.kind == actNone {
		return Message{}, false, err
	}
	if act.kind == actStream {
		return g.pollStream(ctx, p, gp)
	}
	if act.kind == actDeadLetter {
		return Message{}, false, g.deadLetter(ctx, p, gp, act)
	}
	rec, err := g.readAt(ctx, p, act.off)
	if errors.Is(err, ErrOffsetGone) {
		return Message{}, false, g.settleTaken(p, act.index, act.off, act.attempt, func() { g.lost(p, gp, "retention dropped an unacked record", act.off, act.off) })
	}
	if err != nil {
		return Message{}, false, err
	}
	return Message{Partition: p, Offset: act.off, Payload: rec.Payload, Attempt: act.attempt, index: act.index}, true, nil
}

// What pollLocked found, for poll to finish without the lock.
type pollAction struct {
	kind    int
	index   uint64
	off     uint64
	attempt int
	// copyAt is, for actDeadLetter, the offset in the dead-letter log
	// of a copy of the entry a member started (pwDLAt), if copying.
	copyAt  uint64
	copying bool
}

const (
	actNone       = iota
	actStream     // read the next record of the stream
	actRedeliver  // read the record at off, now held with attempt
	actDeadLetter // copy the record at off to the dead-letter log
)

// doneCtx is a context that has ended: Reader.Next with it returns a
// committed record at once and gives up, after its spin, on one that is
// still being written, so that the consumer goes on to its other
// partitions.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// pollLocked is poll's work under the partition's lock: it takes a due
// entry, or says whether to read the stream.
func (g *Consumer) pollLocked(p int, gp *groupPart) (pollAction, error) {
	if gp.w[pwOwner].Load() != g.me {
		return pollAction{}, nil
	}
	if err := checkRing(gp.w, g.cap); err != nil {
		return pollAction{}, fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	if gp.stream == nil || gp.w[pwNext].Load() != gp.stream.Offset() {
		// A repair moved the partition back (lockPart): read from there.
		// (No stream: opening it failed before.)
		if err := g.openReaders(p, gp); err != nil {
			return pollAction{}, err
		}
	}
	now := uint64(g.cfg.now().UnixNano())
	if gp.w[pwMinDue].Load() <= now {
		if index, ok := g.due(gp, now); ok {
			e := g.entry(gp, index)
			m := e[1].Load()
			act := pollAction{kind: actRedeliver, index: index, off: e[0].Load(), attempt: min(metaAttempts(m)+1, maxAttempts)}
			gp.lock.BeginWrite()
			if g.cfg.MaxAttempts > 0 && metaAttempts(m) >= g.cfg.MaxAttempts {
				// Out of attempts: hold it while it is copied to the
				// dead-letter log (a member that dies meanwhile leaves
				// it due again), then ack it. The hold counts as an
				// attempt, so that the last delivery's handle, nacked
				// or timed out, can no longer ack it meanwhile.
				act.kind = actDeadLetter
				if tag := gp.w[pwDLTag].Load(); tag != 0 && tag == g.dlTag(p) && gp.w[pwDLIndex].Load() == index {
					act.copyAt, act.copying = gp.w[pwDLAt].Load(), true
				} else if g.recordBusy(gp, index) {
					// Another entry's copy is recorded and unsettled:
					// this one waits for it (recordCopy), without a
					// claim in the dead-letter log each time it looks.
					postpone(gp, e, now+uint64(livenessEvery))
					gp.lock.EndWrite()
					return pollAction{}, nil
				}
			} else {
				gp.w[pwRedelivered].Add(1)
			}
			e[1].Store(entryMeta(act.attempt, entryInFlight, g.me))
			e[2].Store(now + uint64(g.cfg.VisibilityTimeout))
			gp.lock.EndWrite()
			return act, nil
		}
	}
	if gp.w[pwCount].Load() >= uint64(g.cap) || g.l.parts[p].tail.Load() <= gp.stream.Offset() {
		return pollAction{}, g.repin(p, gp)
	}
	return pollAction{kind: actStream}, nil
}

// pollStream reads the next record of partition p's stream, without the
// partition's lock (only the owner reads the stream), and then, locked,
// records its delivery, unless the partition changed hands meanwhile (the
// new owner reads the record again from the partition's next offset).
// A record its producer is still writing is given up on after the
// reader's spin, at every look: a look never waits for it, so a live
// producer's open loan holds up none of the member's other partitions
// (it used to cost a synchronous wait per round); a look that finds the
// producer dead skips its record (Reader.Next asks before giving up).
func (g *Consumer) pollStream(ctx context.Context, p int, gp *groupPart) (Message, bool, error) {
	from := gp.stream.Offset()
	var rec Record
	var err error
	if gp.stuck == from+1 && gp.stream.held() {
		// Still held by its live producer: one look at its header, not
		// a reader's spin (50 µs a look, in which the member's other
		// partitions waited).
		err = context.Canceled
	} else {
		rec, err = gp.stream.Next(doneCtx)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// Nothing committed yet (or ctx ended: Receive returns ctx.Err()).
		if gp.stream.Offset() == from {
			gp.stuck = from + 1
		}
		err = nil
		rec.Payload = nil
	} else {
		gp.stuck = 0
	}
	if err := g.lockPart(p); err != nil {
		return Message{}, false, err
	}
	defer gp.lock.Unlock()
	if gp.w[pwOwner].Load() != g.me {
		return Message{}, false, nil
	}
	if err := checkRing(gp.w, g.cap); err != nil {
		return Message{}, false, fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	if gp.w[pwNext].Load() != from {
		// A repair moved next (lockPart, after a dead holder) while the
		// stream was read: what was read is not next. Read from there.
		gp.stuck = 0
		return Message{}, false, g.openReaders(p, gp)
	}
	gp.lock.BeginWrite()
	defer gp.lock.EndWrite()
	switch {
	case errors.Is(err, ErrOffsetGone):
		gp.w[pwNext].Store(gp.stream.Offset())
		return Message{}, false, g.openReaders(p, gp) // counts the loss
	case err != nil:
		return Message{}, false, err
	case rec.Payload == nil:
		gp.w[pwNext].Store(gp.stream.Offset()) // past records aborted on the way
		return Message{}, false, nil
	}
	now := uint64(g.cfg.now().UnixNano())
	deadline := now + uint64(g.cfg.VisibilityTimeout)
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	if count >= uint64(g.cap) {
		return Message{}, false, nil // full after all (a writer changed it): read again later
	}
	index := head + count
	e := g.entry(gp, index)
	e[0].Store(rec.Offset)
	e[1].Store(entryMeta(1, entryInFlight, g.me))
	e[2].Store(deadline)
	gp.w[pwCount].Store(count + 1)
	gp.w[pwNext].Store(gp.stream.Offset())
	if gp.w[pwMinDue].Load() > deadline {
		gp.w[pwMinDue].Store(deadline)
	}
	if count == 0 {
		if err := g.repin(p, gp); err != nil {
			return Message{}, false, err
		}
	}
	return Message{Partition: p, Offset: rec.Offset, Payload: rec.Payload, Attempt: 1, index: index}, true, nil
}

// due finds the oldest in-flight entry whose deadline has passed and
// lowers the partition's minDue to the earliest deadline of the others.
func (g *Consumer) due(gp *groupPart, now uint64) (uint64, bool) {
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	minDue := ^uint64(0)
	found, at := false, uint64(0)
	for i := range count {
		e := g.entry(gp, head+i)
		if metaState(e[1].Load()) != entryInFlight {
			continue
		}
		d := e[2].Load()
		if !found && d <= now {
			found, at = true, head+i
			continue // its new deadline is later than now+VT > now
		}
		minDue = min(minDue, d)
	}
	if found {
		minDue = min(minDue, now+uint64(g.cfg.VisibilityTimeout))
	}
	gp.w[pwMinDue].Store(minDue)
	return at, found
}

// readAt reads the record at offset off of partition p in place
// (Log.ReadAt); its segment stays mapped, so the payload stays valid, until
// the next Receive or Close.
func (g *Consumer) readAt(ctx context.Context, p int, off uint64) (Record, error) {
	if g.redo != nil {
		g.redo()
		g.redo = nil
	}
	if tail := g.l.parts[p].tail.Load(); off >= tail {
		return Record{}, fmt.Errorf("mq: group %s partition %d: an entry at offset %d, past the log's tail %d: %w", g.name, p, off, tail, shm.ErrCorrupt)
	}
	// The record was delivered, so it is committed: anything else at off
	// means the entry or the log is corrupt. ReadAt maps just the
	// record's segment (a Reader would map the next one ahead, touching
	// every page).
	rec, release, err := g.l.ReadAt(p, off)
	if errors.Is(err, ErrNotRecord) {
		return Record{}, fmt.Errorf("mq: group %s partition %d: an entry at offset %d: %w (%w)", g.name, p, off, shm.ErrCorrupt, err)
	}
	if err != nil {
		return Record{}, fmt.Errorf("mq: group %s partition %d offset %d: %w", g.name, p, off, err)
	}
	g.redo = release
	return rec, nil
}

// deadLetter copies the record at act.off, held as attempt act.attempt
// (one more than its deliveries), to the dead-letter log and acks it. The
// copy's wait for room (a full log under FullBlock) ends with ctx or
// Close.
//
// A copy and its ack are two steps, so the copy in progress is recorded
// in the partition's state (pwDL*) between claiming its space and
// committing it: the next owner of an entry whose copier died looks at
// the recorded copy first (copied) and acks a committed one instead of
// making a second. A copy claimed but not recorded, or recorded but not
// committed, belongs to a dead producer and is skipped by the dead-letter
// log's readers.
func (g *Consumer) deadLetter(ctx context.Context, p int, gp *groupPart, act pollAction) error {
	index, off, hold := act.index, act.off, act.attempt
	attempts := max(min(hold-1, g.cfg.MaxAttempts), 1) // deliveries (a redelivered copy's hold is higher)
	dl := g.cfg.DeadLetter
	dp := p % dl.cfg.Partitions
	rec, err := g.readAt(ctx, p, off)
	if errors.Is(err, ErrOffsetGone) {
		return g.settleTaken(p, index, off, hold, func() { g.lost(p, gp, "retention dropped a record out of attempts", off, off) })
	}
	if err != nil {
		return err
	}
	if act.copying {
		switch state, err := g.copied(p, dp, act.copyAt, off, deadLetterHeader+len(rec.Payload)); {
		case err != nil:
			return err
		case state == copyDone:
			return g.settleTaken(p, index, off, hold, func() {
				gp.w[pwDeadLetters].Add(1)
				g.cfg.Logger.Info("mq: dead-lettered (copied by a member that did not ack it)", "group", g.name, "partition", p, "offset", off, "to", dl.Name(), "at", act.copyAt)
			})
		case state == copyWriting:
			// A live member is still writing the copy (it held the
			// entry until its visibility timeout, and the partition
			// changed hands): look again soon, rather than copy twice.
			return g.later(p, index, off, hold)
		}
		// copyNone: the copier died before committing it. Copy again.
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(g.closing, cancel)()
	res, err := dl.Loan(lctx, dp, deadLetterHeader+len(rec.Payload))
	if err != nil {
		if g.closing.Err() != nil {
			return ErrClosed // the entry stays held: the next owner finds this member gone
		}
		return fmt.Errorf("mq: group %s: dead-letter partition %d offset %d: %w", g.name, p, off, err)
	}
	g.step("deadLetter:claimed")
	switch rc, err := g.recordCopy(p, index, off, hold, res.Offset()); {
	case err != nil:
		res.Abort()
		return err
	case rc == recordNotHeld:
		res.Abort()
		g.cfg.Logger.Warn("mq: group entry taken over before it was dead-lettered: it may come again", "group", g.name, "partition", p, "offset", off)
		return nil
	case rc == recordBusy:
		// Another entry's copy is recorded and still unsettled (its
		// copier, alive, is writing it): one record per partition, so
		// this copy waits for that one.
		res.Abort()
		return g.later(p, index, off, hold)
	}
	g.step("deadLetter:recorded")
	b := res.Bytes()
	binary.LittleEndian.PutUint32(b, deadLetterMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(p))
	binary.LittleEndian.PutUint64(b[8:], off)
	binary.LittleEndian.PutUint32(b[16:], uint32(attempts))
	binary.LittleEndian.PutUint32(b[20:], 0)
	copy(b[deadLetterHeader:], rec.Payload)
	if err := res.Commit(); err != nil {
		return fmt.Errorf("mq: group %s: dead-letter: %w", g.name, err)
	}
	g.step("deadLetter:committed")
	return g.settleTaken(p, index, off, hold, func() {
		gp.w[pwDeadLetters].Add(1)
		g.cfg.Logger.Info("mq: dead-lettered", "group", g.name, "partition", p, "offset", off, "attempts", attempts, "to", dl.Name())
	})
}

// dlTag is the pwDLTag word for partition p's copies: the dead-letter
// log's name hash and partition (members may name different logs).
func (g *Consumer) dlTag(p int) uint64 {
	dl := g.cfg.DeadLetter
	if dl == nil {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(dl.Name()))
	return uint64(h.Sum32())<<32 | uint64(p%dl.cfg.Partitions)<<8 | 1
}

// What recordCopy did.
const (
	recorded      = iota
	recordNotHeld // the entry is no longer held so
	recordBusy    // another in-flight entry's copy is recorded
)

// recordCopy records, under the partition's lock, that the entry at
// index, held with attempt hold, is being copied to offset at of the
// dead-letter log. It does not if the entry is no longer so held, or if
// the record names another entry still in flight: that copy, unsettled,
// keeps its record until its ack clears it (overwritten, its entry would
// be copied again).
func (g *Consumer) recordCopy(p int, index, off uint64, hold int, at uint64) (int, error) {
	gp := g.parts[p]
	held, err := g.lockHeld(p, index, off, hold)
	if err != nil {
		return 0, err
	}
	defer gp.lock.Unlock()
	if !held {
		return recordNotHeld, nil
	}
	if g.recordBusy(gp, index) {
		return recordBusy, nil
	}
	gp.lock.BeginWrite()
	gp.w[pwDLIndex].Store(index)
	gp.w[pwDLAt].Store(at)
	gp.w[pwDLTag].Store(g.dlTag(p))
	gp.lock.EndWrite()
	return recorded, nil
}

// recordBusy reports whether the partition's dead-letter record names an
// entry other than index that is still in flight (the lock held): its
// copy is unsettled, and the record must stay.
func (g *Consumer) recordBusy(gp *groupPart, index uint64) bool {
	other := gp.w[pwDLIndex].Load()
	if gp.w[pwDLTag].Load() == 0 || other == index {
		return false
	}
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	return other >= head && other < head+count && metaState(g.entry(gp, other)[1].Load()) == entryInFlight
}

// lockHeld takes partition p's lock and checks its ring, and reports
// whether this member holds the entry at index (record off) with attempt
// hold. Unless it fails, the caller unlocks.
func (g *Consumer) lockHeld(p int, index, off uint64, hold int) (bool, error) {
	gp := g.parts[p]
	if err := g.lockPart(p); err != nil {
		return false, err
	}
	if err := checkRing(gp.w, g.cap); err != nil {
		gp.lock.Unlock()
		return false, fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	return g.holds(gp, index, off, hold), nil
}

// holds reports whether this member holds the entry at index (record off)
// with attempt hold (the partition's lock held, ring checked).
func (g *Consumer) holds(gp *groupPart, index, off uint64, hold int) bool {
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	if index < head || index >= head+count {
		return false
	}
	e := g.entry(gp, index)
	return e[0].Load() == off && e[1].Load() == entryMeta(hold, entryInFlight, g.me)
}

// What became of a recorded dead-letter copy (copied).
const (
	copyNone    = iota // not committed, and its writer is gone (or it is not the copy)
	copyWriting        // being written by a live producer
	copyDone           // committed
)

// copied looks at the dead-letter copy recorded at offset at of the
// dead-letter log's partition dp, n bytes for the record at off of
// partition p, reading its header once (Log.claimAt: a claim whose producer is dead is
// aborted there, so it cannot be committed after this says copyNone).
// A copy it cannot read, gone to retention or corrupt, is made again: a
// second dead letter rather than none.
func (g *Consumer) copied(p, dp int, at, off uint64, n int) (int, error) {
	dl := g.cfg.DeadLetter
	rec, release, held, err := dl.claimAt(dp, at, n)
	switch {
	case held:
		return copyWriting, nil
	case err == nil && release != nil:
		defer release()
		if d, err := ParseDeadLetter(rec.Payload); err == nil && d.Partition == p && d.Offset == off {
			return copyDone, nil
		}
		g.cfg.Logger.Warn("mq: the recorded dead-letter copy is another record: copying again", "group", g.name, "partition", p, "offset", off, "to", dl.Name(), "at", at)
		return copyNone, nil
	case err == nil:
		return copyNone, nil // aborted, or its producer died before its commit
	case errors.Is(err, ErrOffsetGone), errors.Is(err, ErrNotRecord), errors.Is(err, shm.ErrCorrupt):
		g.cfg.Logger.Warn("mq: the recorded dead-letter copy cannot be read: copying again (it may be a second)", "group", g.name, "partition", p, "offset", off, "to", dl.Name(), "at", at, "err", err)
		return copyNone, nil
	}
	return 0, fmt.Errorf("mq: group %s partition %d: the dead-letter copy of offset %d at %d: %w", g.name, p, off, at, err)
}

// later gives the entry at index, held with attempt hold for a
// dead-letter copy, a deadline one liveness period away, so that the
// copy another member is writing is looked at again then.
func (g *Consumer) later(p int, index, off uint64, hold int) error {
	gp := g.parts[p]
	held, err := g.lockHeld(p, index, off, hold)
	if err != nil {
		return err
	}
	defer gp.lock.Unlock()
	if !held {
		return nil
	}
	gp.lock.BeginWrite()
	postpone(gp, g.entry(gp, index), uint64(g.cfg.now().Add(livenessEvery).UnixNano()))
	gp.lock.EndWrite()
	return nil
}

// postpone sets entry e's deadline to d (unix ns), lowering the
// partition's minDue to it if need be (the write open).
func postpone(gp *groupPart, e []atomic.Uint64, d uint64) {
	e[2].Store(d)
	gp.w[pwMinDue].Store(min(gp.w[pwMinDue].Load(), d))
}

// settleTaken settles an entry Receive took (a redelivery whose record
// retention dropped, a dead-letter copy). ErrNotHeld is no error there:
// the partition's next owner took the entry meanwhile (and delivers or
// dead-letters it again); any other error is Receive's.
func (g *Consumer) settleTaken(p int, index, off uint64, attempt int, then func()) error {
	err := g.settle(p, index, off, attempt, then)
	if errors.Is(err, ErrNotHeld) {
		g.cfg.Logger.Warn("mq: group entry taken over before it was settled: it may come again", "group", g.name, "partition", p, "offset", off)
		return nil
	}
	return err
}

// Dead-letter records: a header then the original payload.
const (
	deadLetterMagic  = 0x4c44516d // "mQDL"
	deadLetterHeader = 24
)

// DeadLetter is a record of a dead-letter log, as ParseDeadLetter decodes
// it: where the message was and how often it was delivered.
type DeadLetter struct {
	Partition int
	Offset    uint64
	Attempts  int
	Payload   []byte // the original payload (a subslice of the record's)
}

// ParseDeadLetter decodes a record a consumer group wrote to its
// dead-letter log. A payload that is not one is an error.
func ParseDeadLetter(b []byte) (DeadLetter, error) {
	if len(b) < deadLetterHeader || binary.LittleEndian.Uint32(b) != deadLetterMagic || binary.LittleEndian.Uint32(b[20:]) != 0 {
		return DeadLetter{}, fmt.Errorf("mq: not a dead-letter record (%d bytes)", len(b))
	}
	p, attempts := binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[16:])
	if p >= maxPartitions || attempts == 0 || attempts > maxAttempts || binary.LittleEndian.Uint64(b[8:])%8 != 0 {
		return DeadLetter{}, fmt.Errorf("mq: dead-letter record names partition %d, %d attempts", p, attempts)
	}
	return DeadLetter{Partition: int(p), Offset: binary.LittleEndian.Uint64(b[8:]), Attempts: int(attempts), Payload: b[deadLetterHeader:]}, nil
}

// settle acks the entry at index if this consumer still holds it with the
// given attempt, running then (with the write open) before it returns.
func (g *Consumer) settle(p int, index, off uint64, attempt int, then func()) error {
	gp := g.parts[p]
	held, err := g.lockHeld(p, index, off, attempt)
	if err != nil {
		return err
	}
	defer gp.lock.Unlock()
	if !held {
		return ErrNotHeld
	}
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	e := g.entry(gp, index)
	gp.lock.BeginWrite()
	defer gp.lock.EndWrite()
	if gp.w[pwDLTag].Load() != 0 && gp.w[pwDLIndex].Load() == index {
		gp.w[pwDLTag].Store(0) // its dead-letter copy, if any, is done
	}
	if count == uint64(g.cap) {
		// The owner may wait for room: wake it.
		defer g.ring(p)
	}
	e[1].Store(entryMeta(attempt, entryAcked, g.me))
	for count > 0 && metaState(g.entry(gp, head)[1].Load()) == entryAcked {
		head++
		count--
	}
	gp.w[pwHead].Store(head)
	gp.w[pwCount].Store(count)
	if then != nil {
		then()
	}
	if gp.w[pwOwner].Load() == g.me {
		return g.repin(p, gp)
	}
	return nil
}

// Ack settles m: it is not delivered again. It fails with ErrNotHeld if m
// was redelivered since (its visibility timeout passed) or acked already.
func (g *Consumer) Ack(m Message) error {
	g.life.RLock()
	defer g.life.RUnlock()
	if g.closed.Load() {
		return ErrClosed
	}
	if m.Partition < 0 || m.Partition >= len(g.parts) {
		return fmt.Errorf("mq: ack of partition %d: %w", m.Partition, ErrNotHeld)
	}
	return g.settle(m.Partition, m.index, m.Offset, m.Attempt, nil)
}

// Nack gives m back for redelivery at once (to this consumer or the
// partition's owner), counting as one attempt.
func (g *Consumer) Nack(m Message) error {
	g.life.RLock()
	defer g.life.RUnlock()
	if g.closed.Load() {
		return ErrClosed
	}
	if m.Partition < 0 || m.Partition >= len(g.parts) {
		return fmt.Errorf("mq: nack of partition %d: %w", m.Partition, ErrNotHeld)
	}
	gp := g.parts[m.Partition]
	if err := g.lockPart(m.Partition); err != nil {
		return err
	}
	defer gp.lock.Unlock()
	if err := checkRing(gp.w, g.cap); err != nil {
		return fmt.Errorf("mq: group %s partition %d: %w", g.name, m.Partition, err)
	}
	head, count := gp.w[pwHead].Load(), g.ringCount(gp)
	if m.index < head || m.index >= head+count {
		return ErrNotHeld
	}
	e := g.entry(gp, m.index)
	if e[0].Load() != m.Offset || e[1].Load() != entryMeta(m.Attempt, entryInFlight, g.me) {
		return ErrNotHeld
	}
	gp.lock.BeginWrite()
	e[2].Store(0)
	gp.w[pwMinDue].Store(0)
	gp.lock.EndWrite()
	g.ring(m.Partition)
	return nil
}

// GroupStats is a partition's state in a group, read from shared memory.
type GroupStats struct {
	// Owner is the member slot that owns the partition, or -1.
	Owner int
	// Committed is the log offset below which every record is acked;
	// Next the offset of the first record not yet delivered.
	Committed, Next uint64
	// InFlight counts the entries between them (delivered, not all acked).
	InFlight int
	// Redelivered counts redeliveries, DeadLettered records sent to the
	// dead-letter log, Lost records retention dropped before they were
	// acked (or ranges of them never read).
	Redelivered, DeadLettered, Lost uint64
}

// Stats returns partition p's state in the group.
func (g *Consumer) Stats(p int) (GroupStats, error) {
	g.life.RLock()
	defer g.life.RUnlock()
	if g.closed.Load() {
		return GroupStats{}, ErrClosed
	}
	if p < 0 || p >= len(g.parts) {
		return GroupStats{}, fmt.Errorf("mq: partition %d of %d", p, len(g.parts))
	}
	gp := g.parts[p]
	read := func() GroupStats {
		return GroupStats{
			Owner: holderSlot(gp.w[pwOwner].Load()), Committed: committed(gp.w, g.cap), Next: gp.w[pwNext].Load(),
			InFlight: int(gp.w[pwCount].Load()), Redelivered: gp.w[pwRedelivered].Load(),
			DeadLettered: gp.w[pwDeadLetters].Load(), Lost: gp.w[pwLost].Load(),
		}
	}
	for range optimisticReads {
		seq, err := gp.lock.Begin(time.Second)
		if err != nil {
			return GroupStats{}, err
		}
		if err := checkPart(gp.w, g.cap); err != nil {
			if gp.lock.Validate(seq) {
				return GroupStats{}, err
			}
			continue
		}
		s := read()
		if g.torn != nil {
			g.torn()
		}
		if gp.lock.Validate(seq) {
			return s, nil
		}
	}
	if err := g.lockPart(p); err != nil {
		return GroupStats{}, err
	}
	defer gp.lock.Unlock()
	if err := checkPart(gp.w, g.cap); err != nil {
		return GroupStats{}, fmt.Errorf("mq: group %s partition %d: %w", g.name, p, err)
	}
	return read(), nil
}

// Member is this consumer's member slot in the group.
func (g *Consumer) Member() int { return g.slot }

// Close leaves the group: the partitions go to the other members, and the
// messages this consumer holds unacked are redelivered at once. Close
// consumers before their Log.
func (g *Consumer) Close() error {
	if g.closed.Swap(true) {
		return nil
	}
	g.stopClosing() // a dead-letter copy under way ends
	g.ring(-1)      // a Receive asleep returns
	g.mu.Lock()
	defer g.mu.Unlock()
	g.life.Lock()
	defer g.life.Unlock()
	others := false
	for i := range maxMembers {
		if w := g.mem[2*i].Load(); i != g.slot && w != 0 && shm.AliveWord(w) {
			others = true
		}
	}
	for _, p := range g.owned {
		if others {
			g.handOver(p) // the pin holds the partition until one takes it
		} else {
			g.drop(p)
		}
	}
	g.owned = nil
	g.publishOwned()
	if !others {
		// The last member: nobody takes the partitions to release the
		// pins handed over to them.
		for p, gp := range g.parts {
			if g.lockPart(p) == nil {
				g.releaseOrphans(p, gp)
				gp.lock.Unlock()
			}
		}
	}
	if g.redo != nil {
		g.redo()
		g.redo = nil
	}
	var errs []error
	if err := g.lockGroup(); err == nil {
		if g.mem[2*g.slot].Load() == g.pw && g.mem[2*g.slot+1].Load()&0xffffffff == g.memGen {
			g.lock.BeginWrite()
			g.mem[2*g.slot].Store(0)
			g.bumpGeneration()
		}
		g.lock.Unlock()
	} else {
		errs = append(errs, err)
	}
	errs = append(errs, g.seg.Close())
	return errors.Join(errs...)
}

// RemoveGroup deletes consumer group group of log: its segment. Members
// that have it open keep their mappings.
func RemoveGroup(log, group string) error {
	seg, err := shm.OpenSegment(groupName(log, group))
	if err != nil {
		return fmt.Errorf("mq: remove group %s of %s: %w", group, log, err)
	}
	return errors.Join(seg.Unlink(), seg.Close())
}
