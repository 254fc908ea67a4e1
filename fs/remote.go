package fs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub"
)

// RemoteOptions tune OpenRemote.
type RemoteOptions struct {
	// Options are Open's: Parallel is the number of chunks read at once
	// (default 8 here): ub Reads in flight for one-sided reads, else
	// connections reading stripes; Private, SHA256 and Progress as there
	// (Method, Direct, Buffered and NoPopulate do not apply).
	Options
	// Dial connects to an export's address ("ub://node/export"); default
	// transport.Dial, which takes the shm, ub or tcp path by where the
	// node is.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// RequestTimeout bounds each request's answer (default 60 s); the
	// answer to a request for one-sided reads, which comes once the
	// export has loaded the file, gets another second per 50 MB of it.
	RequestTimeout time.Duration
	// MaxSize is the largest file OpenRemote takes from an export
	// (default 1 TiB): what the export says is checked against it, and
	// against the room there is (memory for a private copy, /dev/shm for
	// a shared one), before anything is allocated.
	MaxSize int64
	// Device is the ub context for one-sided reads: the export registers
	// its loaded copy of the file for remote Read and this side reads
	// each chunk with a ub Read straight into the destination (the
	// host's shared copy, registered with Device for the load), checked
	// against the chunk's hash as any read. Default: the context of the
	// connection's transport endpoint (transport.Conn.Device) when the
	// connection takes the ub path. Without one, or when the export does
	// not offer them, chunks come through the connections.
	Device ub.Context
	// StreamOnly turns one-sided reads off.
	StreamOnly bool
}

// OpenRemote loads the file at rawURL, "ub://<node>/<export>/<path>",
// from an Exporter served at "ub://<node>/<export>": parallel chunk
// reads over several connections into the host's shared copy (as Open's
// Copy: every process here that opens the same remote content shares
// it), each chunk checked against the hash the export computed from
// its file. A peer that sends a wrong length or wrong data gets an
// error, never a view.
func OpenRemote(ctx context.Context, rawURL string, opts *RemoteOptions) (*File, error) {
	var ro RemoteOptions
	if opts != nil {
		ro = *opts
	}
	if ro.Parallel == 0 {
		ro.Parallel = 8
	}
	if ro.Method == Auto {
		ro.Method = Copy
	}
	o, err := ro.withDefaults()
	if err != nil {
		return nil, err
	}
	o.Progress = monotonic(o.Progress)
	if ro.Dial == nil {
		ro.Dial = func(ctx context.Context, addr string) (net.Conn, error) { return transport.Dial(ctx, addr) }
	}
	if ro.RequestTimeout <= 0 {
		ro.RequestTimeout = 60 * time.Second
	}
	if ro.MaxSize <= 0 {
		ro.MaxSize = 1 << 40
	}
	addr, name, err := splitRemote(rawURL)
	if err != nil {
		return nil, err
	}
	r := &remote{addr: addr, path: name, dial: ro.Dial, timeout: ro.RequestTimeout, maxSize: ro.MaxSize, dev: ro.Device, streamOnly: ro.StreamOnly}
	f, err := r.open(ctx, rawURL, o)
	if err != nil {
		return nil, fmt.Errorf("fs: open %s: %w", rawURL, err)
	}
	return f, nil
}

// splitRemote splits "ub://node/export/path" into the export's address
// and the path in it.
func splitRemote(raw string) (addr, name string, err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", fmt.Errorf("fs: %q: %w", raw, err)
	}
	parts := strings.SplitN(strings.TrimPrefix(u.Path, "/"), "/", 2)
	if u.Scheme != "ub" || u.Host == "" || len(parts) != 2 || parts[0] == "" || parts[1] == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("fs: %q is not ub://<node>/<export>/<path>", raw)
	}
	return "ub://" + u.Host + "/" + parts[0], parts[1], nil
}

