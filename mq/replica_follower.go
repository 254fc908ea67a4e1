package mq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/ub"
)

// FollowerConfig configures a follower. The zero value is usable.
type FollowerConfig struct {
	// Partition is the partition of the follower's log that receives the
	// leader's (default 0). It must be empty when Follow starts, and
	// written by nobody else: it starts at the leader's base
	// (ReplicaStats.Base), and its offsets are the leader's, so that a
	// consumer can go from one to the other.
	Partition int
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
	// Base is the offset the partition starts at, the leader's oldest
	// kept segment when replication started.
	Base uint64
	// Next is the offset the follower expects next, its partition's
	// tail: it has every record before it.
	Next uint64
	// Records and Bytes (payload) received, Gaps the aborted records and
	// padding received with them.
	Records, Bytes, Gaps uint64
	// Doorbells taken, Silences reported.
	Doorbells, Silences uint64
	// Down is the fault that ended the follower, or nil.
	Down error
}

// followerSeg is a segment of the follower's partition, held mapped and
// registered for the leader's writes.
type followerSeg struct {
	m   *mapped
	reg ub.Segment
}

// Follower receives a leader's partition into a local log.
type Follower struct {
	l   *Log
	p   int
	pt  *partition
	cfg FollowerConfig
	seg uint64 // the log's segment size

	dev    ub.Context
	cq     ub.CQ
	jetty  ub.Jetty
	bell   ub.Segment // the leader's doorbells and heartbeats land here
	scrap  ub.Segment // receive buffers and the acks' source
	ackSeg ub.RemoteSegment
	target ub.Target
	ctrl   net.Conn
	ctrlMu sync.Mutex // writes on ctrl

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// The work goroutine's (and Follow's before it, Close's after it).
	t       uint64                  // the partition's tail as this follower published it
	segs    map[uint64]*followerSeg // registered for the leader, by index
	nextSeg uint64                  // the index to announce next

	mu        sync.Mutex
	stats     FollowerStats
	closeOnce sync.Once
}

