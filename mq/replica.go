package mq

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// Replication of a partition to a follower on another node (docs/mq.md,
// "Replication").
//
// The leader writes the partition's bytes, records as they are (headers,
// payloads, aborted records and padding), with one-sided ub Writes
// straight into the follower's own segments of the partition, which the
// follower registers (Context.RegisterSegment) and announces on the
// control connection; offsets are the same on both sides (the follower's
// partition starts at the leader's base). Then it rings a doorbell, a
// WriteImm whose immediate is the offset written up to. The follower,
// woken by the doorbell's completion, checks the headers it got (as Next
// does: states, lengths, offsets, checksums), publishes the tail, and
// acknowledges with a WriteImm into the leader's ack segment whose
// immediate is the new tail. No copy on either side: the source of each
// Write is the leader's own segment, registered as local memory, and
// consumers on the follower read the records where the leader wrote them.

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
	maxDoorbells = 16 // doorbells in flight, well within the 64 receives posted
	recvDepth    = 64
	ackSegSize   = 64
	bellSegSize  = 64
	userRecv     = 1 << 63
	userDoorbell = 1 << 62
	userPing     = 1 << 61
	// pingImm is the immediate of a heartbeat (leader to follower) and of
	// its answer (follower to leader): no log offset, which stays below
	// 2^63, is it.
	pingImm   = 1 << 63
	sendBatch = 256 << 10
	// aheadSegments is how many segments a follower keeps registered for
	// the leader: the one being filled and the next. maxAnnounced bounds
	// how far beyond the segment it writes into a leader takes an
	// announcement.
	aheadSegments = 2
	maxAnnounced  = 4
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
	return c
}

// ReplicaStats is a leader's view of its follower.
type ReplicaStats struct {
	// Base is the offset replication started at, the leader's oldest
	// kept segment then: the follower's partition starts there.
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
	// Records and Bytes (payload) written into the follower's segments,
	// Doorbells rung (heartbeats included).
	Records, Bytes, Doorbells uint64
	// Down is the fault that ended the replication, or nil.
	Down error
}

type doorbell struct {
	end    uint64    // the offset it announced
	posted time.Time // when it was rung
}

// leaderSeg is one of the leader's segments, mapped by the replica and
// registered as the source of the Writes into the follower's copy.
type leaderSeg struct {
	m   *mapped
	reg ub.Segment
}

