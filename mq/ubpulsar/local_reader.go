package ubpulsar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/shm"
)

// createLocalReader is CreateReader for a local topic: an mq.Reader per
// partition of the topic's log, as the upstream reader of a partitioned
// topic reads every partition.
func (c *client) createLocalReader(opts pulsar.ReaderOptions) (pulsar.Reader, error) {
	switch {
	case opts.StartMessageID == nil:
		return nil, errors.New("ubpulsar: a reader needs a StartMessageID")
	case opts.Schema != nil:
		return nil, fmt.Errorf("ubpulsar: a schema: %w", ErrLocalUnsupported)
	case opts.Decryption != nil:
		return nil, fmt.Errorf("ubpulsar: decryption (local messages are never encrypted): %w", ErrLocalUnsupported)
	case opts.ReadCompacted:
		return nil, fmt.Errorf("ubpulsar: ReadCompacted (local topics are not compacted): %w", ErrLocalUnsupported)
	case opts.MessageChannel != nil:
		return nil, fmt.Errorf("ubpulsar: a reader's MessageChannel (call Next): %w", ErrLocalUnsupported)
	}
	start, err := startOf(opts.StartMessageID, opts.StartMessageIDInclusive)
	if err != nil {
		return nil, err
	}
	l, err := c.localLog(opts.Topic, false)
	if err != nil {
		return nil, err
	}
	np := l.Config().Partitions
	if start.id != nil && np > 1 {
		return nil, fmt.Errorf("ubpulsar: a StartMessageID on partitioned local topic %s (start at Earliest or Latest): %w", fullTopic(opts.Topic), ErrLocalUnsupported)
	}
	r := &localReader{c: c, l: l, topic: fullTopic(opts.Topic), inclusive: opts.StartMessageIDInclusive, logger: c.o.Logger,
		parts: make([]*mq.Reader, np), pending: make([]*localMessage, np)}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	// Registered before its positions are made, and positioned under
	// r.mu: the client's Close closes it (waiting for r.mu) before it
	// closes the log, and a reader Close reached fails here.
	r.mu.Lock()
	c.logsMu.Lock()
	if c.logsClosed {
		c.logsMu.Unlock()
		r.mu.Unlock()
		return nil, fmt.Errorf("ubpulsar: client closed: %w", mq.ErrClosed)
	}
	if c.readers == nil {
		c.readers = map[*localReader]struct{}{}
	}
	c.readers[r] = struct{}{}
	c.logsMu.Unlock()
	for p := range np {
		if r.parts[p], err = r.position(p, start, nil); err != nil {
			break
		}
	}
	if r.ctx.Err() != nil { // the client's Close came
		err = fmt.Errorf("ubpulsar: client closed: %w", mq.ErrClosed)
	}
	r.mu.Unlock()
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// startPosition is where a reader starts or seeks to: the oldest
// record, the next one sent (latest), or a record of a local topic.
type startPosition struct {
	latest    bool
	id        *localID
	inclusive bool // the record named (latest: the last record) is read first
}

// startOf is the position of a StartMessageID or a Seek's id.
func startOf(id pulsar.MessageID, inclusive bool) (startPosition, error) {
	if l, ok := localIDOf(id); ok {
		return startPosition{id: l, inclusive: inclusive}, nil
	}
	switch {
	case id.LedgerID() == -1 && id.EntryID() == -1 && id.PartitionIdx() == -1:
		return startPosition{}, nil
	case id.LedgerID() == math.MaxInt64 && id.EntryID() == math.MaxInt64:
		return startPosition{latest: true, inclusive: inclusive}, nil
	}
	return startPosition{}, fmt.Errorf("ubpulsar: message id %v is not a local topic's (a local topic's ids come from its producers, consumers and readers)", id)
}

// localReader is a pulsar.Reader of a local topic. It reads each
// partition of the log with its own mq.Reader and takes no part in any
// consumer group.
type localReader struct {
	c         *client
	l         *mq.Log
	topic     string
	inclusive bool
	logger    *slog.Logger
	ctx       context.Context // ended by Close
	cancel    context.CancelFunc

	// mu serialises the methods: an mq.Reader is for one goroutine at a
	// time.
	mu      sync.Mutex
	parts   []*mq.Reader
	pending []*localMessage // read ahead, by HasNext or a Next that waited on every partition
	rr      int             // the partition Next looks at first
	closed  bool
}

var errReaderClosed = fmt.Errorf("ubpulsar: reader closed: %w", mq.ErrClosed)

func (r *localReader) Topic() string { return r.topic }

// position returns a reader of partition p at start: reuse moved there,
// if it is given (it is left somewhere on an error: the caller puts it
// back), else a new one.
func (r *localReader) position(p int, start startPosition, reuse *mq.Reader) (*mq.Reader, error) {
	switch {
	case start.id == nil && !start.latest:
		return r.at(p, mq.Oldest, reuse)
	case start.latest && !start.inclusive:
		return r.at(p, mq.Newest, reuse)
	case start.latest:
		last, ok, err := r.last(p)
		if err != nil {
			return nil, err
		}
		if !ok {
			return r.at(p, mq.Newest, reuse)
		}
		mr, err := r.at(p, last, reuse)
		if errors.Is(err, mq.ErrOffsetGone) {
			// Dropped since it was found: what is kept is after it.
			return r.at(p, mq.Oldest, reuse)
		}
		return mr, err
	}
	id := start.id
	if int(id.partition) != p {
		return nil, fmt.Errorf("ubpulsar: message id %v names partition %d of local topic %s, which has %d", id, id.partition, r.topic, len(r.parts))
	}
	st, err := r.stats(p)
	if err != nil {
		return nil, err
	}
	if id.offset >= st.Tail {
		return nil, fmt.Errorf("ubpulsar: message id %v is beyond the last message of local topic %s (an id of another topic?)", id, r.topic)
	}
	mr, err := r.at(p, id.offset, reuse)
	if errors.Is(err, mq.ErrOffsetGone) {
		// As the broker: a position retention dropped is the oldest
		// message kept.
		return r.at(p, mq.Oldest, reuse)
	}
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: reader of %s at %v: %w", r.topic, id, err)
	}
	if !start.inclusive {
		// Past the record id names (committed, as it was read or sent).
		_, ok, err := mr.NextBelow(r.ctx, id.offset+1)
		if err == nil && !ok && mr.Offset() == id.offset {
			err = errors.New("it names a message not yet sent")
		}
		if err != nil {
			if mr != reuse {
				mr.Close()
			}
			return nil, fmt.Errorf("ubpulsar: reader of %s after %v: %w", r.topic, id, err)
		}
	}
	return mr, nil
}

