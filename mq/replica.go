package mq

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// Replication of a partition to a follower on another node (docs/mq.md,
// "Across the super node").
//
// This was built when ub registered only memory its provider allocates
// (Context.AllocSegment), so the leader could not write into the
// follower's mq segments themselves; Context.RegisterSegment now can,
// and docs/mq.md ("Planned") says how replication would use it. The
// follower
// receives into a ring it allocates with ub and exposes (the brpc shape
// of shared/URMA.md: each side owns the memory it receives into, every
// cross-node access is a posted store, nobody loads remotely): the
// leader stores records into the ring with one-sided Writes and rings a
// doorbell (WriteImm, its immediate the ring's new tail); the follower,
// woken by the doorbell's completion, checks every entry, appends it to
// its own Log at the same offset (minus the base), and acknowledges with
// a WriteImm into the leader's ack segment whose immediate is the ring
// position it has consumed. One copy on each side: the leader's from its
// mq segment into its registered staging memory, the follower's from
// the ring into its mq segment.

// Errors of replication. Match them with errors.Is.
var (
	// ErrReplicaDown: the follower cannot be reached (a ub operation
	// failed: link down, peer dead) or stopped acknowledging. It ends the
	// replication.
	ErrReplicaDown = errors.New("mq: follower unreachable")
	// ErrFollowerBehind: the follower has acknowledged less of the
	// partition than ReplicaConfig.MaxLag allows. It is reported, not
	// fatal.
	ErrFollowerBehind = errors.New("mq: follower behind")
	// ErrLeaderSilent: a follower heard nothing from its leader (not even
	// a heartbeat) for FollowerConfig.DeadAfter.
	ErrLeaderSilent = errors.New("mq: leader silent")
	// ErrDiverged: the follower's partition does not hold what the leader
	// sent where it should (someone else writes it).
	ErrDiverged = errors.New("mq: follower partition diverged from the leader")
)

// AckPolicy says when Replica.Send returns.
type AckPolicy uint8

const (
	// AckAsync: once the record is in the leader's log; the follower
	// catches up in the background.
	AckAsync AckPolicy = iota
	// AckFollower: once the follower has the record in its log, so that
	// it survives the leader's node.
	AckFollower
)

const (
	ringData     = 64 // the ring's data starts after its doorbell word
	maxDoorbells = 16 // doorbells in flight, well within the 64 receives posted
	recvDepth    = 64
	ackSegSize   = 64
	userRecv     = 1 << 63
	userDoorbell = 1 << 62
	userPing     = 1 << 61
	// pingImm is the immediate of a heartbeat (leader to follower) and of
	// its answer (follower to leader): no ring position, which stays
	// below 2^63, is it.
	pingImm   = 1 << 63
	sendBatch = 256 << 10
)

// ReplicaConfig configures a leader's replication. The zero value is
// usable.
type ReplicaConfig struct {
	// Ack is Replica.Send's policy (default AckAsync).
	Ack AckPolicy
	// MaxLag is the bytes of the partition beyond what the follower has
	// acknowledged at which it is reported behind (default 4 MiB).
	MaxLag uint64
	// Heartbeat is how often an idle leader rings the doorbell, so that
	// a dead link is found without traffic (default 50 ms).
	Heartbeat time.Duration
	// DeadAfter is how long a doorbell may go unacknowledged before the
	// follower is declared unreachable (default 1 s). A dead link is
	// reported within Heartbeat + DeadAfter, and at once when a ub
	// operation fails.
	DeadAfter time.Duration
	// MaxRing bounds the ring a follower may ask the leader to mirror
	// in its staging memory (default 64 MiB, at least a segment): a
	// follower cannot make the leader allocate more.
	MaxRing uint64
	// OnFault, if set, is called with each fault (ErrReplicaDown once,
	// ErrFollowerBehind each time the lag crosses MaxLag), from a
	// goroutine of the replica; it must not block.
	OnFault func(error)
}