// Follow answers the leader at the other end of ctrl (a Replicate call)
// and receives its partition into partition cfg.Partition of l, through
// dev, this node's ub context: the leader writes the records into the
// partition's segments, which Follow registers with dev for it, and the
// follower checks them and publishes them. Consumers read l with
// ordinary Readers. Close the Follower before l and dev.
func Follow(ctx context.Context, l *Log, dev ub.Context, ctrl net.Conn, cfg FollowerConfig) (*Follower, error) {
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = time.Second
	}
	if cfg.OnFault == nil {
		cfg.OnFault = func(error) {}
	}
	seg := uint64(l.Config().SegmentSize)
	f := &Follower{l: l, p: cfg.Partition, cfg: cfg, seg: seg, dev: dev, ctrl: ctrl, segs: map[uint64]*followerSeg{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	refuse := func(err error) (*Follower, error) {
		f.cancel()
		tellEnd(ctrl, err)
		f.closeUB()
		return nil, fmt.Errorf("mq: follow into %s partition %d: %w", l.Name(), cfg.Partition, err)
	}
	pt, err := l.part(cfg.Partition)
	if err != nil {
		return refuse(err)
	}
	f.pt = pt
	st, err := l.Stats(cfg.Partition)
	if err != nil {
		return refuse(err)
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
	case st.Tail != st.Oldest:
		// (Empty is a tail at the head: a follower that failed before
		// left its partition rebased, and nothing in it.)
		return refuse(fmt.Errorf("partition %d is not empty (%d to %d): %w", cfg.Partition, st.Oldest, st.Tail, ErrDiverged))
	}
	if err := l.rebase(cfg.Partition, o.base); err != nil {
		return refuse(err)
	}
	f.t, f.nextSeg = o.base, o.base/seg
	f.stats.Base, f.stats.Next = o.base, o.base
	tokens := [2]ub.Token{randomToken(), randomToken()}
	if f.cq, err = dev.NewCQ(ub.CQConfig{Depth: 1024}); err != nil {
		return refuse(err)
	}
	if f.jetty, err = dev.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: f.cq, RecvCQ: f.cq, RecvDepth: recvDepth, Token: tokens[1]}); err != nil {
		return refuse(err)
	}
	if f.bell, err = dev.AllocSegment(bellSegSize, ub.SegmentConfig{Access: ub.AccessWrite, Token: tokens[0]}); err != nil {
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
	if _, err := ctrl.Write(appendAccept(nil, accept{bell: f.bell.Desc(), bellToken: tokens[0], jetty: f.jetty.Desc(), jtToken: tokens[1]})); err != nil {
		f.cancel()
		ctrl.Close()
		f.closeUB()
		return nil, fmt.Errorf("mq: follow: %w", closedErr(err))
	}
	if !stop() {
		return refuse(ctx.Err())
	}
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

// errCtrlWrite marks a failed write on the control connection.
var errCtrlWrite = errors.New("mq: control connection")

// announce registers the partition's segments for the leader's writes,
// up to aheadSegments from the one the tail is in, and tells the leader.
// The one the tail is in is made as a producer entering it would (the
// log's retention may drop the oldest segment for it, or wait); one
// beyond it only while the partition has room for it without dropping
// any (otherwise later, when the tail gets there): what the follower
// keeps is what a producer's log keeps.
func (f *Follower) announce() error {
	ahead := uint64(aheadSegments)
	if f.l.cfg.Dir != "" {
		// A log in files finds its tail in its newest segment file when
		// it is opened again: none is made ahead of the tail.
		ahead = 1
	}
	for f.nextSeg < f.t/f.seg+ahead {
		k := f.nextSeg
		if k > f.t/f.seg && k >= f.pt.head.Load()+uint64(f.l.cfg.Segments) {
			return nil
		}
		if err := f.l.ensureRoom(f.ctx, f.p, f.pt, k); err != nil {
			return err
		}
		m, err := f.l.segment(f.p, f.pt, k, true)
		if err != nil {
			return err
		}
		if k > f.t/f.seg {
			// Born when the tail enters it (take), as a segment a producer
			// makes ahead: age retention reads its birth as the time the
			// segment before it got its newest record.
			f.l.setBirthAt(m, 0)
		}
		token := randomToken()
		reg, err := f.dev.RegisterSegment(m.data, ub.SegmentConfig{Access: ub.AccessWrite, Token: token})
		if err != nil {
			m.release()
			return fmt.Errorf("mq: registering segment %d for the leader: %w", k, err)
		}
		f.segs[k] = &followerSeg{m: m, reg: reg}
		f.nextSeg++
		if err := f.writeFrame(appendSegment(nil, segmentFrame{index: k, seg: reg.Desc(), token: token})); err != nil {
			return fmt.Errorf("mq: announcing segment %d to the leader: %w: %w", k, errCtrlWrite, closedErr(err))
		}
	}
	return nil
}

// writeFrame writes frame b on the control connection.
func (f *Follower) writeFrame(b []byte) error {
	f.ctrlMu.Lock()
	defer f.ctrlMu.Unlock()
	f.ctrl.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := f.ctrl.Write(b)
	f.ctrl.SetWriteDeadline(time.Time{})
	return err
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
	f.ctrl.SetWriteDeadline(time.Now().Add(time.Second)) // an announcement stuck in a write gives way
	f.ctrlMu.Lock()
	tellEnd(f.ctrl, err) // the leader learns why
	f.ctrlMu.Unlock()
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

// work is the goroutine that checks and publishes what the leader wrote,
// a doorbell at a time, and acknowledges each.
func (f *Follower) work(bells <-chan uint64) {
	fail := func(err error) {
		if errors.Is(err, errCtrlWrite) {
			// The leader hung up: the goroutine reading the control
			// connection says why.
			<-f.ctx.Done()
			return
		}
		f.fault(err)
	}
	// The first segments: the leader writes nothing before them.
	if err := f.announce(); err != nil {
		fail(err)
		return
	}
	for end := range bells {
		if err := f.take(end); err != nil {
			fail(err)
			return
		}
		// One acknowledgement per doorbell, naming its offset.
		if err := f.send(end); err != nil {
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

// take checks the records the leader wrote between the tail and end (a
// doorbell's offset), as a reader would (their states, lengths, offsets
// and checksums: what Next checks), publishes them by moving the tail
// there, lets go of the segments it has checked to their end (the
// leader can no longer write what readers read in them) and announces
// the next ones.
func (f *Follower) take(end uint64) error {
	if end < f.t || end%8 != 0 || end > f.nextSeg*f.seg {
		return protoErr("a doorbell at offset %d with the tail at %d and segments announced below %d", end, f.t, f.nextSeg*f.seg)
	}
	var records, bytes, gaps uint64
	for o := f.t; o < end; {
		k, at := o/f.seg, o%f.seg
		if f.seg-at < headerSize {
			o = (k + 1) * f.seg
			continue
		}
		fs := f.segs[k]
		if fs == nil {
			return protoErr("a record at %d, in segment %d not announced", o, k)
		}
		// The leader may still write there: each header word is read once.
		w, w1 := fs.m.words[at/8].Load(), fs.m.words[at/8+1].Load()
		payload, next, err := decode(fs.m.data, at, w, w1, o)
		if err != nil {
			return fmt.Errorf("mq: the leader's record at %d: %w", o, err)
		}
		switch w & stateMask {
		case stateCommitted:
			if payload != nil {
				records++
				bytes += uint64(len(payload))
			} else {
				gaps++ // padding
			}
		case stateAborted:
			gaps++
		default:
			return protoErr("a record at %d that is not final (header %#x)", o, w)
		}
		if o+next > end {
			return protoErr("a record at %d of %d bytes beyond the doorbell's %d", o, next, end)
		}
		if f.l.cfg.Flush == FlushEverySend {
			if err := f.l.flushRecord(f.pt, fs.m, at, at+next); err != nil {
				return err
			}
		}
		o += next
	}
	if !f.pt.tail.CompareAndSwap(f.t, end) {
		return fmt.Errorf("the partition's tail moved from %d without the leader: %w", f.t, ErrDiverged)
	}
	entered := end/f.seg > f.t/f.seg
	f.t = end
	f.pt.wakeReaders()
	if fs := f.segs[end/f.seg]; entered && fs != nil {
		f.l.bornNow(fs.m)
	}
	f.mu.Lock()
	f.stats.Next = end
	f.stats.Records += records
	f.stats.Bytes += bytes
	f.stats.Gaps += gaps
	f.mu.Unlock()
	for k, fs := range f.segs {
		if k < end/f.seg {
			delete(f.segs, k)
			fs.reg.Close()
			fs.m.release()
		}
	}
	return f.announce()
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
// keeps what was received and checked.
func (f *Follower) Close() error {
	f.closeOnce.Do(func() {
		f.fault(fmt.Errorf("closed: %w", ErrClosed))
		f.ctrl.Close()
		f.wg.Wait()
		f.closeUB()
	})
	return nil
}

// closeUB releases the ub objects and the segments held for the leader.
// Once they are deregistered, what the leader wrote beyond the tail
// (never checked, never published) is cleared, so that nothing takes it
// for records later.
func (f *Follower) closeUB() {
	if f.jetty != nil {
		f.jetty.Close()
	}
	// Unless someone else published beyond it (ErrDiverged): then what
	// is there is theirs.
	ours := f.pt != nil && f.pt.tail.Load() == f.t
	for k, fs := range f.segs {
		delete(f.segs, k)
		fs.reg.Close()
		if lo := f.t; ours && k >= lo/f.seg {
			from := uint64(0)
			if k == lo/f.seg {
				from = lo % f.seg
			}
			clear(fs.m.data[from:])
		}
		fs.m.release()
	}
	for _, c := range []interface{ Close() error }{f.cq, f.target, f.ackSeg, f.bell, f.scrap} {
		if c != nil {
			c.Close()
		}
	}
}
