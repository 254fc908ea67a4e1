package mq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// FollowerConfig configures a follower. The zero value is usable.
type FollowerConfig struct {
	// Partition is the partition of the follower's log that receives the
	// leader's (default 0). It must be empty when Follow starts, and
	// written by nobody else: its offsets are the leader's minus the
	// base (ReplicaStats.Base), so that a consumer can go from one to
	// the other.
	Partition int
	// RingSize is the bytes of the ring the leader writes into (default
	// the larger of 4 MiB and the log's segment size; at least the
	// segment size, so that every record fits).
	RingSize int
	// DeadAfter is how long the follower waits for a doorbell (the
	// leader rings heartbeats) before it reports ErrLeaderSilent
	// (default 1 s). It goes on waiting.
	DeadAfter time.Duration
	// OnFault, if set, is called with each fault, from the follower's
	// goroutine; it must not block.
	OnFault func(error)
}

// FollowerStats counts what a follower did.
type FollowerStats struct {
	// Base is the leader offset of this partition's offset 0.
	Base uint64
	// Next is the leader offset the follower expects next: it has every
	// record before it.
	Next uint64
	// Records and Bytes (payload) appended, Gaps the aborted filler
	// records written where the leader had aborted records or padding.
	Records, Bytes, Gaps uint64
	// Doorbells taken, Silences reported.
	Doorbells, Silences uint64
	// Down is the fault that ended the follower, or nil.
	Down error
}

// Follower receives a leader's partition into a local log.
type Follower struct {
	l    *Log
	p    int
	cfg  FollowerConfig
	base uint64
	seg  uint64 // the log's segment size
	keep uint64 // the leader's retention in bytes: no gap between two records is longer

	dev    ub.Context
	cq     ub.CQ
	jetty  ub.Jetty
	ring   ub.Segment
	scrap  ub.Segment // receive buffers and the acks' source
	ackSeg ub.RemoteSegment
	target ub.Target
	ctrl   net.Conn
	size   uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	consumed uint64 // ring position read up to
	t        uint64 // the partition's tail as this follower wrote it

	mu    sync.Mutex
	stats FollowerStats
}

// Follow answers the leader at the other end of ctrl (a Replicate call)
// and receives its partition into partition cfg.Partition of l, through
// dev, this node's ub context. Consumers read l with ordinary Readers.
// Close the Follower before l and dev.
func Follow(ctx context.Context, l *Log, dev ub.Context, ctrl net.Conn, cfg FollowerConfig) (*Follower, error) {
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = time.Second
	}
	if cfg.OnFault == nil {
		cfg.OnFault = func(error) {}
	}
	seg := uint64(l.Config().SegmentSize)
	if cfg.RingSize == 0 {
		cfg.RingSize = max(4<<20, int(seg))
	}
	f := &Follower{l: l, p: cfg.Partition, cfg: cfg, seg: seg, dev: dev, ctrl: ctrl, size: uint64(cfg.RingSize)}
	refuse := func(err error) (*Follower, error) {
		ctrl.SetWriteDeadline(time.Now().Add(time.Second))
		ctrl.Write(appendError(nil, err))
		f.closeUB()
		return nil, fmt.Errorf("mq: follow into %s partition %d: %w", l.Name(), cfg.Partition, err)
	}
	if uint64(cfg.RingSize) < seg || cfg.RingSize%8 != 0 || cfg.RingSize > 1<<32 {
		return refuse(fmt.Errorf("mq: a ring of %d bytes for segments of %d: want a multiple of 8, at least a segment, at most 4 GiB: %w", cfg.RingSize, seg, ErrTooLarge))
	}
	st, err := l.Stats(cfg.Partition)
	if err != nil {
		return nil, err
	}
	stop := handshakeDeadline(ctx, ctrl)
	defer stop()
	br := bufio.NewReader(ctrl)
	typ, body, err := readFrame(br, maxControl, nil)
	if err == nil && typ != frameOffer {
		err = protoErr("frame type %d for an offer", typ)
	}
	var o offer
	if err == nil {
		o, err = decodeOffer(body)
	}
	switch {
	case err != nil:
		return refuse(err)
	case o.segSize != seg:
		return refuse(fmt.Errorf("the leader's segments are %d bytes, this log's %d: %w", o.segSize, seg, ErrDiverged))
	case st.Tail != 0:
		return refuse(fmt.Errorf("partition %d is not empty (tail %d): %w", cfg.Partition, st.Tail, ErrDiverged))
	}
	f.base = o.base
	f.keep = uint64(o.segments) * seg
	f.stats.Base, f.stats.Next = o.base, o.base
	tokens := [2]ub.Token{randomToken(), randomToken()}
	if f.cq, err = dev.NewCQ(ub.CQConfig{Depth: 1024}); err != nil {
		return refuse(err)
	}
	if f.jetty, err = dev.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: f.cq, RecvCQ: f.cq, RecvDepth: recvDepth, Token: tokens[1]}); err != nil {
		return refuse(err)
	}
	if f.ring, err = dev.AllocSegment(ringData+cfg.RingSize, ub.SegmentConfig{Access: ub.AccessWrite, Token: tokens[0]}); err != nil {
		return refuse(err)
	}
	if f.scrap, err = dev.AllocSegment(64, ub.SegmentConfig{}); err != nil {
		return refuse(err)
	}
	if err := postRecvs(f.jetty, f.scrap, recvDepth); err != nil {
		return refuse(err)
	}
	if f.ackSeg, err = dev.ImportSegment(o.ackSeg, o.ackToken); err != nil {
		return refuse(err)
	}
	if f.target, err = dev.ImportJetty(o.jetty, o.jtToken); err != nil {
		return refuse(err)
	}
	if _, err := ctrl.Write(appendAccept(nil, accept{ring: f.ring.Desc(), ringToken: tokens[0], ringSize: f.size, jetty: f.jetty.Desc(), jtToken: tokens[1]})); err != nil {
		f.closeUB()
		return nil, fmt.Errorf("mq: follow: %w", closedErr(err))
	}
	if !stop() {
		f.closeUB()
		return nil, ctx.Err()
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Go(f.receive)
	f.wg.Go(func() {
		// The leader ending the control connection ends it, with its
		// reason if it said one.
		if said, _ := peerEnd(br); said != nil {
			f.fault(fmt.Errorf("the leader ended replication: %w", said))
			return
		}
		f.fault(fmt.Errorf("the leader closed the control connection: %w", ErrClosed))
	})
	return f, nil
}