// at returns reuse moved to log offset from, if reuse is given, else a
// new reader of partition p there. Errors wrap mq's (ErrOffsetGone).
func (r *localReader) at(p int, from uint64, reuse *mq.Reader) (*mq.Reader, error) {
	if reuse != nil {
		if err := reuse.Seek(from); err != nil {
			return nil, fmt.Errorf("ubpulsar: reader of %s: %w", r.topic, err)
		}
		return reuse, nil
	}
	mr, err := r.l.NewReader(p, from)
	if err != nil {
		return nil, fmt.Errorf("ubpulsar: reader of %s: %w", r.topic, err)
	}
	return mr, nil
}

// scan calls f with a scanner of partition p at from (mq.NewScanner):
// it takes no reader slot, so it works when every slot is taken, and it
// holds nothing back, so the reader's own place stays held throughout.
func (r *localReader) scan(p int, from uint64, f func(*mq.Reader) error) error {
	sc, err := r.l.NewScanner(p, from)
	if err != nil {
		return err
	}
	defer sc.Close()
	return f(sc)
}

// stats is partition p's Stats, checked: a meta segment (corrupt or
// hostile) whose tail is below its oldest offset is an error wrapping
// shm.ErrCorrupt, not a scan of 2^52 segments.
func (r *localReader) stats(p int) (mq.Stats, error) {
	st, err := r.l.Stats(p)
	if err != nil {
		return st, fmt.Errorf("ubpulsar: local topic %s partition %d: %w", r.topic, p, err)
	}
	if st.Tail < st.Oldest {
		return st, fmt.Errorf("ubpulsar: local topic %s partition %d: tail %d below the oldest offset %d: %w", r.topic, p, st.Tail, st.Oldest, shm.ErrCorrupt)
	}
	return st, nil
}

// last is the offset of partition p's last committed record, if it has
// one: the records of the tail's segment (or, if it has none, of the
// segments before it) read up to the tail by a scanner.
func (r *localReader) last(p int) (uint64, bool, error) {
	st, err := r.stats(p)
	if err != nil || st.Tail == st.Oldest {
		return 0, false, err
	}
	size := uint64(r.l.Config().SegmentSize)
	for k := (st.Tail - 1) / size; k >= st.Oldest/size; k-- {
		var last uint64
		found := false
		err := r.scan(p, k*size, func(sc *mq.Reader) error {
			for {
				rec, ok, err := sc.NextBelow(r.ctx, st.Tail)
				if err != nil || !ok {
					return err
				}
				last, found = rec.Offset, true
			}
		})
		if errors.Is(err, mq.ErrOffsetGone) {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("ubpulsar: last message of %s: %w", r.topic, err)
		}
		if found || k == 0 {
			return last, found, nil
		}
	}
	return 0, false, nil
}

