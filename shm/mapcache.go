//go:build linux

package shm

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// A MapCache keeps the mappings of named segments this process is done
// with, so that opening the same file again maps nothing. Mapping a
// segment is cheap; what costs is the page tables: the first touch of
// each 4 KiB page of a new mapping faults (or MADV_POPULATE fills them
// all at once: about 1.4 ms for 8 MiB on a virtual machine here), and
// unmapping tears them down again (about 0.8 ms for 8 MiB), which is
// work a thread of the process must do. A caller that cycles through
// the same few files (mq's recycled segments: the file of a segment
// retention dropped is renamed to be a later one) pays it on every pass
// without a MapCache, and once with one.
//
// Release gives a segment back: its shared lock is dropped (so the file
// no longer counts as held: RenameSegment and ReuseSegment may take it;
// Sweep still leaves it alone, as it does any file a live process has
// mapped or open), it leaves MappingOf's table, and its mapping and
// descriptor are kept idle. OpenSegment and ReuseSegment through the
// cache then use an idle mapping of the file they open (the same device
// and inode, the same size, and the same header through the mapping as
// read from the file) instead of mapping it anew, and otherwise map it
// as the functions of the package do. Everything else they do (the
// checks of owner, mode and links, the locks, the header's validation,
// the zeroing) is the same.
//
// An idle mapping would keep its file's memory if the file were
// removed, so every Release and every opening through the cache looks
// at the idle files (fstat of the kept descriptors) and lets go of
// those removed since. The cache holds at most n idle mappings (and as
// many descriptors) and lets go of the oldest beyond that; Close lets
// go of them all. A MapCache is safe for concurrent use. A nil *MapCache
// keeps nothing: its OpenSegment, ReuseSegment and Release are the
// package's OpenSegment and ReuseSegment and Segment.Close.
type MapCache struct {
	mu     sync.Mutex
	max    int
	idle   []idleMapping // oldest first
	closed bool
	hits   uint64
}

// idleMapping is a mapping a Release kept: the whole file, header
// included, of the file id, open (unlocked) as fd.
type idleMapping struct {
	id  fileID
	mem []byte
	fd  int
}

// NewMapCache returns a cache keeping at most n idle mappings (at
// least 1).
func NewMapCache(n int) *MapCache { return &MapCache{max: max(n, 1)} }

// Hits is how many segments the cache gave an idle mapping to.
func (c *MapCache) Hits() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hits
}

// Room is how many idle mappings the cache may hold.
func (c *MapCache) Room() int { return c.max }

// Idle is how many idle mappings the cache holds.
func (c *MapCache) Idle() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle)
}

// OpenSegment is the package's OpenSegment, using an idle mapping of
// the file if the cache has one.
func (c *MapCache) OpenSegment(name string) (*Segment, error) {
	return openSegment(name, c)
}

// ReuseSegment is the package's ReuseSegment, using an idle mapping of
// old's file if the cache has one (its page tables are there: the
// zeroing faults nothing).
func (c *MapCache) ReuseSegment(old, name string, size int) (*Segment, error) {
	if size <= 0 {
		return nil, fmt.Errorf("shm: segment size %d must be positive", size)
	}
	return renameSegment(old, name, size, c)
}

// Release closes s, keeping its mapping in the cache if s is a named
// segment in ShmDir that its Close would not unlink (one this process
// opened, or created with SegmentConfig.Keep) and whose file is still
// there; any other segment is closed as by Close. Memory obtained from
// s must not be used after Release (it stays mapped, but another holder
// may reuse the file for other data). The mapping is made writable
// again if ProtectReadOnly had made part of it read-only. Release of a
// closed segment does nothing.
func (c *MapCache) Release(s *Segment) error {
	if c == nil || s.file == "" || (s.created && !s.keep) || s.closed.Load() {
		return s.Close() // idempotent
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil || st.Nlink == 0 {
		// Removed: kept, its mapping would only keep its memory.
		return s.Close()
	}
	if s.closed.Swap(true) {
		return nil
	}
	s.unpublish()
	openSegments.Add(-1)
	errs := []error{
		unix.Mprotect(s.mem, unix.PROT_READ|unix.PROT_WRITE),
		// The mapping holds the open file description, and with it the
		// flock, which goes with the description's last reference, not
		// with the descriptor: it is dropped here.
		unix.Flock(s.fd, unix.LOCK_UN),
	}
	c.mu.Lock()
	var gone []idleMapping
	if c.closed {
		gone = append(gone, idleMapping{mem: s.mem, fd: s.fd})
	} else {
		gone = c.pruneLocked()
		c.idle = append(c.idle, idleMapping{id: statID(&st), mem: s.mem, fd: s.fd})
		for len(c.idle) > c.max {
			gone = append(gone, c.idle[0])
			c.idle = c.idle[1:]
		}
	}
	c.mu.Unlock()
	return errors.Join(append(errs, letGo(gone))...)
}

// pruneLocked takes the idle mappings of files removed since out of the
// cache and returns them; c.mu is held.
func (c *MapCache) pruneLocked() (gone []idleMapping) {
	kept := c.idle[:0]
	for _, m := range c.idle {
		var st unix.Stat_t
		if unix.Fstat(m.fd, &st) != nil || st.Nlink == 0 {
			gone = append(gone, m)
			continue
		}
		kept = append(kept, m)
	}
	clear(c.idle[len(kept):])
	c.idle = kept
	return gone
}

// Close lets go of the idle mappings; a Release after it closes its
// segment. Segments opened through the cache stay open.
func (c *MapCache) Close() error {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.closed = nil, true
	c.mu.Unlock()
	return letGo(idle)
}

// take removes and returns an idle mapping of the file open as fd, whose
// fstat is st, if the cache has one whose header reads as the file's
// does; nil if not. The device and inode name a file only while it
// exists, and an idle mapping keeps its file in existence, so a mapping
// with the same identity is of the same file (its header, compared with
// the file's, cannot differ then; the check, one pread, stays as a
// guard). It lets go of idle mappings of files removed since (after
// c.mu: unmapping takes a while).
func (c *MapCache) take(fd int, st *unix.Stat_t) []byte {
	if c == nil {
		return nil
	}
	id := statID(st)
	c.mu.Lock()
	gone := c.pruneLocked()
	var mem []byte
	for i := len(c.idle) - 1; i >= 0; i-- {
		m := c.idle[i]
		if m.id != id || int64(len(m.mem)) != st.Size {
			continue
		}
		var h [HeaderSize]byte
		if n, err := unix.Pread(fd, h[:], 0); err != nil || n != HeaderSize || !bytes.Equal(h[:], m.mem[:HeaderSize]) {
			continue
		}
		c.idle = append(c.idle[:i], c.idle[i+1:]...)
		c.hits++
		mem = m.mem
		unix.Close(m.fd) // the opener's descriptor serves the segment
		break
	}
	c.mu.Unlock()
	letGo(gone)
	return mem
}

// letGo unmaps and closes idle mappings.
func letGo(idle []idleMapping) error {
	var errs []error
	for _, m := range idle {
		if err := unix.Munmap(m.mem); err != nil {
			errs = append(errs, fmt.Errorf("shm: munmap: %w", err))
		}
		if err := unix.Close(m.fd); err != nil {
			errs = append(errs, fmt.Errorf("shm: close: %w", err))
		}
	}
	return errors.Join(errs...)
}
