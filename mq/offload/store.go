package offload

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"sync/atomic"

	"github.com/ubkit-io/ubkit/mq"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// StoreConfig is the shape of a store's log. The zero value is one
// partition of 8 segments of 64 MiB (512 MiB of payloads kept).
type StoreConfig struct {
	// Partitions, SegmentSize and Segments are the mq.Config fields of
	// the log (defaults 1, 64 MiB, 8). A payload may be up to
	// SegmentSize-16 bytes.
	Partitions, SegmentSize, Segments int
	// Fetch is the transport address of the Server that serves this log
	// to other hosts (written into every reference), or empty.
	Fetch string
}

// Store puts payloads into an mq.Log made for them: retention by size
// (mq.FullOverwrite), so a producer never blocks on consumers, and a
// reference outlives its payload once Segments*SegmentSize bytes were
// put after it; dropped segments are reused (mq.Config.Recycle). Many
// processes may share one store's log; a Store is safe for concurrent
// use.
type Store struct {
	log   *mq.Log
	fetch string
	next  atomic.Uint64
}

// OpenStore opens the store log name, creating it with c if it does not
// exist. An existing log must drop old records (mq.FullOverwrite): a log
// that blocks would let slow consumers stop producers.
func OpenStore(name string, c StoreConfig) (*Store, error) {
	if !validName(name) {
		return nil, fmt.Errorf("offload: store name %q: want 1-255 of [A-Za-z0-9._-]", name)
	}
	if c.SegmentSize == 0 {
		c.SegmentSize = 64 << 20
	}
	if c.Fetch != "" {
		if err := (Ref{Log: name, Length: 1, Fetch: c.Fetch}).check(); err != nil {
			return nil, err
		}
	}
	// Recycle: a store rolls a segment every SegmentSize bytes of
	// payloads, and fresh pages for each were most of what a 1 MiB Put
	// cost (docs/PERFORMANCE.md). Nobody can see a reused segment's
	// bytes change: a segment mapped anywhere (a View, a read under
	// way) is not reused.
	l, err := mq.Create(name, mq.Config{Partitions: c.Partitions, SegmentSize: c.SegmentSize, Segments: c.Segments, Full: mq.FullOverwrite, Recycle: true})
	if errors.Is(err, os.ErrExist) {
		l, err = mq.Open(name)
	}
	if err != nil {
		return nil, fmt.Errorf("offload: store %s: %w", name, err)
	}
	if l.Config().Full != mq.FullOverwrite {
		l.Close()
		return nil, fmt.Errorf("offload: store %s: an existing log that does not drop old records (want mq.FullOverwrite)", name)
	}
	return &Store{log: l, fetch: c.Fetch}, nil
}

// Log is the store's log.
func (s *Store) Log() *mq.Log { return s.log }

// MaxPayload is the largest payload Put takes.
func (s *Store) MaxPayload() int { return s.log.Config().SegmentSize - 16 }

// Loan is space for one payload in the store, filled in place: write
// Bytes, then Commit (which returns its reference) or Abort.
type Loan struct {
	s   *Store
	p   int
	res mq.Reservation
}

// Bytes is the payload's space in shared memory.
func (l *Loan) Bytes() []byte { return l.res.Bytes() }

// Commit publishes the payload and returns its reference.
func (l *Loan) Commit() (Ref, error) {
	// The reference carries the checksum the record's header gets: one
	// sum of the payload, not two.
	n, off := len(l.res.Bytes()), l.res.Offset()
	crc, err := l.res.CommitSum()
	if err != nil {
		return Ref{}, fmt.Errorf("offload: %w", err)
	}
	return l.ref(off, n, crc), nil
}

// ref is the reference to l's payload, committed at off with n bytes.
func (l *Loan) ref(off uint64, n int, crc uint32) Ref {
	return Ref{Log: l.s.log.Name(), Partition: l.p, Offset: off, Length: uint32(n), CRC: crc, Fetch: l.s.fetch}
}

// Abort gives the space up.
func (l *Loan) Abort() { l.res.Abort() }

// Loan reserves n bytes (1 to MaxPayload) in the next partition, round
// robin.
func (s *Store) Loan(ctx context.Context, n int) (*Loan, error) {
	if n <= 0 || n > s.MaxPayload() {
		return nil, fmt.Errorf("offload: a %d-byte payload in a store of %d-byte payloads: %w", n, s.MaxPayload(), ErrTooLarge)
	}
	p := int(s.next.Add(1) % uint64(s.log.Config().Partitions))
	res, err := s.log.Loan(ctx, p, n)
	if err != nil {
		return nil, fmt.Errorf("offload: %w", err)
	}
	return &Loan{s: s, p: p, res: res}, nil
}

// Put copies payload into the store and returns its reference.
func (s *Store) Put(ctx context.Context, payload []byte) (Ref, error) {
	l, err := s.Loan(ctx, len(payload))
	if err != nil {
		return Ref{}, err
	}
	// Copied and summed in one pass (mq.Reservation.CommitCopy).
	n, off := len(payload), l.res.Offset()
	crc, err := l.res.CommitCopy(payload)
	if err != nil {
		return Ref{}, fmt.Errorf("offload: %w", err)
	}
	return l.ref(off, n, crc), nil
}

// Close closes the store's handle on the log; the log and its payloads
// stay for other processes (Remove deletes them).
func (s *Store) Close() error { return s.log.Close() }

// Remove deletes store log name and its payloads.
func Remove(name string) error { return mq.Remove(name) }