// message is the local message of record rec of partition p, or nil
// (logged) if the record does not decode: a hostile writer's.
func (r *localReader) message(p int, rec mq.Record) *localMessage {
	lr, err := decodeDelivered(rec.Payload)
	if err != nil {
		r.logger.Error("ubpulsar: a record of a local topic does not decode; skipped", "topic", r.topic,
			"partition", p, "offset", rec.Offset, "err", err)
		return nil
	}
	return &localMessage{topic: r.topic, rec: lr, attempt: 1, id: &localID{partition: int32(p), offset: rec.Offset}}
}

// poll returns partition p's next message if one is committed below the
// tail, without waiting for the tail to move.
func (r *localReader) poll(ctx context.Context, p int) (*localMessage, error) {
	if m := r.pending[p]; m != nil {
		return m, nil
	}
	for {
		st, err := r.stats(p)
		if err != nil {
			return nil, err
		}
		rec, ok, err := r.parts[p].NextBelow(ctx, st.Tail)
		if err != nil || !ok {
			return nil, err
		}
		if m := r.message(p, rec); m != nil {
			r.pending[p] = m
			return m, nil
		}
	}
}

// take returns the message read ahead of the first partition from rr
// that has one.
func (r *localReader) take() *localMessage {
	for i := range r.pending {
		p := (r.rr + i) % len(r.pending)
		if m := r.pending[p]; m != nil {
			r.pending[p] = nil
			r.rr = p + 1
			return m
		}
	}
	return nil
}

// Next returns the next message, waiting for one until ctx ends or the
// reader closes. Each partition's messages come in order; across
// partitions, round robin among those with a message.
func (r *localReader) Next(ctx context.Context) (pulsar.Message, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errReaderClosed
	}
	ctx, stop := mergeDone(ctx, r.ctx)
	defer stop()
	for {
		for i := range r.parts {
			if _, err := r.poll(ctx, (r.rr+i)%len(r.parts)); err != nil {
				return nil, r.readErr(ctx, err)
			}
			if m := r.take(); m != nil {
				return m, nil
			}
		}
		if err := r.waitAny(ctx); err != nil {
			return nil, r.readErr(ctx, err)
		}
	}
}

// readErr is err of a read under ctx: the reader's close, ctx's end, or
// the log's error.
func (r *localReader) readErr(ctx context.Context, err error) error {
	switch {
	case r.ctx.Err() != nil:
		return errReaderClosed
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("ubpulsar: read %s: %w", r.topic, err)
}

// waitAny waits on every partition at once until one has a message
// (others may have one too: all are kept in pending), one fails, or ctx
// ends.
func (r *localReader) waitAny(ctx context.Context) error {
	if len(r.parts) == 1 {
		for {
			rec, err := r.parts[0].Next(ctx)
			if err != nil {
				return err
			}
			if r.pending[0] = r.message(0, rec); r.pending[0] != nil {
				return nil
			}
		}
	}
	wait, found := context.WithCancel(ctx)
	defer found()
	errs := make([]error, len(r.parts))
	var wg sync.WaitGroup
	for p, mr := range r.parts {
		wg.Go(func() {
			for {
				rec, err := mr.Next(wait)
				if err != nil {
					errs[p] = err
					found() // a partition's error ends the wait too
					return
				}
				if r.pending[p] = r.message(p, rec); r.pending[p] != nil {
					found()
					return
				}
			}
		})
	}
	wg.Wait()
	for _, m := range r.pending {
		if m != nil {
			return nil
		}
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.Join(errs...)
}

// HasNext reports whether a message is committed beyond the reader's
// position (read ahead, for Next to return). It is false after Close
// and on errors, as upstream's.
func (r *localReader) HasNext() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for p := range r.parts {
		m, err := r.poll(r.ctx, p)
		if err != nil {
			r.logger.Error("ubpulsar: local reader HasNext", "topic", r.topic, "partition", p, "err", err)
			return false
		}
		if m != nil {
			return true
		}
	}
	return false
}

// Seek moves the reader of a one-partition topic to msgID, a message id
// of this topic, read first if StartMessageIDInclusive. As upstream's,
// it refuses a partitioned topic and ids without a partition (Earliest,
// Latest).
func (r *localReader) Seek(msgID pulsar.MessageID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return fmt.Errorf("ubpulsar: seek: %w", errReaderClosed)
	case msgID == nil:
		return errors.New("ubpulsar: seek to a nil message id")
	case msgID.PartitionIdx() < 0:
		return errors.New("ubpulsar: seek msgId must include partitionIndex")
	case len(r.parts) > 1:
		return errors.New("ubpulsar: for partition topic, seek command should perform on the individual partitions")
	}
	start, err := startOf(msgID, r.inclusive)
	if err != nil {
		return err
	}
	// In the reader's own slot: a second one may not be free.
	own := r.parts[0]
	back := own.Offset()
	if _, err := r.position(0, start, own); err != nil {
		if own.Offset() == back {
			return err // it did not move
		}
		if perr := own.Seek(back); perr != nil {
			r.logger.Warn("ubpulsar: a local reader whose seek failed could not go back to its place; it reads on from the oldest message", "topic", r.topic, "offset", back, "err", perr)
			r.pending[0] = nil
			own.Seek(mq.Oldest)
		}
		return err
	}
	r.pending[0] = nil
	return nil
}