func (c ReplicaConfig) withDefaults() ReplicaConfig {
	if c.MaxLag == 0 {
		c.MaxLag = 4 << 20
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = 50 * time.Millisecond
	}
	if c.DeadAfter <= 0 {
		c.DeadAfter = time.Second
	}
	if c.OnFault == nil {
		c.OnFault = func(error) {}
	}
	if c.MaxRing == 0 {
		c.MaxRing = 64 << 20
	}
	return c
}

// ReplicaStats is a leader's view of its follower.
type ReplicaStats struct {
	// Base is the leader offset the follower's partition starts at (its
	// offset 0).
	Base uint64
	// Acked is the leader offset up to which the follower has every
	// record: a record at o is on the follower when o < Acked.
	Acked uint64
	// Lag is the partition's tail minus Acked, when last looked at.
	Lag uint64
	// Behind says whether Lag is beyond MaxLag now; BehindEvents counts
	// the times it went there.
	Behind       bool
	BehindEvents uint64
	// Records and Bytes (payload) written into the follower's ring,
	// Doorbells rung (heartbeats included).
	Records, Bytes, Doorbells uint64
	// Down is the fault that ended the replication, or nil.
	Down error
}

type doorbell struct {
	ring   uint64    // the ring tail it announced
	next   uint64    // the leader offset after the records before it
	posted time.Time // when it was rung
}

// Replica replicates partition p of a leader's log to one follower.
type Replica struct {
	l    *Log
	p    int
	cfg  ReplicaConfig
	base uint64

	dev     ub.Context
	cq      ub.CQ
	jetty   ub.Jetty
	ackSeg  ub.Segment
	staging ub.Segment
	ring    ub.RemoteSegment
	target  ub.Target
	ctrl    net.Conn
	size    uint64 // the ring's data bytes

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	changed   chan struct{} // closed and replaced when acked or down change
	tail      uint64        // ring position staged up to
	lastNext  uint64        // leader offset after the last record staged
	posted    uint64        // ring position written and announced up to
	postNext  uint64        // leader offset after the last record announced
	freeUntil uint64        // ackedRing + size: staging must stop there
	ackedRing uint64
	bells     []doorbell
	lastPing  time.Time // when the latest heartbeat was sent
	pingOut   time.Time // when the oldest heartbeat not answered was sent, or zero
	lastHeard time.Time // when the follower last said anything (an ack, an answer)
	acked     uint64
	down      error
	behind    bool
	stats     ReplicaStats

	records, bytes atomic.Uint64
}