func (f *Follower) fault(err error) {
	f.mu.Lock()
	if f.stats.Down != nil {
		f.mu.Unlock()
		return
	}
	f.stats.Down = err
	f.mu.Unlock()
	f.cancel()
	tellEnd(f.ctrl, err) // the leader learns why
	f.cfg.OnFault(err)
}

// receive is the goroutine that takes doorbells and heartbeats: it
// answers each heartbeat at once and hands the doorbells to work, so
// that a follower whose own log is slow (a full partition under
// FullBlock, a slow flush) is seen by the leader as behind, not dead.
func (f *Follower) receive() {
	cs := make([]ub.Completion, 64)
	// The leader has at most maxDoorbells unacknowledged: one more is a
	// protocol error, not a wait.
	bells := make(chan uint64, maxDoorbells)
	f.wg.Go(func() { f.work(bells) })
	defer close(bells)
	silent := false
	for {
		wctx, cancel := context.WithTimeout(f.ctx, f.cfg.DeadAfter)
		err := f.cq.Wait(wctx)
		cancel()
		if f.ctx.Err() != nil {
			return
		}
		if errors.Is(err, context.DeadlineExceeded) {
			if !silent {
				silent = true
				f.mu.Lock()
				f.stats.Silences++
				f.mu.Unlock()
				f.cfg.OnFault(fmt.Errorf("no doorbell for %v: %w", f.cfg.DeadAfter, ErrLeaderSilent))
			}
			continue
		}
		if err != nil {
			f.fault(err)
			return
		}
		n, err := f.cq.Poll(cs)
		if err != nil {
			f.fault(err)
			return
		}
		for _, c := range cs[:n] {
			if err := c.Err(); err != nil {
				f.fault(fmt.Errorf("%v with the leader: %w: %w", c.Op, ErrReplicaDown, err))
				return
			}
			if c.UserCtx&userRecv == 0 {
				continue // an acknowledgement or an answer went out
			}
			if _, err := f.jetty.PostRecv([]ub.RecvWR{{UserCtx: c.UserCtx, Buf: ub.Local{Seg: f.scrap, Offset: 8, Len: 8}}}); err != nil {
				f.fault(err)
				return
			}
			if !c.HasImm {
				f.fault(protoErr("a leader's message without an immediate"))
				return
			}
			silent = false
			f.mu.Lock()
			f.stats.Doorbells++
			f.mu.Unlock()
			if c.Imm == pingImm {
				if err := f.send(pingImm); err != nil {
					f.fault(err)
					return
				}
				continue
			}
			select {
			case bells <- c.Imm:
			default:
				f.fault(protoErr("more than %d doorbells unacknowledged", maxDoorbells))
				return
			}
		}
	}
}

// work is the goroutine that moves the ring's records into the log, a
// doorbell at a time, and acknowledges each.
func (f *Follower) work(bells <-chan uint64) {
	for t := range bells {
		if err := f.take(t); err != nil {
			f.fault(err)
			return
		}
		// One acknowledgement per doorbell, naming its tail.
		if err := f.send(t); err != nil {
			f.fault(err)
			return
		}
	}
}

