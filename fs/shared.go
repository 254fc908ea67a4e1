package fs

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// A shared copy is a named segment (per user, mode 0600, see
// shm.CreateSegment) whose first page is this header and whose data, the
// file's bytes, start at the next page:
//
//	0   magic   u64  copyMagic, written by the first loader
//	8   state   u32  0 loading, 1 ready (a futex word: waiters sleep on it)
//	16  loader  u64  the process word (shm.Process.Word) of the process
//	                 loading it; 0 or a dead process's: up for taking
//	24  key     five u64 words naming the content: for a local file
//	            dev, ino, size, mtime, ctime; for a remote one (remote.go)
//	            its address's hash, 0, size, mtime, its chunk hashes' hash
//	64  done    u64  bytes loaded so far (progress, for waiters)
//	72  sum     32 bytes: the SHA-256 the content was last checked against
//	            (Options.SHA256), by its loader or a later opener
//
// Every holder keeps a shared lock on the segment's file (shm.Segment):
// the last one to close removes it (shm.Segment.UnlinkIfLast), and a
// killed holder's lock goes with it.
const (
	copyMagic   = 0x3159504f43534642 // "BFSCOPY1" little endian
	hdrMagic    = 0
	hdrState    = 8
	hdrLoader   = 16
	hdrKey      = 24 // five words
	hdrDone     = 64
	hdrSum      = 72
	copyHeader  = 4096
	stateReady  = 1
	waitForPeer = 50 * time.Millisecond // how often a waiter looks at the loader's liveness and progress
)

// copies are this process's open shared copies by segment name: a process
// holds one Segment (one lock) per copy however many Files use it.
var copies = struct {
	sync.Mutex
	m map[string]*sharedCopy
}{m: map[string]*sharedCopy{}}

// sharedCopy is a shared copy as this process holds it.
type sharedCopy struct {
	name  string
	ready chan struct{} // closed when the first Open of it in this process is done
	err   error         // that Open's error; the entry is gone then
	seg   *shm.Segment
	data  []byte
	refs  int // under copies' lock
	sumMu sync.Mutex
}

// copyName names the shared copy of the file st.
func copyName(st shm.FileStat) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d/%d/%d/%d/%d", st.Dev, st.Ino, st.Size, st.Mtime, st.Ctime)
	return "fs-" + hex.EncodeToString(h.Sum(nil)[:12])
}

// openShared returns the host's shared copy of f, loading it if nobody
// has, or waiting for the process that is.
func openShared(ctx context.Context, f *os.File, path string, st shm.FileStat, o Options) (*File, error) {
	key := [5]uint64{st.Dev, st.Ino, uint64(st.Size), uint64(st.Mtime), uint64(st.Ctime)}
	return shared(ctx, copyName(st), st.Size, key, o, func(ctx context.Context, data []byte, done *atomic.Uint64) error {
		return loadFile(ctx, f, path, st, o, data, done)
	})
}

// filler fills a shared copy's data (rounded up to a page) with the
// content, storing its progress in done.
type filler func(ctx context.Context, data []byte, done *atomic.Uint64) error

// shared returns the shared copy name of size bytes whose header holds
// key, filled by fill if nobody has, or waiting for the process that is.
func shared(ctx context.Context, name string, size int64, key [5]uint64, o Options, fill filler) (*File, error) {
	for {
		copies.Lock()
		c := copies.m[name]
		if c == nil {
			c = &sharedCopy{name: name, ready: make(chan struct{})}
			copies.m[name] = c
			c.refs = 1
			copies.Unlock()
			c.err = c.open(ctx, size, key, o, fill)
			if c.err != nil {
				copies.Lock()
				delete(copies.m, name)
				copies.Unlock()
			}
			close(c.ready)
			if c.err != nil {
				return nil, c.err
			}
			return c.file(), nil
		}
		c.refs++
		copies.Unlock()
		select {
		case <-c.ready:
		case <-ctx.Done():
			c.release()
			return nil, context.Cause(ctx)
		}
		if c.err != nil {
			// That Open failed (its context ended, say): try ours.
			continue
		}
		if o.SHA256 != "" {
			if err := c.checkSum(o.SHA256, int64(len(c.data))); err != nil {
				c.release()
				return nil, err
			}
		}
		return c.file(), nil
	}
}

// file is a File on the copy, holding one of its references.
func (c *sharedCopy) file() *File {
	return &File{data: c.data, shared: true, close: c.release}
}