// Replicate starts replicating partition p of l, from its oldest kept
// segment, to the follower at the other end of ctrl (a connection to a
// process that called Follow; an authenticated one: see docs/mq.md,
// "Replication"), through dev, this node's ub context. A Replicate that
// fails tells the follower why (if it got that far) and closes ctrl.
// Close the Replica before l and dev.
func Replicate(ctx context.Context, l *Log, p int, dev ub.Context, ctrl net.Conn, cfg ReplicaConfig) (*Replica, error) {
	st, err := l.Stats(p)
	if err != nil {
		ctrl.Close()
		return nil, err
	}
	r := &Replica{l: l, p: p, cfg: cfg.withDefaults(), base: st.Oldest, dev: dev, ctrl: ctrl, changed: make(chan struct{})}
	r.acked, r.lastNext, r.postNext = r.base, r.base, r.base
	offered := false
	fail := func(err error) (*Replica, error) {
		if offered {
			// The follower may have accepted: it must not wait for a
			// leader that is not there.
			tellEnd(ctrl, err)
		}
		ctrl.Close()
		r.closeUB()
		return nil, fmt.Errorf("mq: replicate %s partition %d: %w", l.Name(), p, err)
	}
	var tokens [2]ub.Token
	for i := range tokens {
		tokens[i] = randomToken()
	}
	if r.cq, err = dev.NewCQ(ub.CQConfig{Depth: 1024}); err != nil {
		return fail(err)
	}
	if r.jetty, err = dev.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: r.cq, RecvCQ: r.cq, RecvDepth: recvDepth, Token: tokens[1]}); err != nil {
		return fail(err)
	}
	if r.ackSeg, err = dev.AllocSegment(ackSegSize, ub.SegmentConfig{Access: ub.AccessWrite, Token: tokens[0]}); err != nil {
		return fail(err)
	}
	if err := postRecvs(r.jetty, r.ackSeg, recvDepth); err != nil {
		return fail(err)
	}
	stop := handshakeDeadline(ctx, ctrl)
	_, err = ctrl.Write(appendOffer(nil, offer{partition: uint32(p), segSize: uint64(l.Config().SegmentSize), base: r.base,
		segments: uint32(min(l.Config().Segments, maxOfferSegments)), ackSeg: r.ackSeg.Desc(), ackToken: tokens[0],
		jetty: r.jetty.Desc(), jtToken: tokens[1]}))
	if err != nil {
		stop()
		return fail(closedErr(err))
	}
	offered = true
	br := bufio.NewReader(ctrl)
	typ, body, err := readFrame(br, maxControl, nil)
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return fail(closedErr(err))
	}
	var a accept
	switch typ {
	case frameError:
		return fail(decodeError(body))
	case frameAccept:
		a, err = decodeAccept(body)
	default:
		err = protoErr("frame type %d for an accept", typ)
	}
	if err != nil {
		return fail(err)
	}
	if seg := uint64(l.Config().SegmentSize); a.ringSize < seg || a.ringSize > max(r.cfg.MaxRing, seg) {
		return fail(protoErr("a ring of %d bytes for segments of %d (at most %d)", a.ringSize, seg, max(r.cfg.MaxRing, seg)))
	}
	r.size = a.ringSize
	r.freeUntil = r.size
	if r.ring, err = dev.ImportSegment(a.ring, a.ringToken); err != nil {
		return fail(err)
	}
	if r.target, err = dev.ImportJetty(a.jetty, a.jtToken); err != nil {
		return fail(err)
	}
	// Staging mirrors the ring (one more word: the doorbell's source,
	// always zero).
	if r.staging, err = dev.AllocSegment(int(r.size)+8, ub.SegmentConfig{}); err != nil {
		return fail(err)
	}
	reader, err := l.NewReader(p, r.base)
	if err != nil {
		return fail(err)
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.lastPing, r.lastHeard = time.Now(), time.Now()
	r.wg.Go(func() { r.send(reader) })
	r.wg.Go(r.complete)
	r.wg.Go(r.monitor)
	r.wg.Go(func() {
		// The follower ending the control connection ends replication:
		// with its reason (ErrDiverged, shm.ErrCorrupt, ErrProtocol...),
		// if it said one.
		said, err := peerEnd(br)
		if said != nil {
			r.fault(fmt.Errorf("the follower stopped: %w: %w", ErrReplicaDown, said))
			return
		}
		r.fault(fmt.Errorf("the follower closed the control connection: %w: %w", ErrReplicaDown, err))
	})
	return r, nil
}

// peerEnd reads a control connection after the handshake, where the
// only frame is an error saying why the peer ended: it returns what the
// peer said, or why the connection ended without a word.
func peerEnd(br *bufio.Reader) (said, err error) {
	typ, body, err := readFrame(br, maxControl, nil)
	switch {
	case err != nil:
		return nil, err
	case typ == frameError:
		return decodeError(body), nil
	}
	return protoErr("frame type %d on the control connection", typ), nil
}

// tellEnd writes why replication ended to the peer, if it can in a
// second, and closes the control connection.
func tellEnd(c net.Conn, err error) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(appendError(nil, err))
	c.Close()
}

func randomToken() ub.Token {
	var b [4]byte
	rand.Read(b[:])
	return ub.Token(binary.LittleEndian.Uint32(b[:]) | 1)
}

// handshakeDeadline makes ctx end the handshake on c; stop reports
// whether ctx had not ended.
func handshakeDeadline(ctx context.Context, c net.Conn) (stop func() bool) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	after := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() bool {
		ok := after()
		c.SetDeadline(time.Time{})
		return ok
	}
}

func postRecvs(j ub.Jetty, seg ub.Segment, n int) error {
	wrs := make([]ub.RecvWR, n)
	for i := range wrs {
		wrs[i] = ub.RecvWR{UserCtx: userRecv | uint64(i), Buf: ub.Local{Seg: seg, Offset: 8, Len: 8}}
	}
	_, err := j.PostRecv(wrs)
	return err
}

