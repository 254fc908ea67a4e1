package offload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/transport"
)

// ResolverConfig configures a Resolver. The zero value is useful.
type ResolverConfig struct {
	// Endpoint dials fetch servers and names this process's node
	// (default transport.Default()).
	Endpoint *transport.Endpoint
	// Path is the transport path fetches take (default transport.PathTCP:
	// consumers off the super node's hosts).
	Path transport.Path
	// Remote makes every reference resolve through its fetch server, as
	// on another host, even when its log is on this one.
	Remote bool
	// MaxPayload is the largest payload fetched (default 64 MiB): a
	// reference or a server that claims more is refused before anything
	// is allocated.
	MaxPayload int
	// Timeout bounds each fetch (default 10 s), within the caller's
	// context.
	Timeout time.Duration
	// Logs, if set, are the only logs references may name (others are
	// ErrBadRef): a consumer that does not trust every producer of its
	// topics keeps references from reading its user's other logs.
	// Default: any.
	Logs []string
}

// Resolver resolves references to their payloads: in place from the log
// when it is on this host, else from the reference's fetch server. It
// keeps the logs it opened and a few idle connections per server; it is
// safe for concurrent use.
type Resolver struct {
	cfg  ResolverConfig
	node string

	mu     sync.Mutex
	logs   map[string]*mq.Log
	idle   map[string][]net.Conn
	closed bool
}

// Bounds of what a Resolver keeps, whatever references it is given.
const (
	maxOpenLogs    = 32
	maxIdlePerAddr = 4
	maxIdleAddrs   = 32
)

// NewResolver returns a resolver.
func NewResolver(cfg ResolverConfig) (*Resolver, error) {
	if cfg.Endpoint == nil {
		e, err := transport.Default()
		if err != nil {
			return nil, fmt.Errorf("offload: %w", err)
		}
		cfg.Endpoint = e
	}
	if cfg.Path == "" {
		cfg.Path = transport.PathTCP
	}
	if cfg.MaxPayload <= 0 {
		cfg.MaxPayload = 64 << 20
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	return &Resolver{cfg: cfg, node: cfg.Endpoint.Node(), logs: map[string]*mq.Log{}, idle: map[string][]net.Conn{}}, nil
}

// Close closes the logs and connections the resolver kept.
func (r *Resolver) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	var errs []error
	for _, l := range r.logs {
		errs = append(errs, l.Close())
	}
	for _, cs := range r.idle {
		for _, c := range cs {
			c.Close()
		}
	}
	r.logs, r.idle = nil, nil
	return errors.Join(errs...)
}

// Get returns a copy of ref's payload. From a log on this host it is
// copied and summed in one pass (mq.Log.CopyAt): the bytes returned are
// the ones checked.
func (r *Resolver) Get(ctx context.Context, ref Ref) ([]byte, error) {
	l, err := r.local(ref)
	if err != nil {
		return nil, err
	}
	if l == nil {
		return r.remote(ctx, ref)
	}
	rec, err := l.CopyAt(ref.Partition, ref.Offset, func(n int) ([]byte, error) {
		if n != int(ref.Length) {
			// Not the reference's record: nothing allocated for it.
			return nil, fmt.Errorf("offload: %s: found %d bytes: %w", ref, n, ErrChecksum)
		}
		return make([]byte, n), nil
	})
	if errors.Is(err, ErrChecksum) {
		return nil, err
	}
	if err != nil {
		return nil, readErr(ref, err)
	}
	if err := verifyRecord(ref, rec); err != nil {
		return nil, err
	}
	return rec.Payload, nil
}