// release drops a reference; the last in this process closes the
// segment, removing it if no other process holds it.
func (c *sharedCopy) release() error {
	copies.Lock()
	c.refs--
	last := c.refs == 0
	if last && copies.m[c.name] == c {
		delete(copies.m, c.name)
	}
	copies.Unlock()
	if !last || c.seg == nil {
		return nil
	}
	_, err := c.seg.UnlinkIfLast()
	return errors.Join(err, c.seg.Close())
}

// open opens or creates the segment and gets it loaded.
func (c *sharedCopy) open(ctx context.Context, n int64, key [5]uint64, o Options, fill filler) error {
	size := copyHeader + int(n)
	// RepairSegment opens the copy, or creates it, or makes it in place
	// in a file its creator left without a header (killed while it made
	// it); ErrLocked says a creator is making it this moment.
	var bo shm.Backoff
	seg, err := shm.OpenSegment(c.name)
	if err != nil {
		// Before a new copy takes memory, the copies whose last holder
		// died (killed: it could not remove them) go; and a copy that
		// cannot fit is an error now, not a SIGBUS once loading fills
		// the room.
		Sweep()
		if free, ferr := shm.FreeSpace(); ferr == nil && int64(size) > free {
			return fmt.Errorf("a copy of %d bytes does not fit in %s (%d bytes free)", n, shm.ShmDir, free)
		}
	}
	for err != nil {
		seg, err = shm.RepairSegment(c.name, size, &shm.SegmentConfig{Keep: true, HugePages: o.HugePages})
		if errors.Is(err, shm.ErrLocked) {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			bo.Pause()
			continue
		}
		if err != nil {
			return fmt.Errorf("shared copy %s: %w", c.name, err)
		}
	}
	if seg.Size() < size {
		seg.Close()
		return fmt.Errorf("shared copy %s has %d bytes, want %d: %w", c.name, seg.Size(), size, shm.ErrCorrupt)
	}
	c.seg = seg
	err = c.acquire(ctx, n, key, o, fill)
	if err == nil {
		c.data = c.seg.Data()[copyHeader:size:size]
		if err = shm.ProtectReadOnly(c.data); err == nil {
			return nil
		}
	}
	c.seg.UnlinkIfLast()
	c.seg.Close()
	c.seg = nil
	return err
}

// acquire returns once the segment holds the file: loaded by another
// process, or by this one, taking the load over from a loader that died.
func (c *sharedCopy) acquire(ctx context.Context, n int64, key [5]uint64, o Options, fill filler) error {
	seg := c.seg
	word := func(off int) *atomic.Uint64 { w, _ := seg.Uint64At(off); return w }
	state, _ := seg.Uint32At(hdrState)
	loader, done := word(hdrLoader), word(hdrDone)
	me := shm.Self().Word()
	for {
		if state.Load() == stateReady {
			return c.check(key, o)
		}
		if w := loader.Load(); (w == 0 || !shm.AliveWord(w)) && loader.CompareAndSwap(w, me) {
			err := c.load(ctx, key, o, fill)
			if err != nil {
				// Up for taking again, by a waiter or the next Open.
				loader.CompareAndSwap(me, 0)
				return err
			}
			state.Store(stateReady)
			shm.Wake(state)
			return nil
		}
		// Another process is loading it: wait, looking at its progress
		// and liveness every waitForPeer.
		wctx, cancel := context.WithTimeout(ctx, waitForPeer)
		shm.Wait{Spin: -1}.Until(wctx, state, func(v uint32) bool { return v == stateReady })
		cancel()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if o.Progress != nil && state.Load() != stateReady {
			o.Progress(Progress{Done: min(int64(done.Load()), n), Total: n, Waiting: true})
		}
	}
}

// load fills the segment (this process is its loader).
func (c *sharedCopy) load(ctx context.Context, key [5]uint64, o Options, fill filler) error {
	seg := c.seg
	for i, v := range key {
		w, _ := seg.Uint64At(hdrKey + 8*i)
		w.Store(v)
	}
	done, _ := seg.Uint64At(hdrDone)
	done.Store(0)
	magic, _ := seg.Uint64At(hdrMagic)
	magic.Store(copyMagic)
	data := seg.Data()[copyHeader:]
	if o.HugePages {
		_ = shm.Advise(data, shm.AdviseHugePage)
	}
	if err := fill(ctx, data, done); err != nil {
		return err
	}
	if o.SHA256 != "" {
		if err := checkSum(data[:key[2]], o.SHA256); err != nil {
			return err
		}
		sum, _ := hex.DecodeString(o.SHA256)
		seg.WriteAt(sum, hdrSum)
	}
	return nil
}