// remote is one OpenRemote's connections to its export.
type remote struct {
	addr, path string
	dial       func(ctx context.Context, addr string) (net.Conn, error)
	timeout    time.Duration
	maxSize    int64
	dev        ub.Context
	streamOnly bool

	mu     sync.Mutex
	conns  []net.Conn // every connection made, closed at the end
	closed bool       // closeAll ran: the load is over, no new connections
}

func (r *remote) connect(ctx context.Context) (net.Conn, error) {
	c, err := r.dial(ctx, r.addr)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		// The load ended (a failed request or ctx) while this dial was
		// under way: a connection made now would wait out its timeout.
		c.Close()
		return nil, errLoadEnded
	}
	r.conns = append(r.conns, c)
	return c, nil
}

// errLoadEnded is connect's refusal once closeAll ran.
var errLoadEnded = fmt.Errorf("%w: the load ended", ErrRemote)

// closeAll closes every connection and refuses new ones: the load is
// over. It reports whether this call ended it (the first call).
func (r *remote) closeAll() (first bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first = !r.closed
	r.closed = true
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
	return first
}

// do sends q on c and reads the response's header; the caller reads its
// payload.
func (r *remote) do(c net.Conn, q request) (response, error) { return r.doWithin(c, q, r.timeout) }

// doWithin is do waiting up to timeout. An error wrapping errBroken says
// no answer came: the connection failed.
func (r *remote) doWithin(c net.Conn, q request, timeout time.Duration) (response, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(q.encode()); err != nil {
		return response{}, fmt.Errorf("%w: %w: %w", ErrRemote, errBroken, err)
	}
	resp, err := readResponse(c)
	if err != nil {
		return resp, err
	}
	return resp, resp.err()
}

// payload sends q on c and returns its answer's payload, of at most max
// bytes, within timeout.
func (r *remote) payload(c net.Conn, q request, max uint64, timeout time.Duration) ([]byte, error) {
	resp, err := r.doWithin(c, q, timeout)
	if err != nil {
		return nil, err
	}
	if resp.payload > max {
		return nil, fmt.Errorf("%w: an answer of %d bytes to op %d (at most %d)", ErrRemote, resp.payload, q.op, max)
	}
	b := make([]byte, resp.payload)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	return b, nil
}