// View returns ref's payload, in shared memory when its log is on this
// host (valid until release; a producer of the log could change it, the
// checksum was verified when View returned), else fetched into a fresh
// buffer. Errors: ErrPayloadGone, ErrChecksum, ErrTooLarge, ErrBadRef,
// or the fetch's.
func (r *Resolver) View(ctx context.Context, ref Ref) (payload []byte, release func(), err error) {
	l, err := r.local(ref)
	if err != nil {
		return nil, nil, err
	}
	if l == nil {
		b, err := r.remote(ctx, ref)
		if err != nil {
			return nil, nil, err
		}
		return b, func() {}, nil
	}
	rec, release, err := l.ReadAt(ref.Partition, ref.Offset)
	if err != nil {
		return nil, nil, readErr(ref, err)
	}
	// ReadAt checked the payload against its header's checksum: the
	// reference's must be that one (no second sum of it).
	if err := verifyRecord(ref, rec); err != nil {
		release()
		return nil, nil, err
	}
	return rec.Payload, release, nil
}

// local checks ref against the resolver's limits and returns its log if
// it is on this host, else nil.
func (r *Resolver) local(ref Ref) (*mq.Log, error) {
	if err := ref.check(); err != nil {
		return nil, err
	}
	if r.cfg.Logs != nil && !slices.Contains(r.cfg.Logs, ref.Log) {
		return nil, fmt.Errorf("%w: %s: not one of the logs this resolver takes", ErrBadRef, ref)
	}
	if int64(ref.Length) > int64(r.cfg.MaxPayload) {
		return nil, fmt.Errorf("offload: %s: at most %d bytes taken: %w", ref, r.cfg.MaxPayload, ErrTooLarge)
	}
	return r.localLog(ref)
}

// remote fetches ref's payload from its fetch server, if it names one.
func (r *Resolver) remote(ctx context.Context, ref Ref) ([]byte, error) {
	if ref.Fetch == "" {
		return nil, fmt.Errorf("offload: %s: the log is not on this host and the reference names no fetch server: %w", ref, ErrPayloadGone)
	}
	return r.fetch(ctx, ref)
}

// readErr is the error of a failed read of ref's record on this host.
func readErr(ref Ref, err error) error {
	if errors.Is(err, mq.ErrOffsetGone) || errors.Is(err, mq.ErrNotRecord) {
		return fmt.Errorf("offload: %s: %w (%v)", ref, ErrPayloadGone, err)
	}
	return fmt.Errorf("offload: %s: %w", ref, err)
}

// verifyRecord is verify for a record read in place, whose payload mq
// checked against rec.CRC.
func verifyRecord(ref Ref, rec mq.Record) error {
	if len(rec.Payload) != int(ref.Length) {
		return fmt.Errorf("offload: %s: found %d bytes: %w", ref, len(rec.Payload), ErrChecksum)
	}
	if rec.CRC != ref.CRC {
		return fmt.Errorf("offload: %s: checksum: %w", ref, ErrChecksum)
	}
	return nil
}

func verify(ref Ref, b []byte) error {
	if len(b) != int(ref.Length) {
		return fmt.Errorf("offload: %s: found %d bytes: %w", ref, len(b), ErrChecksum)
	}
	if crc32.Checksum(b, castagnoli) != ref.CRC {
		return fmt.Errorf("offload: %s: checksum: %w", ref, ErrChecksum)
	}
	return nil
}