// send writes imm into the leader's ack segment: an acknowledgement, or
// the answer to a heartbeat.
func (f *Follower) send(imm uint64) error {
	_, err := f.jetty.PostSend([]ub.WR{{Op: ub.OpWriteImm, Target: f.target, Imm: imm,
		Local: ub.Local{Seg: f.scrap, Len: 8}, Remote: ub.Remote{Seg: f.ackSeg}}})
	if err != nil {
		return fmt.Errorf("answering the leader: %w: %w", ErrReplicaDown, err)
	}
	return nil
}

// take moves the ring's entries up to tail into the log.
func (f *Follower) take(tail uint64) error {
	if tail < f.consumed || tail%8 != 0 || tail-f.consumed > f.size {
		return protoErr("a doorbell at ring position %d with %d consumed of a %d-byte ring", tail, f.consumed, f.size)
	}
	f.mu.Lock()
	next := f.stats.Next
	f.mu.Unlock()
	data := f.ring.Bytes()[ringData : ringData+f.size]
	for f.consumed < tail {
		pos := f.consumed
		phys := pos % f.size
		if f.size-phys < ringEntry {
			f.consumed += f.size - phys
			continue
		}
		// The leader may write the ring at any time: take the header
		// once, and check the payload's checksum on the copy.
		var hdr [ringEntry]byte
		copy(hdr[:], data[phys:])
		wrap, off, n, crc, entry, err := decodeRingEntry(hdr[:], pos, tail, f.size, next)
		if err != nil {
			return err
		}
		if wrap {
			f.consumed += entry
			continue
		}
		if off-f.base > 1<<62 || off < f.base {
			return protoErr("a record at leader offset %d below the base %d", off, f.base)
		}
		// Gaps (aborted records, padding) are filled with an aborted
		// record per segment. Two records the leader sent are at most
		// its retention apart (its reader read both): a leader cannot
		// make the follower fill more, however little the follower keeps.
		if gap := off - next; gap > f.keep {
			return protoErr("a gap of %d bytes before leader offset %d, more than the leader's %d-byte retention", gap, off, f.keep)
		}
		if err := f.append(off-f.base, data[phys+ringEntry:phys+ringEntry+uint64(n)], crc); err != nil {
			return err
		}
		next = off + align8(headerSize+uint64(n))
		f.consumed += entry
		f.mu.Lock()
		f.stats.Next = next
		f.stats.Records++
		f.stats.Bytes += uint64(n)
		f.mu.Unlock()
	}
	return nil
}

// append writes the record of payload src (checksum crc) at offset o of
// the partition, filling what lies between the tail and o (records the
// leader aborted, or padding) with aborted records of the same size, so
// that offsets stay the leader's.
func (f *Follower) append(o uint64, src []byte, crc uint32) error {
	size := f.seg
	for f.t < o {
		if err := f.ctx.Err(); err != nil {
			return err // a Loan that need not wait does not look
		}
		k, at := f.t/size, f.t%size
		segEnd := (k + 1) * size
		if size-at < headerSize {
			f.t = segEnd
			continue
		}
		end := min(o, segEnd)
		if end-f.t < headerSize {
			return protoErr("a gap of %d bytes before offset %d", end-f.t, o)
		}
		res, err := f.l.Loan(f.ctx, f.p, int(end-f.t-headerSize))
		if err != nil {
			return err
		}
		res.Abort()
		if res.Offset() != f.t {
			return fmt.Errorf("a filler went to %d, not %d: %w", res.Offset(), f.t, ErrDiverged)
		}
		f.t = end
		f.mu.Lock()
		f.stats.Gaps++
		f.mu.Unlock()
	}
	n := uint64(len(src))
	if f.t != o || o%size+align8(headerSize+n) > size {
		return protoErr("a %d-byte record at %d with the partition at %d", n, o, f.t)
	}
	res, err := f.l.Loan(f.ctx, f.p, len(src))
	if err != nil {
		return err
	}
	copy(res.Bytes(), src)
	if res.Offset() != o {
		res.Abort()
		return fmt.Errorf("a record went to %d, not %d: %w", res.Offset(), o, ErrDiverged)
	}
	if crc32.Checksum(res.Bytes(), castagnoli) != crc {
		res.Abort()
		return fmt.Errorf("the record at leader offset %d fails its checksum: %w", o+f.base, shm.ErrCorrupt)
	}
	if err := res.Commit(); err != nil {
		return err
	}
	f.t = o + align8(headerSize+n)
	return nil
}

// Stats returns the follower's counters.
func (f *Follower) Stats() FollowerStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Err is the fault that ended the follower, or nil while it runs.
func (f *Follower) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats.Down
}

// Close stops receiving and releases the follower's ub objects. The log
// keeps what was received.
func (f *Follower) Close() error {
	f.fault(fmt.Errorf("closed: %w", ErrClosed))
	f.ctrl.Close()
	f.wg.Wait()
	f.closeUB()
	return nil
}

func (f *Follower) closeUB() {
	for _, c := range []interface{ Close() error }{f.jetty, f.cq, f.target, f.ackSeg, f.ring, f.scrap} {
		if c != nil {
			c.Close()
		}
	}
}
