package mq

import (
	"errors"
	"testing"
	"time"
)

// TestReplicaRetryAfterFailedHandshake: a Replicate that fails after the
// follower rebased its partition (to a base beyond 0) leaves that
// partition empty, and a second replication into it is accepted (it was
// refused for good as "not empty").
func TestReplicaRetryAfterFailedHandshake(t *testing.T) {
	n0, n1, _ := simNodes(t)
	const seg = 8 << 10
	leader := newLog(t, Config{SegmentSize: seg, Segments: 3, Full: FullOverwrite})
	follower := newLog(t, Config{SegmentSize: seg})
	ctx := timeout(t, 10*time.Second)
	for range 100 {
		if _, err := leader.Send(ctx, 0, make([]byte, 500)); err != nil {
			t.Fatal(err)
		}
	}
	fail := func() error { return protoErr("the test fails the leader after the accept") }
	testReplicateAccepted.Store(&fail)
	r, rerr, f, _ := replicatePair(t, leader, n0, n1, follower, ReplicaConfig{}, FollowerConfig{})
	testReplicateAccepted.Store(nil)
	if r != nil || rerr == nil {
		t.Fatalf("the first Replicate: %v", rerr)
	}
	if f != nil {
		f.Close()
	}
	r2, rerr2, f2, ferr2 := replicatePair(t, leader, n0, n1, follower, ReplicaConfig{Ack: AckFollower}, FollowerConfig{})
	if r2 == nil || f2 == nil {
		t.Fatalf("the retry: Replicate %v; Follow %v", rerr2, ferr2)
	}
	off, err := r2.Send(ctx, []byte("after the retry"))
	if err != nil {
		t.Fatal(err)
	}
	rd := newReader(t, follower, 0, off)
	if rec, err := rd.Next(ctx); err != nil || string(rec.Payload) != "after the retry" {
		t.Fatalf("%q, %v", rec.Payload, err)
	}
}

// TestReplicaBaseHeld: producers go on while the handshake does, on a
// FullBlock leader with no reader of its own: the base the leader offers
// stays (its replication reader holds it from before the offer), where
// it used to be dropped before the reader was made (ErrOffsetGone).
func TestReplicaBaseHeld(t *testing.T) {
	n0, n1, _ := simNodes(t)
	const seg = 8 << 10
	leader := newLog(t, Config{SegmentSize: seg, Segments: 3})
	follower := newLog(t, Config{SegmentSize: seg, Segments: 64})
	ctx := timeout(t, 10*time.Second)
	roll := func() error {
		for range 30 { // more than the 3 segments, less than the follower keeps
			if _, err := leader.Send(ctx, 0, make([]byte, 500)); err != nil {
				return err
			}
		}
		return nil
	}
	testReplicateAccepted.Store(&roll)
	defer testReplicateAccepted.Store(nil)
	r, rerr, f, ferr := replicatePair(t, leader, n0, n1, follower, ReplicaConfig{}, FollowerConfig{})
	if r == nil || f == nil {
		t.Fatalf("Replicate %v; Follow %v", rerr, ferr)
	}
	st, _ := leader.Stats(0)
	if err := r.WaitAcked(ctx, st.Tail-8); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, leader, 0, follower, 0, r.Stats().Base, r.Acked())
}

// TestReplicaFollowerAge: a follower's age retention counts a segment's
// age from when its newest record arrived, as a producer's log does:
// the segment it registers ahead for the leader is born when the tail
// enters it, not when it is made, so a segment that took two hours to
// fill and whose newest record is fresh is kept (it was dropped).
func TestReplicaFollowerAge(t *testing.T) {
	n0, n1, _ := simNodes(t)
	const seg = 8 << 10
	now := time.Now()
	clock := func() time.Time { return now }
	leader := newLog(t, Config{SegmentSize: seg, Segments: 8, MaxAge: time.Hour})
	follower := newLog(t, Config{SegmentSize: seg, Segments: 8, MaxAge: time.Hour})
	leader.clock.Store(&clock)
	follower.clock.Store(&clock)
	r, _ := replicate(t, leader, 0, n0, n1, follower, ReplicaConfig{Ack: AckFollower, DeadAfter: time.Hour}, FollowerConfig{})
	ctx := timeout(t, 10*time.Second)
	if _, err := r.Send(ctx, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Hour)
	for range 20 { // the rest of segment 0, fresh, and into segment 1
		if _, err := r.Send(ctx, make([]byte, 500)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := leader.Expire(); err != nil {
		t.Fatal(err)
	}
	if _, err := follower.Expire(); err != nil {
		t.Fatal(err)
	}
	ls, _ := leader.Stats(0)
	fs, _ := follower.Stats(0)
	if fs.Oldest != ls.Oldest {
		t.Fatalf("the follower's age retention: its oldest %d, the leader's %d", fs.Oldest, ls.Oldest)
	}
}

// TestReplicaHostileFollower: a follower that announces a segment out of
// turn, of the wrong size or far beyond what the leader has written, or
// acknowledges an offset no doorbell rang, ends the replication with
// ErrReplicaDown wrapping ErrProtocol; the leader maps nothing more.
func TestReplicaHostileFollower(t *testing.T) {
	for _, c := range []struct {
		name string
		play func(f *Follower) error
	}{
		{"a segment out of turn", func(f *Follower) error {
			return f.writeFrame(appendSegment(nil, segmentFrame{index: 7, seg: f.bell.Desc(), token: 1}))
		}},
		{"a segment of the wrong size", func(f *Follower) error {
			f.mu.Lock()
			next := f.stats.Base/f.seg + 2
			f.mu.Unlock()
			return f.writeFrame(appendSegment(nil, segmentFrame{index: next, seg: f.bell.Desc(), token: 1}))
		}},
		{"segments far beyond what was written", func(f *Follower) error {
			var err error
			for i := uint64(2); i < 10 && err == nil; i++ {
				d := f.bell.Desc()
				d.Size = int(f.seg)
				err = f.writeFrame(appendSegment(nil, segmentFrame{index: f.stats.Base/f.seg + i, seg: d, token: 1}))
			}
			return err
		}},
		{"an acknowledgement of nothing", func(f *Follower) error { return f.send(12345 * 8) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n0, n1, _ := simNodes(t)
			leader := newLog(t, Config{SegmentSize: 8 << 10})
			follower := newLog(t, Config{SegmentSize: 8 << 10})
			fl := newFaults()
			r, f := replicate(t, leader, 0, n0, n1, follower, ReplicaConfig{Heartbeat: time.Hour, OnFault: fl.add}, FollowerConfig{})
			ctx := timeout(t, 10*time.Second)
			// Its first two segments announced, the follower turns.
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				r.mu.Lock()
				n := r.nextSeg
				r.mu.Unlock()
				if n == 2 {
					break
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					t.Fatal("the follower announced no segments")
				}
			}
			if err := c.play(f); err != nil {
				t.Fatal(err)
			}
			fl.wait(ctx, t, ErrProtocol)
			if err := r.Err(); !errors.Is(err, ErrReplicaDown) || !errors.Is(err, ErrProtocol) {
				t.Fatalf("leader: %v, want ErrReplicaDown and ErrProtocol", err)
			}
			r.mu.Lock()
			n := len(r.remote)
			r.mu.Unlock()
			if n > maxAnnounced {
				t.Fatalf("the leader imported %d segments, more than %d", n, maxAnnounced)
			}
		})
	}
}