// fault ends the replication with err (the first one wins) or, for
// ErrFollowerBehind, only reports it.
func (r *Replica) fault(err error) {
	r.mu.Lock()
	if errors.Is(err, ErrFollowerBehind) {
		r.mu.Unlock()
		r.cfg.OnFault(err)
		return
	}
	if r.down != nil {
		r.mu.Unlock()
		return
	}
	r.down = err
	r.broadcast()
	r.mu.Unlock()
	r.cancel()
	tellEnd(r.ctrl, err) // the follower learns that replication ended, and why
	r.cfg.OnFault(err)
}

// broadcast wakes the waiters on r.changed; r.mu is held.
func (r *Replica) broadcast() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// send is the goroutine that reads the partition and writes its records
// into the follower's ring.
func (r *Replica) send(reader *Reader) {
	defer reader.Close()
	stage := r.staging.Bytes()
	pending := false // entries written into staging, not yet posted
	var start uint64 // the ring position of the first of them
	for {
		var rec Record
		var got bool
		var err error
		if pending {
			// Post what is staged rather than wait (for the tail, or for
			// a record after it that is being written, held or left by
			// a dead producer): the follower, and Sends under
			// AckFollower, must not wait for a later record.
			post := r.tail-start >= sendBatch
			if !post {
				if ps, serr := r.l.Stats(r.p); serr != nil || ps.Tail <= reader.Offset() {
					post = true
				} else if rec, got, err = nextNow(reader); err == nil && !got {
					post = true
				}
			}
			if post && err == nil {
				if err := r.post(start); err != nil {
					r.fault(err)
					return
				}
				pending = false
			}
		}
		if !got && err == nil {
			rec, err = reader.Next(r.ctx)
		}
		if err != nil {
			if r.ctx.Err() == nil {
				r.fault(fmt.Errorf("reading the partition: %w", err))
			}
			return
		}
		n := uint64(len(rec.Payload))
		entry := align8(ringEntry + n)
		// An entry that does not fit in the rest of the ring goes after a
		// wrap entry (none if fewer than 16 bytes are left), which takes
		// room of its own first: the two together may need more than the
		// ring.
		for placed := false; !placed; {
			r.mu.Lock()
			rest := r.size - r.tail%r.size
			wrap := entry > rest
			need := entry
			if wrap {
				need = rest
			}
			room := r.tail+need <= r.freeUntil
			down, changed := r.down, r.changed
			r.mu.Unlock()
			if down != nil {
				return
			}
			if !room {
				if pending {
					// What is staged must go first: its acks make the room.
					if err := r.post(start); err != nil {
						r.fault(err)
						return
					}
					pending = false
					continue
				}
				select {
				case <-changed:
				case <-r.ctx.Done():
					return
				}
				continue
			}
			r.mu.Lock()
			if !pending {
				start = r.tail
				pending = true
			}
			phys := r.tail % r.size
			if wrap {
				if rest >= ringEntry {
					binary.LittleEndian.PutUint64(stage[phys:], ringWrap)
					binary.LittleEndian.PutUint64(stage[phys+8:], 0)
				}
				r.tail += rest
			} else {
				binary.LittleEndian.PutUint64(stage[phys:], rec.Offset)
				binary.LittleEndian.PutUint32(stage[phys+8:], uint32(n))
				binary.LittleEndian.PutUint32(stage[phys+12:], crc32.Checksum(rec.Payload, castagnoli))
				copy(stage[phys+ringEntry:], rec.Payload)
				r.tail += entry
				r.lastNext = rec.Offset + align8(headerSize+n)
				placed = true
			}
			r.mu.Unlock()
		}
		r.records.Add(1)
		r.bytes.Add(n)
	}
}

