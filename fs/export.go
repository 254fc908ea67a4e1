package fs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub"
)

// ExportConfig bounds what clients can make an Exporter hold. The zero
// value (or nil) is usable.
type ExportConfig struct {
	// MaxConns is how many connections are served at once (default 64);
	// beyond it a client gets ErrBusy (16 at a time are told so; more are
	// closed at once). Each holds one goroutine and one 1 MiB buffer while
	// it reads or its stat hashes a file (two files are hashed at once,
	// the others' stats wait).
	MaxConns int
	// ChunkSize is the unit clients read in and the export hashes in, a
	// multiple of 4 KiB from 64 KiB to 64 MiB (default 8 MiB).
	ChunkSize int
	// IdleTimeout bounds the wait for a connection's next request
	// (default 60 s); WriteTimeout each response (default 30 s): a
	// client that stops reading is dropped.
	IdleTimeout, WriteTimeout time.Duration
	// Authorize, if set, is asked about every request (the connection,
	// for its peer, and the path): an error refuses it with ErrDenied.
	// Unset, anyone who can connect reads every file under the directory:
	// serve transport listeners (which check the peer's user on the
	// host, and its certificate across nodes when TLS is configured; see
	// docs/security.md) or a network where that is meant.
	Authorize func(c net.Conn, path string) error
	// Logger gets the connections that failed, and why. Default: nothing.
	Logger *slog.Logger

	// Device is the ub context one-sided reads are served through: a
	// client that asks for them (OpenRemote does, over the ub path) gets
	// the file loaded once into this host's shared copy (as Open's Copy
	// makes it, shared with local Opens of the file and with every other
	// client reading it at once), registered for remote Read with a
	// random token for as long as its connection lasts, and reads it
	// with ub Reads rather than through the connection. Default: the
	// context of the connection's own transport endpoint
	// (transport.Conn.Device) for connections on the ub path; the others
	// read through the connection.
	Device ub.Context
	// StreamOnly turns one-sided reads off: every client reads through
	// its connection.
	StreamOnly bool
	// MaxLoaded bounds the bytes of files held loaded for one-sided
	// reads at once (default half of the shared-memory file system's
	// free space when Export is called; two are loaded at a time, the
	// others wait their turn); a client that would go beyond it, when no
	// file without readers can make room, reads through its connection.
	MaxLoaded int64
	// Linger is how long a file loaded for one-sided reads stays loaded
	// after its last reader left (default 30 s; negative: not at all),
	// so that the nodes that come next read it from memory too. A file
	// without readers gives way at once to a load that needs the room.
	Linger time.Duration
}

// ExportStats counts what an Exporter did.
type ExportStats struct {
	// Conns is the connections being served now.
	Conns int
	// Streamed is the bytes sent through connections by reads.
	Streamed int64
	// Maps counts the one-sided read registrations given to clients, and
	// Loads the files loaded into memory for them: clients that read a
	// file at the same time share one load.
	Maps, Loads int64
	// Loaded is the bytes held loaded for one-sided reads now.
	Loaded int64
}

// Exporter serves the regular files under a directory, read-only, to
// OpenRemote on other nodes.
type Exporter struct {
	root *os.Root
	cfg  ExportConfig
	bufs sync.Pool

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	lns      map[net.Listener]struct{}
	closed   bool
	refusing int // connections over MaxConns being told so
	wg       sync.WaitGroup
	done     chan struct{} // closed by Close: ends stats being computed

	stats   statCache
	hashing chan struct{} // a slot per stat computed at once
	loading chan struct{} // a slot per file loaded at once for one-sided reads

	ctx    context.Context // ends at Close: ends the loads for one-sided reads
	cancel context.CancelFunc

	lmu         sync.Mutex
	loaded      map[fileKey]*loaded // files loaded for one-sided reads
	loadedBytes int64
	expiring    sync.WaitGroup // lingering loads being let go

	streamed, maps, loads atomic.Int64
}

// loaded is a file loaded for one-sided reads, held by the connections
// that registered it, then lingering.
type loaded struct {
	key   fileKey
	ready chan struct{} // closed when the load is done (or failed: err)
	err   error
	size  int64
	file  *File
	info  statInfo // its chunk hashes, of the loaded bytes
	refs  int      // under the Exporter's lmu, as idle and gen
	idle  *time.Timer
	gen   uint64 // changes whenever a reader takes it: a pending expiry is void
}