// SeekByTime moves every partition's reader to its first message
// published at or after t (to the millisecond, as the broker compares),
// or to its tail if none is. It reads every retained record's header
// to find it: a scan, not the broker's binary search.
func (r *localReader) SeekByTime(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("ubpulsar: seek: %w", errReaderClosed)
	}
	ms := t.UnixMilli()
	fail := func(err error) error {
		return fmt.Errorf("ubpulsar: seek %s by time: %w", r.topic, err)
	}
	// Where each partition's reader goes, found by a scan (see scan),
	// then the moves, undone if one fails.
	to := make([]uint64, len(r.parts))
	for p := range r.parts {
		st, err := r.stats(p)
		if err != nil {
			return fail(err)
		}
		err = r.scan(p, mq.Oldest, func(scan *mq.Reader) error {
			for {
				rec, ok, err := scan.NextBelow(r.ctx, st.Tail)
				if err != nil {
					return err
				}
				if !ok { // none: the scan stopped at the tail
					to[p] = scan.Offset()
					return nil
				}
				lr, err := decodeDelivered(rec.Payload)
				if err == nil && lr.publishTime/int64(time.Millisecond) >= ms {
					to[p] = rec.Offset
					return nil
				}
			}
		})
		if err != nil {
			return fail(err)
		}
	}
	back := make([]uint64, len(r.parts))
	for p, mr := range r.parts {
		back[p] = mr.Offset()
		err := mr.Seek(to[p])
		if errors.Is(err, mq.ErrOffsetGone) {
			// Dropped since the scan: what is kept is after it.
			err = mr.Seek(mq.Oldest)
		}
		if err != nil {
			for q := range p {
				if err := r.parts[q].Seek(back[q]); err != nil {
					r.logger.Warn("ubpulsar: a local reader whose seek by time failed could not go back to its place; it reads on from the oldest message", "topic", r.topic, "partition", q, "offset", back[q], "err", err)
					r.pending[q] = nil
					r.parts[q].Seek(mq.Oldest)
				}
			}
			return fail(err)
		}
	}
	for p := range r.parts {
		r.pending[p] = nil
	}
	return nil
}

// GetLastMessageID is the id of the last message of a one-partition
// topic; EarliestMessageID if it has none. As upstream's, it refuses a
// partitioned topic.
func (r *localReader) GetLastMessageID() (pulsar.MessageID, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, fmt.Errorf("ubpulsar: last message id: %w", errReaderClosed)
	case len(r.parts) > 1:
		return nil, errors.New("ubpulsar: GetLastMessageID is not supported for multi-topics reader")
	}
	if _, err := r.stats(0); err != nil {
		return nil, err
	}
	off, ok, err := r.last(0)
	if err != nil {
		return nil, err
	}
	if !ok {
		return pulsar.EarliestMessageID(), nil
	}
	return &localID{partition: 0, offset: off}, nil
}

// Close closes the partitions' readers (a blocked Next returns an
// error); later calls do nothing, and the other methods fail.
func (r *localReader) Close() {
	r.cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	for _, mr := range r.parts {
		if mr != nil {
			mr.Close()
		}
	}
	r.c.logsMu.Lock()
	delete(r.c.readers, r)
	r.c.logsMu.Unlock()
}

var _ pulsar.Reader = (*localReader)(nil)