// post writes the staged ring range [start, r.tail) into the follower's
// ring and rings the doorbell, waiting for a free doorbell first.
func (r *Replica) post(start uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.bells) >= maxDoorbells {
		if r.down != nil {
			return r.down
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-r.ctx.Done():
		}
		r.mu.Lock()
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
	}
	var wrs []ub.WR
	for pos := start; pos < r.tail; {
		phys := pos % r.size
		n := min(r.tail-pos, r.size-phys)
		wrs = append(wrs, ub.WR{Op: ub.OpWrite, UserCtx: pos + n, Target: r.target,
			Local:  ub.Local{Seg: r.staging, Offset: int(phys), Len: int(n)},
			Remote: ub.Remote{Seg: r.ring, Offset: ringData + int(phys)}})
		pos += n
	}
	r.posted, r.postNext = r.tail, r.lastNext
	return r.ringLocked(wrs)
}

// ringLocked posts wrs and a doorbell announcing r.posted; r.mu is held.
func (r *Replica) ringLocked(wrs []ub.WR) error {
	wrs = append(wrs, ub.WR{Op: ub.OpWriteImm, UserCtx: userDoorbell, Target: r.target, Imm: r.posted,
		Local:  ub.Local{Seg: r.staging, Offset: int(r.size), Len: 8},
		Remote: ub.Remote{Seg: r.ring}})
	if _, err := r.jetty.PostSend(wrs); err != nil {
		return fmt.Errorf("posting to the follower: %w: %w", ErrReplicaDown, err)
	}
	r.bells = append(r.bells, doorbell{ring: r.posted, next: r.postNext, posted: time.Now()})
	r.stats.Doorbells++
	return nil
}

// pingLocked sends a heartbeat, which the follower answers at once, busy
// or not (its acknowledgements wait for its log): liveness apart from
// progress. r.mu is held.
func (r *Replica) pingLocked(now time.Time) error {
	_, err := r.jetty.PostSend([]ub.WR{{Op: ub.OpWriteImm, UserCtx: userPing, Target: r.target, Imm: pingImm,
		Local:  ub.Local{Seg: r.staging, Offset: int(r.size), Len: 8},
		Remote: ub.Remote{Seg: r.ring}}})
	if err != nil {
		return fmt.Errorf("posting a heartbeat to the follower: %w: %w", ErrReplicaDown, err)
	}
	r.lastPing = now
	if r.pingOut.IsZero() {
		r.pingOut = now
	}
	r.stats.Doorbells++
	return nil
}

// silentFor is how long the follower has left something unanswered (a
// doorbell or a heartbeat) without saying anything; r.mu is held.
func (r *Replica) silentFor(now time.Time) time.Duration {
	oldest := r.pingOut
	if len(r.bells) > 0 && (oldest.IsZero() || r.bells[0].posted.Before(oldest)) {
		oldest = r.bells[0].posted
	}
	if oldest.IsZero() {
		return 0
	}
	if r.lastHeard.After(oldest) {
		oldest = r.lastHeard
	}
	return now.Sub(oldest)
}

// complete is the goroutine that takes the completions: the follower's
// acknowledgements and the results of the leader's writes.
func (r *Replica) complete() {
	cs := make([]ub.Completion, 64)
	for {
		if err := r.cq.Wait(r.ctx); err != nil {
			return
		}
		n, err := r.cq.Poll(cs)
		if err != nil {
			return
		}
		for _, c := range cs[:n] {
			if err := r.completion(c); err != nil {
				r.fault(err)
				return
			}
		}
	}
}