// mapping is a connection's registration of a loaded file.
type mapping struct {
	l   *loaded
	seg ub.Segment
}

// maxMapsPerConn bounds the registrations one connection holds.
const maxMapsPerConn = 4

// maxRefusing bounds the connections over MaxConns told they are
// refused at once; beyond it they are closed without a word.
const maxRefusing = 16

// Export serves the files under dir (Serve it on listeners). Paths are
// resolved inside dir: ".." and symbolic links that leave it, absolute
// paths, and anything but regular files (directories, devices, FIFOs,
// sockets) are refused.
func Export(dir string, cfg *ExportConfig) (*Exporter, error) {
	var c ExportConfig
	if cfg != nil {
		c = *cfg
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 64
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = 8 << 20
	}
	if c.ChunkSize < minChunk || c.ChunkSize > maxChunk || c.ChunkSize%4096 != 0 {
		return nil, fmt.Errorf("fs: export chunk size %d, want a multiple of 4096 from %d to %d", c.ChunkSize, minChunk, maxChunk)
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 60 * time.Second
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Linger == 0 {
		c.Linger = 30 * time.Second
	}
	if c.MaxLoaded <= 0 {
		free, err := shm.FreeSpace()
		if err != nil {
			free = 0 // no one-sided reads
		}
		c.MaxLoaded = free / 2
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("fs: export %s: %w", dir, err)
	}
	e := &Exporter{root: root, cfg: c, conns: map[net.Conn]struct{}{}, lns: map[net.Listener]struct{}{},
		done: make(chan struct{}), hashing: make(chan struct{}, 2), loading: make(chan struct{}, 2), loaded: map[fileKey]*loaded{}}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.bufs.New = func() any { b := make([]byte, 1<<20); return &b }
	e.stats.m = map[fileKey]*statEntry{}
	return e, nil
}

// Serve accepts connections on l until it fails or the Exporter closes
// (then it returns nil).
func (e *Exporter) Serve(l net.Listener) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return errors.New("fs: exporter closed")
	}
	e.lns[l] = struct{}{}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.lns, l)
		e.mu.Unlock()
	}()
	var delay time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			e.mu.Lock()
			closed := e.closed
			e.mu.Unlock()
			if closed {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of descriptors (EMFILE), a connection reset before
			// it was taken...: wait and take the next, as net/http
			// does, rather than stop serving for good.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			e.cfg.Logger.Warn("fs export: accept failed; retrying", "err", err, "in", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			c.Close()
			return nil
		}
		busy := len(e.conns) >= e.cfg.MaxConns
		if busy && e.refusing >= maxRefusing {
			// Told nothing: a flood must not hold a goroutine and a
			// descriptor each for the second refuse waits.
			e.mu.Unlock()
			c.Close()
			continue
		}
		if busy {
			e.refusing++
		} else {
			e.conns[c] = struct{}{}
		}
		e.wg.Add(1)
		e.mu.Unlock()
		go func() {
			defer e.wg.Done()
			if busy {
				e.refuse(c)
				e.mu.Lock()
				e.refusing--
				e.mu.Unlock()
				return
			}
			defer func() {
				e.mu.Lock()
				delete(e.conns, c)
				e.mu.Unlock()
				c.Close()
			}()
			if err := e.serveConn(c); !errors.Is(err, io.EOF) {
				e.cfg.Logger.Info("fs export: connection dropped", "peer", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

// refuse tells a connection over MaxConns so, after its first request.
func (e *Exporter) refuse(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := readRequest(c); err != nil {
		return
	}
	c.Write(response{status: statusBusy, msg: fmt.Sprintf("%d connections served", e.cfg.MaxConns)}.encode())
}

// Close stops the listeners being served and drops every connection.
func (e *Exporter) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	close(e.done)
	e.cancel()
	for l := range e.lns {
		l.Close()
	}
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
	// Every connection is gone: what is left lingers.
	e.lmu.Lock()
	var idle []*loaded
	for k, l := range e.loaded {
		if l.refs == 0 {
			l.idle.Stop()
			delete(e.loaded, k)
			e.loadedBytes -= l.size
			idle = append(idle, l)
		}
	}
	e.lmu.Unlock()
	for _, l := range idle {
		l.release()
	}
	e.expiring.Wait()
	return e.root.Close()
}

// Stats returns the Exporter's counts.
func (e *Exporter) Stats() ExportStats {
	e.mu.Lock()
	conns := len(e.conns)
	e.mu.Unlock()
	e.lmu.Lock()
	n := e.loadedBytes
	e.lmu.Unlock()
	return ExportStats{Conns: conns, Streamed: e.streamed.Load(), Maps: e.maps.Load(), Loads: e.loads.Load(), Loaded: n}
}

// serveConn answers a connection's requests in turn.
func (e *Exporter) serveConn(c net.Conn) error {
	var maps []mapping // the registrations it holds, dropped when it ends
	defer func() {
		for _, m := range maps {
			m.seg.Close()
			e.unmap(m.l)
		}
	}()
	for {
		c.SetReadDeadline(time.Now().Add(e.cfg.IdleTimeout))
		q, err := readRequest(c)
		if err != nil {
			if errors.Is(err, ErrRemote) {
				e.reply(c, response{status: statusBad, msg: err.Error()}, nil)
			}
			return err
		}
		c.SetReadDeadline(time.Time{})
		if err := e.answer(c, q, &maps); err != nil {
			return err
		}
	}
}

// reply writes a response (and payload, if any) within WriteTimeout.
func (e *Exporter) reply(c net.Conn, r response, payload []byte) error {
	c.SetWriteDeadline(time.Now().Add(e.cfg.WriteTimeout))
	r.payload = uint64(len(payload))
	if _, err := c.Write(append(r.encode(), payload...)); err != nil {
		return err
	}
	return nil
}

// answer answers one request; an error ends the connection. maps holds
// the connection's registrations for one-sided reads.
func (e *Exporter) answer(c net.Conn, q request, maps *[]mapping) error {
	if q.op == opPing {
		return e.reply(c, response{}, nil)
	}
	// The path's form first, then the client's right to it, and only
	// then the file system: a refused client learns nothing of what is
	// there, and opens nothing.
	if err := checkPath(q.path); err != nil {
		return e.reply(c, response{status: statusDenied, msg: err.Error()}, nil)
	}
	if e.cfg.Authorize != nil {
		if err := e.cfg.Authorize(c, q.path); err != nil {
			return e.reply(c, response{status: statusDenied, msg: "not authorized: " + err.Error()}, nil)
		}
	}
	f, st, status, err := e.open(q.path)
	if err != nil {
		if f != nil {
			f.Close()
		}
		return e.reply(c, response{status: status, msg: err.Error()}, nil)
	}
	defer f.Close()
	switch q.op {
	case opStat:
		info, err := e.stat(f, st)
		if err != nil {
			return e.reply(c, response{status: statusIO, msg: err.Error()}, nil)
		}
		return e.reply(c, response{}, info.encode())
	case opMap:
		// Whatever keeps this export from one-sided reads of the file
		// (no ub context, no room, a failed load or registration) is
		// "unsupported": the client reads through the connection.
		dev := e.device(c)
		switch {
		case dev == nil || st.Size == 0:
			return e.reply(c, response{status: statusUnsupported, msg: "no one-sided reads here"}, nil)
		case len(*maps) >= maxMapsPerConn:
			return e.reply(c, response{status: statusBusy, msg: fmt.Sprintf("a connection holds at most %d registrations", maxMapsPerConn)}, nil)
		}
		l, err := e.hold(f, q.path, st)
		if err != nil {
			return e.reply(c, response{status: statusUnsupported, msg: err.Error()}, nil)
		}
		token := randomToken()
		seg, err := dev.RegisterSegment(l.file.Bytes(), ub.SegmentConfig{Access: ub.AccessRead, Token: token})
		if err != nil {
			e.unmap(l)
			return e.reply(c, response{status: statusUnsupported, msg: "registering the file: " + err.Error()}, nil)
		}
		*maps = append(*maps, mapping{l, seg})
		e.maps.Add(1)
		m := mapInfo{idle: uint32(min(e.cfg.IdleTimeout.Milliseconds(), 1<<31)), token: token, desc: seg.Desc(), stat: l.info}
		return e.reply(c, response{}, m.encode())
	default: // opRead
		if q.len > uint64(e.cfg.ChunkSize) || q.off > uint64(st.Size) || q.len > uint64(st.Size)-q.off {
			return e.reply(c, response{status: statusBad, msg: fmt.Sprintf("read of %d bytes at %d of a %d-byte file in chunks of %d", q.len, q.off, st.Size, e.cfg.ChunkSize)}, nil)
		}
		c.SetWriteDeadline(time.Now().Add(e.cfg.WriteTimeout))
		if _, err := c.Write(response{payload: q.len}.encode()); err != nil {
			return err
		}
		// Streamed through a 1 MiB buffer; a file that ends early (it
		// was truncated) ends the connection, which the client sees as
		// a short payload.
		bp := e.bufs.Get().(*[]byte)
		defer e.bufs.Put(bp)
		n, err := io.CopyBuffer(writerOnly{c}, io.NewSectionReader(f, int64(q.off), int64(q.len)), *bp)
		e.streamed.Add(n)
		if err == nil && uint64(n) != q.len {
			err = fmt.Errorf("%s ended after %d of %d bytes", q.path, n, q.len)
		}
		return err
	}
}

// writerOnly hides a net.Conn's ReadFrom, so that io.CopyBuffer uses the
// buffer it is given.
type writerOnly struct{ io.Writer }

// checkPath refuses what is not a clean relative path.
func checkPath(name string) error {
	if name != path.Clean(name) || path.IsAbs(name) || name == "." || strings.HasPrefix(name, "../") || name == ".." ||
		strings.ContainsRune(name, 0) {
		return fmt.Errorf("path %q is not a clean path inside the export", name)
	}
	return nil
}

// open opens an exported file (its path checked): inside the root, and a
// regular file.
func (e *Exporter) open(name string) (*os.File, shm.FileStat, uint8, error) {
	f, err := e.root.OpenFile(name, os.O_RDONLY|shm.OpenNonblock, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, shm.FileStat{}, statusNotFound, fmt.Errorf("%s: no such file", name)
		}
		return nil, shm.FileStat{}, statusDenied, fmt.Errorf("%s: %v", name, errors.Unwrap(err))
	}
	st, err := shm.StatFile(f)
	if err != nil {
		return f, st, statusIO, err
	}
	if !st.IsRegular() {
		return f, st, statusDenied, fmt.Errorf("%s is not a regular file", name)
	}
	return f, st, statusOK, nil
}

// fileKey names a file's content for the stat cache.
type fileKey struct {
	dev, ino     uint64
	size, mtime  int64
	ctime, chunk int64
}

// statCache keeps the chunk hashes of recently served files: computing
// them reads the whole file once.
type statCache struct {
	mu sync.Mutex
	m  map[fileKey]*statEntry
}

type statEntry struct {
	done chan struct{}
	info statInfo
	err  error
}

// maxStats bounds the cache (8 KiB of hashes per GiB in 8 MiB chunks).
const maxStats = 256

// stat returns f's stat, hashing it once per content however many
// clients ask at once; at most cap(e.hashing) files are hashed at once,
// through the pooled buffer, and Close stops them.
func (e *Exporter) stat(f *os.File, st shm.FileStat) (statInfo, error) {
	s := &e.stats
	k := fileKey{st.Dev, st.Ino, st.Size, st.Mtime, st.Ctime, int64(e.cfg.ChunkSize)}
	// A file loaded for one-sided reads has its hashes already.
	e.lmu.Lock()
	l := e.loaded[k]
	e.lmu.Unlock()
	if l != nil {
		select {
		case <-l.ready:
			if l.err == nil {
				return l.info, nil
			}
		default:
		}
	}
	s.mu.Lock()
	en := s.m[k]
	if en == nil {
		if len(s.m) >= maxStats {
			for old, oe := range s.m { // a finished one: they are cheap to remake
				select {
				case <-oe.done:
					delete(s.m, old)
				default:
					continue
				}
				break
			}
		}
		en = &statEntry{done: make(chan struct{})}
		s.m[k] = en
		s.mu.Unlock()
		select {
		case e.hashing <- struct{}{}:
			en.info, en.err = e.hashFile(f, st)
			<-e.hashing
		case <-e.done:
			en.err = errors.New("export closed")
		}
		if en.err != nil {
			s.mu.Lock()
			delete(s.m, k)
			s.mu.Unlock()
		}
		close(en.done)
	} else {
		s.mu.Unlock()
		select {
		case <-en.done:
		case <-e.done:
			return statInfo{}, errors.New("export closed")
		}
	}
	return en.info, en.err
}

// hashFile reads f whole through a pooled buffer and hashes each chunk.
func (e *Exporter) hashFile(f *os.File, st shm.FileStat) (statInfo, error) {
	chunk := int64(e.cfg.ChunkSize)
	info := statInfo{size: st.Size, mtime: st.Mtime, chunk: e.cfg.ChunkSize}
	n := (st.Size + chunk - 1) / chunk
	if n > maxChunks {
		return info, fmt.Errorf("%d bytes is more than %d chunks of %d", st.Size, maxChunks, chunk)
	}
	bp := e.bufs.Get().(*[]byte)
	defer e.bufs.Put(bp)
	buf := *bp
	var d xxhash.Digest
	for i := range n {
		d.Reset()
		for off, end := i*chunk, min((i+1)*chunk, st.Size); off < end; {
			select {
			case <-e.done:
				return info, errors.New("export closed")
			default:
			}
			b := buf[:min(int64(len(buf)), end-off)]
			if _, err := f.ReadAt(b, off); err != nil {
				return info, fmt.Errorf("hashing: %w", err)
			}
			d.Write(b)
			off += int64(len(b))
		}
		info.hashes = append(info.hashes, d.Sum64())
	}
	if now, err := shm.StatFile(f); err != nil || now.Size != st.Size || now.Mtime != st.Mtime || now.Ctime != st.Ctime {
		return info, errors.New("the file changed while it was hashed")
	}
	return info, nil
}

// device is the ub context one-sided reads to c are served through, or
// nil.
func (e *Exporter) device(c net.Conn) ub.Context {
	switch {
	case e.cfg.StreamOnly:
		return nil
	case e.cfg.Device != nil:
		return e.cfg.Device
	}
	if tc, ok := c.(*transport.Conn); ok {
		return tc.Device()
	}
	return nil
}

// hold returns f loaded for one-sided reads, holding a reference: the
// load of the same content under way or done (lingering), or a new one
// if it fits in MaxLoaded, lingering loads giving way to it.
func (e *Exporter) hold(f *os.File, name string, st shm.FileStat) (*loaded, error) {
	k := fileKey{st.Dev, st.Ino, st.Size, st.Mtime, st.Ctime, int64(e.cfg.ChunkSize)}
	e.lmu.Lock()
	l := e.loaded[k]
	if l != nil {
		if l.refs == 0 {
			l.idle.Stop()
		}
		l.refs++
		l.gen++ // an expiry already waiting for lmu finds it taken
		e.lmu.Unlock()
		select {
		case <-l.ready:
		case <-e.done:
			e.unmap(l)
			return nil, errors.New("export closed")
		}
		if l.err != nil {
			e.unmap(l)
			return nil, l.err
		}
		return l, nil
	}
	// Would it fit if every lingering load gave way? Only then do they.
	var idleBytes int64
	idle := 0
	for _, el := range e.loaded {
		if el.refs == 0 {
			idleBytes += el.size
			idle++
		}
	}
	if e.loadedBytes-idleBytes+st.Size > e.cfg.MaxLoaded || len(e.loaded)-idle >= maxStats {
		held := e.loadedBytes - idleBytes
		e.lmu.Unlock()
		return nil, fmt.Errorf("%d bytes loaded for one-sided reads, %d more would pass the bound (%d)", held, st.Size, e.cfg.MaxLoaded)
	}
	var evicted []*loaded
	for ek, el := range e.loaded {
		if e.loadedBytes+st.Size <= e.cfg.MaxLoaded && len(e.loaded) < maxStats {
			break
		}
		if el.refs == 0 {
			el.idle.Stop()
			delete(e.loaded, ek)
			e.loadedBytes -= el.size
			evicted = append(evicted, el)
		}
	}
	l = &loaded{key: k, ready: make(chan struct{}), size: st.Size, refs: 1}
	e.loaded[k] = l
	e.loadedBytes += st.Size
	e.lmu.Unlock()
	for _, el := range evicted {
		el.release()
	}
	l.err = e.load(l, f, name, st)
	if l.err != nil {
		e.lmu.Lock()
		if e.loaded[k] == l {
			delete(e.loaded, k) // the next client tries again
		}
		e.lmu.Unlock()
	}
	close(l.ready)
	if l.err != nil {
		e.unmap(l)
		return nil, l.err
	}
	e.loads.Add(1)
	return l, nil
}

// load loads f into the host's shared copy and hashes it. Two files are
// loaded at once (each with Open's parallel reads); the others wait.
func (e *Exporter) load(l *loaded, f *os.File, name string, st shm.FileStat) error {
	select {
	case e.loading <- struct{}{}:
		defer func() { <-e.loading }()
	case <-e.done:
		return errors.New("export closed")
	}
	// Through the page cache even when the file is cold: streamed reads
	// of it (io.SectionReader on the file) read there meanwhile, and
	// the disk is read once.
	o, err := (&Options{Method: Copy, Buffered: true}).withDefaults()
	if err != nil {
		return err
	}
	file, err := openFile(e.ctx, f, name, o)
	if err != nil {
		return err
	}
	// openFile stats f again: the copy must be of the content it is kept
	// (and its hashes served) under.
	if now, err := shm.StatFile(f); err != nil || now.Size != st.Size || now.Mtime != st.Mtime || now.Ctime != st.Ctime {
		file.Close()
		return fmt.Errorf("%s changed while it was loaded", name)
	}
	data := file.Bytes()
	if int64(len(data)) != st.Size {
		file.Close()
		return fmt.Errorf("%s: %d bytes loaded, the file had %d", name, len(data), st.Size)
	}
	// The hashes are the loaded copy's: what the clients read.
	l.info = statInfo{size: st.Size, mtime: st.Mtime, chunk: e.cfg.ChunkSize}
	for off := int64(0); off < st.Size; off += int64(e.cfg.ChunkSize) {
		l.info.hashes = append(l.info.hashes, xxhash.Sum64(data[off:min(off+int64(e.cfg.ChunkSize), st.Size)]))
	}
	l.file = file
	return nil
}

// unmap drops a reference to l. The last leaves a loaded file lingering
// for Linger (unless the export is closing), and releases a failed one.
func (e *Exporter) unmap(l *loaded) {
	e.lmu.Lock()
	l.refs--
	if l.refs > 0 {
		e.lmu.Unlock()
		return
	}
	if l.err == nil && e.loaded[l.key] == l && e.cfg.Linger > 0 && e.ctx.Err() == nil {
		gen := l.gen
		l.idle = time.AfterFunc(e.cfg.Linger, func() { e.expire(l, gen) })
		e.lmu.Unlock()
		return
	}
	if e.loaded[l.key] == l {
		delete(e.loaded, l.key)
	}
	e.loadedBytes -= l.size
	e.lmu.Unlock()
	l.release()
}

// expire releases l after it lingered, unless a reader took it since
// (gen changed) or Close or a load needing room took it away.
func (e *Exporter) expire(l *loaded, gen uint64) {
	e.lmu.Lock()
	if l.gen != gen || l.refs != 0 || e.loaded[l.key] != l {
		e.lmu.Unlock()
		return
	}
	delete(e.loaded, l.key)
	e.loadedBytes -= l.size
	e.expiring.Add(1) // Close waits for it
	e.lmu.Unlock()
	defer e.expiring.Done()
	l.release()
}

// release lets l's copy go.
func (l *loaded) release() {
	if l.file != nil {
		l.file.Close()
	}
}

// randomToken is a segment token from crypto/rand (never zero).
func randomToken() ub.Token {
	var b [4]byte
	for {
		rand.Read(b[:])
		if t := ub.Token(binary.LittleEndian.Uint32(b[:])); t != 0 {
			return t
		}
	}
}
