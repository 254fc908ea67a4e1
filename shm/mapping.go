package shm

import "errors"

// Mapping says where memory lies in a segment this process has mapped by
// name (CreateSegment, OpenSegment, RepairSegment) or by path
// (CreateFileSegment, OpenFileSegment, RepairFileSegment): what another
// process needs to map the same memory, and to be sure that what it
// mapped is that segment and not one made under the name since.
type Mapping struct {
	// Name is the segment's name as OpenSegment takes it; empty for a
	// file-backed segment.
	Name string
	// Path is a file-backed segment's file as OpenFileSegment takes it,
	// absolute and clean (filepath.Abs of the path it was made or opened
	// by, in the working directory of then); empty for a segment in
	// ShmDir.
	Path string
	// Dev and Ino identify the segment's file (stat(2)'s st_dev and
	// st_ino): a file made under the same name later is another file.
	Dev, Ino uint64
	// ID is the segment's random identifier (Segment.ID), a second check
	// that survives the reuse of an inode number.
	ID uint32
	// Offset is where the memory starts in the segment's data area
	// (Segment.Data), and Size is the length of that data area.
	Offset, Size int
}

// ErrNotInSegment is the error of MappingOf for memory that is not inside
// the data area of a named or file-backed segment this process has
// mapped: a Go slice, a memfd segment, a segment's header, or memory that
// runs past the end of a segment.
var ErrNotInSegment = errors.New("shm: memory is not inside a named segment mapped by this process")