func (r *Replica) completion(c ub.Completion) error {
	if err := c.Err(); err != nil {
		return fmt.Errorf("%v of the replica: %w: %w", c.Op, ErrReplicaDown, err)
	}
	switch {
	case c.UserCtx&userRecv != 0:
		// An acknowledgement: post the receive again, then take it.
		if _, err := r.jetty.PostRecv([]ub.RecvWR{{UserCtx: c.UserCtx, Buf: ub.Local{Seg: r.ackSeg, Offset: 8, Len: 8}}}); err != nil {
			return fmt.Errorf("reposting a receive: %w", err)
		}
		if !c.HasImm {
			return protoErr("a follower's message without an immediate")
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lastHeard = time.Now()
		if c.Imm == pingImm { // the answer to the heartbeats sent so far
			r.pingOut = time.Time{}
			return nil
		}
		if len(r.bells) == 0 || r.bells[0].ring != c.Imm {
			return protoErr("an acknowledgement of ring position %d, none such rung", c.Imm)
		}
		b := r.bells[0]
		r.bells = r.bells[1:]
		r.ackedRing = b.ring
		r.acked = b.next
		// The follower read the ring up to there, so the leader's writes
		// into it are done with their staging.
		r.freeUntil = r.ackedRing + r.size
		r.broadcast()
	}
	return nil
}

// monitor is the goroutine that sends heartbeats, declares the follower
// unreachable when it has answered neither a doorbell nor a heartbeat
// for DeadAfter, and watches the lag (a follower that answers heartbeats
// but is slow to acknowledge is behind, not down).
func (r *Replica) monitor() {
	t := time.NewTicker(r.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case now := <-t.C:
			r.mu.Lock()
			var err error
			if d := r.silentFor(now); d > r.cfg.DeadAfter {
				err = fmt.Errorf("no answer for %v: %w", d.Round(time.Millisecond), ErrReplicaDown)
			} else if now.Sub(r.lastPing) >= r.cfg.Heartbeat {
				err = r.pingLocked(now)
			}
			var behind error
			if ps, serr := r.l.Stats(r.p); serr == nil && ps.Tail >= r.acked {
				r.stats.Lag = ps.Tail - r.acked
				switch {
				case !r.behind && r.stats.Lag > r.cfg.MaxLag:
					r.behind = true
					r.stats.BehindEvents++
					behind = fmt.Errorf("%d bytes not acknowledged, more than %d: %w", r.stats.Lag, r.cfg.MaxLag, ErrFollowerBehind)
				case r.behind && r.stats.Lag <= r.cfg.MaxLag/2:
					r.behind = false
				}
			}
			r.mu.Unlock()
			if behind != nil {
				r.fault(behind)
			}
			if err != nil {
				r.fault(err)
				return
			}
		}
	}
}

// Send appends payload to the replicated partition (Log.Send) and, under
// AckFollower, waits until the follower has it. An error after the
// append says so: the record is in the leader's log at the offset
// returned, but the follower may not have it.
func (r *Replica) Send(ctx context.Context, payload []byte) (uint64, error) {
	off, err := r.l.Send(ctx, r.p, payload)
	if err != nil || r.cfg.Ack == AckAsync {
		return off, err
	}
	return off, r.WaitAcked(ctx, off)
}

// WaitAcked waits until the follower has the record at leader offset off
// (or every record before off), the replication ends (ErrReplicaDown) or
// ctx ends.
func (r *Replica) WaitAcked(ctx context.Context, off uint64) error {
	for {
		r.mu.Lock()
		acked, down, changed := r.acked, r.down, r.changed
		r.mu.Unlock()
		if acked > off {
			return nil
		}
		if down != nil {
			return fmt.Errorf("mq: the record at %d is in the leader's log, not acknowledged by the follower: %w", off, down)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("mq: the record at %d is in the leader's log, not acknowledged by the follower yet: %w", off, ctx.Err())
		}
	}
}

// Acked is the leader offset up to which the follower has every record.
func (r *Replica) Acked() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acked
}

// Err is the fault that ended the replication, or nil while it runs.
func (r *Replica) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.down
}

// Stats returns the leader's view of the follower.
func (r *Replica) Stats() ReplicaStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	s.Base, s.Acked, s.Behind, s.Down = r.base, r.acked, r.behind, r.down
	s.Records, s.Bytes = r.records.Load(), r.bytes.Load()
	return s
}

// Close ends the replication (the follower sees the control connection
// close) and releases its ub objects.
func (r *Replica) Close() error {
	r.fault(fmt.Errorf("closed: %w", ErrClosed))
	r.ctrl.Close()
	r.wg.Wait()
	r.closeUB()
	return nil
}

func (r *Replica) closeUB() {
	for _, c := range []interface{ Close() error }{r.jetty, r.cq, r.target, r.ring, r.staging, r.ackSeg} {
		if c != nil {
			c.Close()
		}
	}
}
