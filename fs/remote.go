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
)

// RemoteOptions tune OpenRemote.
type RemoteOptions struct {
	// Options are Open's: Parallel is the number of connections reading
	// stripes at once (default 4 here), Private, SHA256 and Progress as
	// there (Method, Direct and NoPopulate do not apply).
	Options
	// Dial connects to an export's address ("ub://node/export"); default
	// transport.Dial, which takes the shm, ub or tcp path by where the
	// node is.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// RequestTimeout bounds each request's answer (default 60 s).
	RequestTimeout time.Duration
	// MaxSize is the largest file OpenRemote takes from an export
	// (default 1 TiB): what the export says is checked against it, and
	// against the room there is (memory for a private copy, /dev/shm for
	// a shared one), before anything is allocated.
	MaxSize int64
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
		ro.Parallel = 4
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
	r := &remote{addr: addr, path: name, dial: ro.Dial, timeout: ro.RequestTimeout, maxSize: ro.MaxSize}
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

	mu    sync.Mutex
	conns []net.Conn // every connection made, closed at the end
}

func (r *remote) connect(ctx context.Context) (net.Conn, error) {
	c, err := r.dial(ctx, r.addr)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.conns = append(r.conns, c)
	r.mu.Unlock()
	return c, nil
}

func (r *remote) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// do sends q on c and reads the response's header; the caller reads its
// payload.
func (r *remote) do(c net.Conn, q request) (response, error) {
	c.SetDeadline(time.Now().Add(r.timeout))
	if _, err := c.Write(q.encode()); err != nil {
		return response{}, err
	}
	resp, err := readResponse(c)
	if err != nil {
		return resp, err
	}
	return resp, resp.err()
}

func (r *remote) open(ctx context.Context, rawURL string, o Options) (*File, error) {
	defer r.closeAll()
	// An ended ctx closes the connections, which ends every request.
	stop := context.AfterFunc(ctx, r.closeAll)
	defer stop()
	c, err := r.connect(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := r.do(c, request{op: opStat, path: r.path})
	if err != nil {
		return nil, err
	}
	if resp.payload > 24+8*maxChunks {
		return nil, fmt.Errorf("%w: stat of %d bytes", ErrRemote, resp.payload)
	}
	b := make([]byte, resp.payload)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	info, err := decodeStat(b)
	if err != nil {
		return nil, err
	}
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
	pool := make(chan net.Conn, slots)
	pool <- c
	for range slots - 1 {
		pool <- nil // connected when first needed
	}
	var live atomic.Int64 // slots still in use: a refused extra one is dropped
	live.Store(int64(slots))
	fill := func(ctx context.Context, data []byte, done *atomic.Uint64) error {
		report := reporter(o, info.size)
		return runChunks(ctx, info.size, o, func(n int64) {
			if done != nil {
				done.Store(uint64(n))
			}
			if report != nil {
				report(n)
			}
		}, func(ctx context.Context, off int64, n int) error {
			for {
				var c net.Conn
				select {
				case c = <-pool:
				case <-ctx.Done(): // another request failed
					return context.Cause(ctx)
				}
				fresh := c == nil
				var err error
				if fresh {
					c, err = r.connect(ctx)
				}
				if err == nil {
					err = r.readChunk(c, info, data[off:off+int64(n)], off)
					if err == nil {
						pool <- c
						return nil
					}
					c.Close() // in an unknown state
				}
				if fresh && (errors.Is(err, ErrBusy) || !errors.Is(err, ErrRemote)) && live.Add(-1) > 0 {
					// An extra connection the export refused (busy) or
					// that could not be made: do with the others.
					continue
				}
				// Anything else ends the load: the other requests too,
				// at once rather than at their timeouts.
				r.closeAll()
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