func (r *remote) open(ctx context.Context, rawURL string, o Options) (_ *File, err error) {
	defer r.closeAll()
	defer func() {
		// A load that ctx ended says so, whatever broke under it (the
		// AfterFunc below closes the connections a request waits on).
		if cause := context.Cause(ctx); err != nil && cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%v)", cause, err)
		}
	}()
	// An ended ctx closes the connections, which ends every request.
	stop := context.AfterFunc(ctx, func() { r.closeAll() })
	defer stop()
	c, err := r.connect(ctx)
	if err != nil {
		return nil, err
	}
	info, err := r.stat(c)
	if err != nil {
		return nil, err
	}
	statConn := c
	dev := r.device(c)
	if info.size > r.maxSize {
		return nil, fmt.Errorf("%w: a file of %d bytes, more than MaxSize %d", ErrRemote, info.size, r.maxSize)
	}
	if o.Private {
		if avail, ok := memAvailable(); ok && info.size > avail {
			return nil, fmt.Errorf("%w: a file of %d bytes, more than this host's available memory (%d)", ErrRemote, info.size, avail)
		}
	}
	if info.size == 0 {
		if o.SHA256 != "" {
			if err := checkSum(nil, o.SHA256); err != nil {
				return nil, err
			}
		}
		return &File{path: rawURL, data: []byte{}, method: Copy, close: func() error { return nil }}, nil
	}
	o.ChunkSize = info.chunk
	slots := min(o.Parallel, len(info.hashes))
	fill := func(ctx context.Context, data []byte, done *atomic.Uint64) error {
		report := reporter(o, info.size)
		progress := func(n int64) {
			if done != nil {
				done.Store(uint64(n))
			}
			if report != nil {
				report(n)
			}
		}
		if dev != nil {
			err := r.readOneSided(ctx, &statConn, dev, info, data, o, progress)
			if !errors.Is(err, errNoOneSided) {
				return err
			}
			// Not here (a private copy with the shm provider, an export
			// without a ub context or room, a descriptor this side's
			// provider cannot import): through the connections.
		}
		// The stat's connection first; it may have idled past the
		// export's timeout by now (shared runs fill late when it takes
		// over another load), or been closed above: if its first
		// request finds it broken, a fresh one takes its place.
		pool := make(chan net.Conn, slots)
		pool <- statConn // nil if readOneSided closed it
		for range slots - 1 {
			pool <- nil // connected when first needed
		}
		var statUsed atomic.Bool
		var live atomic.Int64 // slots still in use: a refused extra one is dropped
		live.Store(int64(slots))
		return runChunks(ctx, info.size, o, progress, func(ctx context.Context, off int64, n int) error {
			for {
				var c net.Conn
				select {
				case c = <-pool:
				case <-ctx.Done(): // another request failed
					return context.Cause(ctx)
				}
				fresh := c == nil
				stale := !fresh && c == statConn && !statUsed.Swap(true)
				var err error
				if fresh {
					c, err = r.connect(ctx)
				}
				if err == nil {
					prefault(data[off : off+int64(n)])
					err = r.readChunk(c, info, data[off:off+int64(n)], off)
					if err == nil {
						pool <- c
						return nil
					}
					c.Close() // in an unknown state
				}
				if stale && errors.Is(err, errBroken) {
					pool <- nil
					continue
				}
				if fresh && (errors.Is(err, ErrBusy) || errors.Is(err, errBroken) || !errors.Is(err, ErrRemote)) && live.Add(-1) > 0 {
					// An extra connection the export refused (busy, or
					// closed unanswered when too many are told so) or
					// that could not be made: do with the others.
					continue
				}
				// Anything else ends the load: the other requests too,
				// at once rather than at their timeouts. A request that
				// fails because another one (or ctx) ended the load
				// first leaves the error to it: its own (a closed
				// connection, a refused dial) says nothing of why.
				if !r.closeAll() || ctx.Err() != nil {
					// (ctx ended first: its cause is the load's error.)
					<-ctx.Done() // runChunks ends it once the first returned
					return context.Cause(ctx)
				}
				return err
			}
		})
	}
	var file *File
	if o.Private {
		buf := make([]byte, info.size)
		if err := fill(ctx, buf, nil); err != nil {
			return nil, err
		}
		if o.SHA256 != "" {
			if err := checkSum(buf, o.SHA256); err != nil {
				return nil, err
			}
		}
		file = &File{data: buf, close: func() error { return nil }}
	} else {
		list := sha256.New()
		for _, h := range info.hashes {
			list.Write(binary.LittleEndian.AppendUint64(nil, h))
		}
		digest := list.Sum(nil)
		id := sha256.Sum256([]byte(rawURL))
		key := [5]uint64{binary.LittleEndian.Uint64(id[:]), 0, uint64(info.size), uint64(info.mtime), binary.LittleEndian.Uint64(digest)}
		h := sha256.New()
		fmt.Fprintf(h, "remote/%s/%d/%d/%x/%d", rawURL, info.size, info.mtime, digest, info.chunk)
		name := "fs-" + hex.EncodeToString(h.Sum(nil)[:12])
		file, err = shared(ctx, name, info.size, key, o, func(ctx context.Context, data []byte, done *atomic.Uint64) error {
			return fill(ctx, data[:info.size], done)
		})
		if err != nil {
			return nil, err
		}
	}
	file.path, file.size, file.method = rawURL, info.size, Copy
	if o.Progress != nil {
		o.Progress(Progress{Done: info.size, Total: info.size})
	}
	return file, nil
}

// device is the ub context for one-sided reads over c, or nil.
func (r *remote) device(c net.Conn) ub.Context {
	switch {
	case r.streamOnly:
		return nil
	case r.dev != nil:
		return r.dev
	}
	if tc, ok := c.(*transport.Conn); ok {
		return tc.Device()
	}
	return nil
}