// Replica replicates partition p of a leader's log to one follower.
type Replica struct {
	l    *Log
	p    int
	cfg  ReplicaConfig
	base uint64
	seg  uint64 // the segment size

	dev    ub.Context
	cq     ub.CQ
	jetty  ub.Jetty
	ackSeg ub.Segment
	src    ub.Segment // the doorbells' 8 bytes (zero)
	bell   ub.RemoteSegment
	target ub.Target
	ctrl   net.Conn

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// local is the send goroutine's (and Close's, after it): this side's
	// segments held as the Writes' sources, by index.
	local map[uint64]*leaderSeg

	mu        sync.Mutex
	changed   chan struct{}               // closed and replaced when acked, down or remote change
	posted    uint64                      // offset written and announced up to
	remote    map[uint64]ub.RemoteSegment // the follower's segments announced and not yet acknowledged past
	nextSeg   uint64                      // the index the follower announces next
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
	// The reader first: its slot keeps the base under FullBlock and
	// FullFail while the handshake goes on (a base read from Stats could
	// be dropped by then).
	reader, err := l.NewReader(p, Oldest)
	if err != nil {
		ctrl.Close()
		return nil, err
	}
	seg := uint64(l.Config().SegmentSize)
	base := reader.Offset() // the oldest kept segment's start
	r := &Replica{l: l, p: p, cfg: cfg.withDefaults(), base: base, seg: seg, dev: dev, ctrl: ctrl, changed: make(chan struct{}),
		local: map[uint64]*leaderSeg{}, remote: map[uint64]ub.RemoteSegment{}, nextSeg: base / seg}
	r.acked, r.posted = r.base, r.base
	reader.onMap = r.hold
	offered := false
	fail := func(err error) (*Replica, error) {
		if offered {
			// The follower may have accepted: it must not wait for a
			// leader that is not there.
			tellEnd(ctrl, err)
		}
		ctrl.Close()
		reader.Close()
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
	if r.src, err = dev.AllocSegment(8, ub.SegmentConfig{}); err != nil {
		return fail(err)
	}
	if err := postRecvs(r.jetty, r.ackSeg, recvDepth); err != nil {
		return fail(err)
	}
	stop := handshakeDeadline(ctx, ctrl)
	_, err = ctrl.Write(appendOffer(nil, offer{partition: uint32(p), segSize: seg, base: r.base,
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
	if f := testReplicateAccepted.Load(); f != nil && err == nil {
		err = (*f)()
	}
	if err != nil {
		return fail(err)
	}
	if r.bell, err = dev.ImportSegment(a.bell, a.bellToken); err != nil {
		return fail(err)
	}
	if r.target, err = dev.ImportJetty(a.jetty, a.jtToken); err != nil {
		return fail(err)
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.lastPing, r.lastHeard = time.Now(), time.Now()
	r.wg.Go(func() { r.send(reader) })
	r.wg.Go(r.complete)
	r.wg.Go(r.monitor)
	r.wg.Go(func() { r.control(br) })
	return r, nil
}

// testReplicateAccepted, if set, is called by Replicate once the
// follower accepted: an error it returns fails Replicate there (tests
// play a leader that fails after the accept).
var testReplicateAccepted atomic.Pointer[func() error]

// control reads the control connection after the handshake: the
// follower's segments, or why it ended. The follower ending the
// connection ends replication, with its reason (ErrDiverged,
// shm.ErrCorrupt, ErrProtocol...) if it said one.
func (r *Replica) control(br *bufio.Reader) {
	for {
		typ, body, err := readFrame(br, maxControl, nil)
		switch {
		case err != nil:
			r.fault(fmt.Errorf("the follower closed the control connection: %w: %w", ErrReplicaDown, err))
			return
		case typ == frameError:
			r.fault(fmt.Errorf("the follower stopped: %w: %w", ErrReplicaDown, decodeError(body)))
			return
		case typ != frameSegment:
			r.fault(fmt.Errorf("the follower: %w: %w", ErrReplicaDown, protoErr("frame type %d on the control connection", typ)))
			return
		}
		if err := r.announced(body); err != nil {
			r.fault(fmt.Errorf("the follower's segment: %w: %w", ErrReplicaDown, err))
			return
		}
	}
}

// announced imports the follower segment a segment frame announces: the
// next index, of the partition's segment size, fewer than maxAnnounced
// segments beyond the one written into (the follower announces segments
// only ahead of what it has checked, which the leader wrote: a follower
// cannot make the leader import more).
func (r *Replica) announced(body []byte) error {
	sf, err := decodeSegment(body)
	if err != nil {
		return err
	}
	r.mu.Lock()
	want, bound := r.nextSeg, r.posted/r.seg+maxAnnounced
	r.mu.Unlock()
	if sf.index != want || sf.index >= bound || uint64(sf.seg.Size) != r.seg {
		return protoErr("segment %d of %d bytes announced; %d of %d bytes next, below %d", sf.index, sf.seg.Size, want, r.seg, bound)
	}
	imp, err := r.dev.ImportSegment(sf.seg, sf.token)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down != nil {
		imp.Close()
		return nil
	}
	r.remote[sf.index] = imp
	r.nextSeg++
	r.broadcast()
	return nil
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
	if !errors.Is(err, ErrReplicaDown) && !errors.Is(err, ErrClosed) {
		// Whatever ends it (the partition's reader, a broken
		// acknowledgement, a resource of this side), replication is down.
		err = fmt.Errorf("%w: %w", ErrReplicaDown, err)
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

// hold maps segment k of the partition for the replica and registers it
// as a Writes' source: the reader's hook (Reader.onMap), called when the
// reader enters k, so that the segment stays mapped until the follower
// has acknowledged past it, whatever the reader and retention do.
func (r *Replica) hold(k uint64) error {
	if r.local[k] != nil {
		return nil
	}
	m, err := r.l.mapSeg(r.p, k)
	if err != nil {
		return err
	}
	reg, err := r.dev.RegisterSegment(m.data, ub.SegmentConfig{})
	if err != nil {
		m.unmap()
		return fmt.Errorf("mq: registering segment %d of partition %d for replication: %w", k, r.p, err)
	}
	r.local[k] = &leaderSeg{m: m, reg: reg}
	return nil
}

// releaseBelow lets go of the segments, this side's and the follower's,
// below segment k: the follower has acknowledged past them (every Write
// into them has landed), or the replication is over. Called by the send
// goroutine, and by closeUB once it has ended.
func (r *Replica) releaseBelow(k uint64) {
	r.mu.Lock()
	var imps []ub.RemoteSegment
	for i, imp := range r.remote {
		if i < k {
			delete(r.remote, i)
			imps = append(imps, imp)
		}
	}
	r.mu.Unlock()
	for _, imp := range imps {
		imp.Close()
	}
	for i, ls := range r.local {
		if i < k {
			delete(r.local, i)
			ls.reg.Close()
			ls.m.unmap()
		}
	}
}

// send is the goroutine that reads the partition and writes its bytes
// into the follower's segments.
func (r *Replica) send(reader *Reader) {
	defer reader.Close()
	end := r.base    // the reader has passed every byte below: final records, aborted records, padding
	posted := r.base // what post has written up to (r.posted, which only post moves)
	for {
		var rec Record
		var got bool
		var err error
		if end > posted {
			// Post what the reader passed rather than wait (for the tail,
			// or for a record after it that is being written, held or
			// left by a dead producer): the follower, and Sends under
			// AckFollower, must not wait for a later record.
			post := end-posted >= sendBatch
			if !post {
				if ps, serr := r.l.Stats(r.p); serr != nil || ps.Tail <= reader.Offset() {
					post = true
				} else if rec, got, err = nextNow(reader); err == nil && !got {
					post = true
				}
				end = reader.Offset()
			}
			if post && err == nil {
				if err := r.post(end); err != nil {
					r.fault(err)
					return
				}
				posted = end
				r.releaseBelow(r.Acked() / r.seg)
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
		end = reader.Offset()
		r.records.Add(1)
		r.bytes.Add(uint64(len(rec.Payload)))
	}
}

// post writes the partition's bytes [r.posted, end) into the follower's
// segments, each from the leader's own, and rings the doorbell: at each
// segment the follower has not announced yet, it rings for what is
// written so far (the follower announces the next segments once it has
// checked the ones before) and waits for the announcement.
func (r *Replica) post(end uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var wrs []ub.WR
	for r.posted < end {
		if r.down != nil {
			return r.down
		}
		k := r.posted / r.seg
		dst := r.remote[k]
		if dst == nil {
			if len(wrs) > 0 {
				if err := r.ringLocked(wrs); err != nil {
					return err
				}
				wrs = nil
				continue
			}
			if err := r.waitLocked(); err != nil {
				return err
			}
			continue
		}
		src := r.local[k]
		if src == nil {
			// The reader passed bytes of k, so it mapped k (hold).
			return fmt.Errorf("mq: replica: segment %d not held", k)
		}
		hi := min(end, (k+1)*r.seg)
		for lo := r.posted; lo < hi; {
			n := min(hi-lo, r.chunk())
			wrs = append(wrs, ub.WR{Op: ub.OpWrite, UserCtx: lo + n, Target: r.target,
				Local:  ub.Local{Seg: src.reg, Offset: int(lo % r.seg), Len: int(n)},
				Remote: ub.Remote{Seg: dst, Offset: int(lo % r.seg)}})
			lo += n
		}
		r.posted = hi
	}
	if len(wrs) == 0 {
		return nil
	}
	return r.ringLocked(wrs)
}

// chunk is the most one Write carries: sendBatch, or a 64th of a segment
// if that is more, so that the Writes in flight (at most maxAnnounced
// segments' worth between the acknowledged offset and the one written
// up to) stay well within the completion queue's depth whatever the
// segment size.
func (r *Replica) chunk() uint64 { return max(sendBatch, r.seg/64) }

// waitLocked waits, with r.mu held (and let go meanwhile), for a change:
// an acknowledgement, an announcement, the end.
func (r *Replica) waitLocked() error {
	changed := r.changed
	r.mu.Unlock()
	select {
	case <-changed:
	case <-r.ctx.Done():
	}
	r.mu.Lock()
	if r.down != nil {
		return r.down
	}
	return r.ctx.Err()
}

// ringLocked posts wrs and a doorbell announcing r.posted, waiting for a
// free doorbell first; r.mu is held.
func (r *Replica) ringLocked(wrs []ub.WR) error {
	for len(r.bells) >= maxDoorbells {
		if err := r.waitLocked(); err != nil {
			return err
		}
	}
	wrs = append(wrs, ub.WR{Op: ub.OpWriteImm, UserCtx: userDoorbell, Target: r.target, Imm: r.posted,
		Local: ub.Local{Seg: r.src, Len: 8}, Remote: ub.Remote{Seg: r.bell}})
	if _, err := r.jetty.PostSend(wrs); err != nil {
		return fmt.Errorf("posting to the follower: %w: %w", ErrReplicaDown, err)
	}
	r.bells = append(r.bells, doorbell{end: r.posted, posted: time.Now()})
	r.stats.Doorbells++
	return nil
}

// pingLocked sends a heartbeat, which the follower answers at once, busy
// or not (its acknowledgements wait for its log): liveness apart from
// progress. r.mu is held.
func (r *Replica) pingLocked(now time.Time) error {
	_, err := r.jetty.PostSend([]ub.WR{{Op: ub.OpWriteImm, UserCtx: userPing, Target: r.target, Imm: pingImm,
		Local: ub.Local{Seg: r.src, Len: 8}, Remote: ub.Remote{Seg: r.bell}}})
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
		if len(r.bells) == 0 || r.bells[0].end != c.Imm {
			return protoErr("an acknowledgement of offset %d, no doorbell such", c.Imm)
		}
		r.acked = r.bells[0].end
		r.bells = r.bells[1:]
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
// close) and releases its ub objects and mappings.
func (r *Replica) Close() error {
	r.fault(fmt.Errorf("closed: %w", ErrClosed))
	r.ctrl.Close()
	r.wg.Wait()
	r.closeUB()
	return nil
}

func (r *Replica) closeUB() {
	if r.jetty != nil {
		r.jetty.Close() // no more Writes from or into the segments below
	}
	r.releaseBelow(^uint64(0))
	for _, c := range []interface{ Close() error }{r.cq, r.target, r.bell, r.src, r.ackSeg} {
		if c != nil {
			c.Close()
		}
	}
}
