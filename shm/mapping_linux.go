//go:build linux

package shm

import (
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// liveMapping is a named or file-backed segment mapped in this process:
// the address range of its whole mapping, header included.
type liveMapping struct {
	start, end uintptr
	seg        *Segment
	id         fileID
	segID      uint32 // Segment.ID, read once: the header never changes it
}

// mappings is the process-wide table MappingOf searches, sorted by start.
// A segment enters it when a public constructor returns it and leaves it
// in Close before it is unmapped, so a lookup never finds memory that is
// gone, and mappings never overlap.
var mappings struct {
	mu   sync.RWMutex
	live []liveMapping
}

// publish enters a named or file-backed segment in the mappings table;
// memfd segments, which have no name to open, stay out. It is idempotent
// (RepairSegment returns what OpenSegment or CreateSegment made).
func (s *Segment) publish() {
	if s.file == "" && s.path == "" {
		return
	}
	var st unix.Stat_t
	if unix.Fstat(s.fd, &st) != nil {
		// Cannot happen on a descriptor we hold; without an identity
		// the segment is only not registrable.
		return
	}
	m := liveMapping{start: uintptr(unsafe.Pointer(&s.mem[0])), seg: s, id: statID(&st), segID: s.ID()}
	m.end = m.start + uintptr(len(s.mem))
	mappings.mu.Lock()
	defer mappings.mu.Unlock()
	i, found := slices.BinarySearchFunc(mappings.live, m.start, func(l liveMapping, start uintptr) int {
		return cmpUintptr(l.start, start)
	})
	if found {
		return
	}
	mappings.live = slices.Insert(mappings.live, i, m)
}

// unpublish takes the segment out of the mappings table (before Close
// unmaps it).
func (s *Segment) unpublish() {
	if len(s.mem) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(&s.mem[0]))
	mappings.mu.Lock()
	defer mappings.mu.Unlock()
	i, found := slices.BinarySearchFunc(mappings.live, start, func(l liveMapping, start uintptr) int {
		return cmpUintptr(l.start, start)
	})
	if found && mappings.live[i].seg == s {
		mappings.live = slices.Delete(mappings.live, i, i+1)
	}
}

func cmpUintptr(a, b uintptr) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// published returns s, entered in the mappings table, and err: the
// public constructors end with it.
func published(s *Segment, err error) (*Segment, error) {
	if err == nil && s != nil {
		s.publish()
	}
	return s, err
}

// MappingOf says which named or file-backed segment mapped in this
// process holds b, all of it inside the segment's data area, and where:
// what a peer needs to map the same memory (OpenSegment or
// OpenFileSegment, then a check that Dev, Ino and ID match). Memory that
// is not so (a Go slice, a memfd segment's, a header's, or memory
// reaching past a segment's end) is ErrNotInSegment, and so is empty b.
// The answer holds while the segment stays open: a segment closed and
// unmapped is no longer found.
func MappingOf(b []byte) (Mapping, error) {
	if len(b) == 0 {
		return Mapping{}, fmt.Errorf("%w (no bytes given)", ErrNotInSegment)
	}
	start := uintptr(unsafe.Pointer(&b[0]))
	end := start + uintptr(len(b))
	mappings.mu.RLock()
	defer mappings.mu.RUnlock()
	// The last mapping that starts at or before b.
	i, found := slices.BinarySearchFunc(mappings.live, start, func(l liveMapping, start uintptr) int {
		return cmpUintptr(l.start, start)
	})
	if !found {
		i--
	}
	if i < 0 || start >= mappings.live[i].end {
		return Mapping{}, ErrNotInSegment
	}
	m := mappings.live[i]
	data := m.start + HeaderSize
	switch {
	case start < data:
		return Mapping{}, fmt.Errorf("%w (it starts in the header of segment %s, before its data)", ErrNotInSegment, m.seg.name)
	case end > m.end || end < start:
		return Mapping{}, fmt.Errorf("%w (%d bytes from offset %d run past the end of segment %s's %d-byte data area)", ErrNotInSegment, len(b), start-data, m.seg.name, m.seg.Size())
	}
	return Mapping{Name: m.seg.mappedName(), Path: m.seg.path, Dev: m.id.dev, Ino: m.id.ino,
		ID: m.segID, Offset: int(start - data), Size: m.seg.Size()}, nil
}

// mappedName is the name OpenSegment takes for the segment, or "" for a
// file-backed one (OpenFileSegment takes its path).
func (s *Segment) mappedName() string {
	if s.path != "" {
		return ""
	}
	return s.name
}