// stat asks for the file's stat on c.
func (r *remote) stat(c net.Conn) (statInfo, error) {
	b, err := r.payload(c, request{op: opStat, path: r.path}, 24+8*maxChunks, r.timeout)
	if err != nil {
		return statInfo{}, err
	}
	return decodeStat(b)
}

// mapFile asks the export for one-sided reads of the file on c, waiting
// up to timeout (the answer comes once the export has loaded the file).
func (r *remote) mapFile(c net.Conn, timeout time.Duration) (mapInfo, error) {
	b, err := r.payload(c, request{op: opMap, path: r.path}, maxMapPayload, timeout)
	if err != nil {
		return mapInfo{}, err
	}
	return decodeMap(b)
}

// errNoOneSided: one-sided reads cannot be had for this load; the caller
// reads through the connections.
var errNoOneSided = errors.New("fs: no one-sided reads")

// readOneSided fills data with ub Reads of the export's registration of
// the file, o.Parallel at once, each on a jetty and completion queue of
// its own, each chunk checked against its hash. It registers data, and
// only then asks for the export's registration on c, which it pings
// meanwhile so that the export's idle timeout does not end it. It
// returns errNoOneSided (having read nothing) when this side or the
// export cannot do it.
func (r *remote) readOneSided(ctx context.Context, cp *net.Conn, dev ub.Context, info statInfo, data []byte, o Options, progress func(int64)) error {
	// c is the connection it asks on, which it may replace; *cp says,
	// for a fallback, which one is left (nil: none).
	c := *cp
	defer func() { *cp = c }()
	data = data[:info.size]
	reg, err := dev.RegisterSegment(data, ub.SegmentConfig{Access: ub.AccessLocal, Token: randomToken()})
	if err != nil {
		return fmt.Errorf("%w: registering the destination: %v", errNoOneSided, err)
	}
	// Closed last: when it returns no Read still in flight writes data.
	defer reg.Close()

	type worker struct {
		cq ub.CQ
		j  ub.Jetty
	}
	n := int(min(int64(o.Parallel), int64(len(info.hashes))))
	pool := make(chan *worker, n)
	var made []*worker
	defer func() {
		for _, w := range made {
			w.j.Close()
			w.cq.Close()
		}
	}()
	for range n {
		cq, err := dev.NewCQ(ub.CQConfig{Depth: 4})
		if err != nil {
			return fmt.Errorf("%w: %v", errNoOneSided, err)
		}
		j, err := dev.NewJetty(ub.JettyConfig{Mode: ub.ReliableMessage, SendCQ: cq, RecvCQ: cq, RecvDepth: 1})
		if err != nil {
			cq.Close()
			return fmt.Errorf("%w: %v", errNoOneSided, err)
		}
		w := &worker{cq, j}
		made = append(made, w)
		pool <- w
	}

	// The answer waits for the export's load of the file: RequestTimeout
	// plus the file at 50 MB/s.
	wait := r.timeout + time.Duration(info.size/(50<<20))*time.Second
	m, err := r.mapFile(c, wait)
	if errors.Is(err, errBroken) {
		c.Close()
		c = nil
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The export loads slower than we wait: no one-sided reads.
			return fmt.Errorf("%w: %v", errNoOneSided, err)
		}
		// The connection broke (it may have idled past the export's
		// timeout before this fill ran): once more on a fresh one.
		if c, err = r.connect(ctx); err == nil {
			m, err = r.mapFile(c, wait)
		}
		if err != nil && (c == nil || errors.Is(err, errBroken)) {
			if c != nil {
				c.Close()
				c = nil
			}
			return fmt.Errorf("%w: %v", errNoOneSided, err)
		}
	}
	switch {
	case errors.Is(err, errUnsupported) || errors.Is(err, ErrBusy):
		return fmt.Errorf("%w: %v", errNoOneSided, err)
	case err != nil:
		return err
	case !m.stat.equal(info):
		return fmt.Errorf("%w: the file changed between its stat and its registration", ErrRemote)
	}
	rs, err := dev.ImportSegment(m.desc, m.token)
	if err != nil {
		// Another provider's, or not one this context reaches. The
		// connection goes, and with it what the export holds for it.
		c.Close()
		c = nil
		return fmt.Errorf("%w: %v", errNoOneSided, err)
	}
	defer rs.Close()
	stop := r.keepAlive(c, time.Duration(m.idle)*time.Millisecond)
	defer stop()

	return runChunks(ctx, info.size, o, progress, func(ctx context.Context, off int64, n int) error {
		var w *worker
		select {
		case w = <-pool:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		prefault(data[off : off+int64(n)])
		if _, err := w.j.PostSend([]ub.WR{{Op: ub.OpRead, UserCtx: uint64(off),
			Local: ub.Local{Seg: reg, Offset: int(off), Len: n}, Remote: ub.Remote{Seg: rs, Offset: int(off)}}}); err != nil {
			return fmt.Errorf("fs: one-sided read at %d: %w", off, err)
		}
		wctx, cancel := context.WithTimeout(ctx, r.timeout)
		defer cancel()
		var comp [1]ub.Completion
		for {
			k, err := w.cq.Poll(comp[:])
			if err != nil {
				return err
			}
			if k == 1 {
				break
			}
			// A worker whose Read is still out is not handed back: the
			// load ends with this error.
			if err := w.cq.Wait(wctx); err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				return fmt.Errorf("%w: one-sided read of %d bytes at %d: %w", ErrRemote, n, off, err)
			}
		}
		switch cp := comp[0]; {
		case cp.Status != ub.StatusSuccess:
			return fmt.Errorf("%w: one-sided read of %d bytes at %d: %v", ErrRemote, n, off, cp.Status)
		case cp.UserCtx != uint64(off) || cp.Len != n:
			return fmt.Errorf("%w: one-sided read of %d bytes at %d completed %d bytes of the read at %d", ErrRemote, n, off, cp.Len, cp.UserCtx)
		}
		i := off / int64(info.chunk)
		if xxhash.Sum64(data[off:off+int64(n)]) != info.hashes[i] {
			return fmt.Errorf("%w: chunk %d (at %d) does not match its hash", ErrRemote, i, off)
		}
		pool <- w
		return nil
	})
}