// loadFile reads the local file f into data, a shared copy's.
func loadFile(ctx context.Context, f *os.File, path string, st shm.FileStat, o Options, data []byte, done *atomic.Uint64) error {
	// The copy's pages are read whole (O_DIRECT reads blocks): the
	// segment's data area is rounded up to a page.
	src := f
	if o.Direct || !o.Buffered && st.Size >= coldDirectMin && coldOnDisk(f, st) {
		if d, err := shm.OpenDirect(path); err == nil {
			if dst, err := shm.StatFile(d); err == nil && dst.Dev == st.Dev && dst.Ino == st.Ino {
				defer d.Close()
				src = d
			} else {
				d.Close()
			}
		}
	}
	_ = shm.AdviseFile(f, 0, 0, shm.AdviseSequential)
	report := reporter(o, st.Size)
	err := runChunks(ctx, st.Size, o, func(n int64) {
		done.Store(uint64(n))
		if report != nil {
			report(n)
		}
	}, func(ctx context.Context, off int64, n int) error {
		dst := data[off : off+int64(n)]
		if src != f {
			// O_DIRECT: whole blocks, into the page-aligned data area.
			dst = data[off : off+min(int64(len(data))-off, (int64(n)+4095)&^4095)]
			err := readChunk(src, dst, off, n)
			if !isInvalid(err) {
				testChunkLoaded(off)
				return err
			}
			dst = data[off : off+int64(n)] // no O_DIRECT here after all
		}
		err := readChunk(f, dst, off, n)
		testChunkLoaded(off)
		return err
	})
	if err != nil {
		return err
	}
	// The file may have changed while it was read: then it is not the
	// content this copy is named after.
	if now, err := shm.StatFile(f); err != nil {
		return err
	} else if now.Size != st.Size || now.Mtime != st.Mtime || now.Ctime != st.Ctime {
		return fmt.Errorf("%s changed while it was loaded", path)
	}
	return nil
}

// isInvalid reports an O_DIRECT read that the file system refuses.
func isInvalid(err error) bool {
	var pe *os.PathError
	return err != nil && errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "invalid argument")
}

// check verifies that a ready copy holds the content of key (the name is
// a hash of it: another content there is a collision or tampering).
func (c *sharedCopy) check(key [5]uint64, o Options) error {
	for i, v := range key {
		w, _ := c.seg.Uint64At(hdrKey + 8*i)
		if w.Load() != v {
			return fmt.Errorf("shared copy %s holds another file: %w", c.name, shm.ErrCorrupt)
		}
	}
	if m, _ := c.seg.Uint64At(hdrMagic); m.Load() != copyMagic {
		return fmt.Errorf("shared copy %s: bad magic: %w", c.name, shm.ErrCorrupt)
	}
	if o.SHA256 != "" {
		return c.checkSum(o.SHA256, int64(key[2]))
	}
	return nil
}

// checkSum checks a ready copy's content against want (hex SHA-256):
// checked against it by its loader, or by an opener since, or else now,
// once. size is the content's, as this process knows it.
func (c *sharedCopy) checkSum(want string, size int64) error {
	c.sumMu.Lock()
	defer c.sumMu.Unlock()
	sum := make([]byte, 32)
	c.seg.ReadAt(sum, hdrSum)
	if hex.EncodeToString(sum) == strings.ToLower(want) {
		return nil
	}
	if size < 0 || size > int64(len(c.seg.Data())-copyHeader) {
		return fmt.Errorf("shared copy %s: %d bytes in a segment of %d: %w", c.name, size, len(c.seg.Data()), shm.ErrCorrupt)
	}
	if err := checkSum(c.seg.Data()[copyHeader:copyHeader+int(size)], want); err != nil {
		return err
	}
	sum, _ = hex.DecodeString(want)
	c.seg.WriteAt(sum, hdrSum)
	return nil
}

// testAfterChunk, if set, is called by a loader after each chunk it read
// into a shared copy: tests stop or kill a loader there.
var testAfterChunk atomic.Pointer[func(off int64)]

func testChunkLoaded(off int64) {
	if f := testAfterChunk.Load(); f != nil {
		(*f)(off)
	}
}

// Sweep removes this user's shared copies that no process holds: a copy
// lives only while some process has it open, and the last to close it
// removes it, but a last holder that was killed could not. Open runs it
// before it makes a new copy; it returns the segment names removed.
func Sweep() ([]string, error) {
	return shm.RemoveUnheld("fs-", hdrKey, func(head []byte) bool {
		if len(head) < hdrKey || binary.LittleEndian.Uint64(head[hdrMagic:]) != copyMagic {
			return false // its creator is still setting it up
		}
		loader := binary.LittleEndian.Uint64(head[hdrLoader:])
		return binary.LittleEndian.Uint32(head[hdrState:]) == stateReady || loader == 0 || !shm.AliveWord(loader)
	})
}