// localLog returns ref's log if it is on this host (nil if not).
func (r *Resolver) localLog(ref Ref) (*mq.Log, error) {
	if r.cfg.Remote {
		return nil, nil
	}
	if ref.Fetch != "" {
		if a, err := transport.ParseAddr(ref.Fetch); err == nil && a.Node != "" && a.Node != r.node {
			return nil, nil
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errors.New("offload: resolver closed")
	}
	if l := r.logs[ref.Log]; l != nil {
		return l, nil
	}
	l, err := mq.Open(ref.Log)
	if errors.Is(err, os.ErrNotExist) {
		if ref.Fetch == "" {
			return nil, fmt.Errorf("offload: %s: no such log on this host: %w", ref, ErrPayloadGone)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("offload: %s: %w", ref, err)
	}
	if len(r.logs) >= maxOpenLogs {
		for name, old := range r.logs { // one out, any
			old.Close()
			delete(r.logs, name)
			break
		}
	}
	r.logs[ref.Log] = l
	return l, nil
}

// fetch gets ref's payload from its fetch server.
func (r *Resolver) fetch(ctx context.Context, ref Ref) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	a, _ := transport.ParseAddr(ref.Fetch) // checked by ref.check
	if a.Path == "" {
		a.Path = r.cfg.Path
	}
	addr := a.String()
	var b []byte
	var err error
	for try := 0; ; try++ {
		c, reused, derr := r.conn(ctx, addr, try > 0)
		if derr != nil {
			return nil, fmt.Errorf("offload: %s: dial the fetch server: %w", ref, derr)
		}
		stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
		var keep bool
		b, keep, err = r.exchange(c, ref)
		if !stop() {
			keep = false
		}
		if keep {
			r.putIdle(addr, c)
		} else {
			c.Close()
		}
		// An idle connection the server closed meanwhile: once more on a
		// fresh one.
		if err != nil && reused && !keep && ctx.Err() == nil && !errors.Is(err, ErrChecksum) && !errors.Is(err, ErrTooLarge) {
			continue
		}
		break
	}
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("offload: %s: fetch: %w (%v)", ref, ctx.Err(), err)
	}
	return b, err
}

// exchange sends one request on c and reads its response; keep says
// whether c may serve another.
func (r *Resolver) exchange(c net.Conn, ref Ref) (payload []byte, keep bool, err error) {
	enc, err := ref.MarshalBinary()
	if err != nil {
		return nil, false, err
	}
	c.SetDeadline(time.Now().Add(r.cfg.Timeout))
	if _, err := c.Write(appendRequest(nil, enc)); err != nil {
		return nil, false, fmt.Errorf("offload: %s: fetch: %w", ref, err)
	}
	br := bufio.NewReaderSize(c, 64<<10)
	status, n, err := readResponseHeader(br, r.cfg.MaxPayload)
	if err != nil {
		return nil, false, fmt.Errorf("offload: %s: fetch: %w", ref, err)
	}
	if status == statusOK && n != int(ref.Length) {
		return nil, false, fmt.Errorf("offload: %s: the fetch server sends %d bytes: %w", ref, n, ErrChecksum)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(br, b); err != nil {
		return nil, false, fmt.Errorf("offload: %s: fetch: %w", ref, err)
	}
	keep = br.Buffered() == 0 // the server sends nothing unasked
	switch status {
	case statusOK:
		if err := verify(ref, b); err != nil {
			return nil, false, err
		}
		return b, keep, nil
	case statusGone:
		return nil, keep, fmt.Errorf("offload: %s: the fetch server says %q: %w", ref, b, ErrPayloadGone)
	case statusMismatch:
		return nil, keep, fmt.Errorf("offload: %s: the fetch server says %q: %w", ref, b, ErrChecksum)
	default:
		return nil, keep, fmt.Errorf("offload: %s: the fetch server says %q", ref, b)
	}
}

// conn returns an idle connection to addr (reused) or, if there is none
// or fresh, a new one.
func (r *Resolver) conn(ctx context.Context, addr string, fresh bool) (c net.Conn, reused bool, err error) {
	r.mu.Lock()
	if cs := r.idle[addr]; len(cs) > 0 && !fresh {
		c := cs[len(cs)-1]
		if len(cs) == 1 {
			delete(r.idle, addr)
		} else {
			r.idle[addr] = cs[:len(cs)-1]
		}
		r.mu.Unlock()
		return c, true, nil
	}
	r.mu.Unlock()
	tc, err := r.cfg.Endpoint.Dial(ctx, addr)
	if err != nil {
		return nil, false, err
	}
	return tc, false, nil
}

func (r *Resolver) putIdle(addr string, c net.Conn) {
	c.SetDeadline(time.Time{})
	r.mu.Lock()
	defer r.mu.Unlock()
	cs, known := r.idle[addr]
	if r.closed || len(cs) >= maxIdlePerAddr || !known && len(r.idle) >= maxIdleAddrs {
		c.Close()
		return
	}
	r.idle[addr] = append(cs, c)
}