// keepAlive pings the export on c every third of its idle timeout until
// the returned stop is called.
func (r *remote) keepAlive(c net.Conn, idle time.Duration) (stop func()) {
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(max(idle/3, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				if _, err := r.do(c, request{op: opPing}); err != nil {
					return // the reads find out what went wrong
				}
			}
		}
	}()
	return func() {
		close(quit)
		// A ping under way ends at once: the connection is done with.
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			c.SetDeadline(time.Now())
			select {
			case <-finished:
				return
			case <-tick.C:
			}
		}
	}
}

// readChunk reads the chunk at off into dst and checks its hash.
func (r *remote) readChunk(c net.Conn, info statInfo, dst []byte, off int64) error {
	resp, err := r.do(c, request{op: opRead, path: r.path, off: uint64(off), len: uint64(len(dst))})
	if err != nil {
		return err
	}
	if resp.payload != uint64(len(dst)) {
		return fmt.Errorf("%w: %d bytes sent for a read of %d", ErrRemote, resp.payload, len(dst))
	}
	if _, err := io.ReadFull(c, dst); err != nil {
		return fmt.Errorf("%w: reading %d bytes at %d: %v", ErrRemote, len(dst), off, err)
	}
	i := off / int64(info.chunk)
	if xxhash.Sum64(dst) != info.hashes[i] {
		return fmt.Errorf("%w: chunk %d (at %d) does not match its hash", ErrRemote, i, off)
	}
	return nil
}

// memAvailable is MemAvailable of /proc/meminfo, in bytes.
func memAvailable() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
