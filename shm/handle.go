package shm

import (
	"encoding/binary"
	"fmt"
)

// HandleSize is the length of an encoded Handle.
const HandleSize = 16

// Handle names a pool buffer across processes: the segment it lives in, its
// offset in that segment's data area, and the generation of the allocation.
// A handle whose buffer was returned and reused is refused as stale.
type Handle struct {
	Segment uint32
	Gen     uint32
	Offset  uint64
}

// AppendBinary appends the 16-byte little-endian encoding of h to b.
func (h Handle) AppendBinary(b []byte) ([]byte, error) {
	b = binary.LittleEndian.AppendUint32(b, h.Segment)
	b = binary.LittleEndian.AppendUint32(b, h.Gen)
	return binary.LittleEndian.AppendUint64(b, h.Offset), nil
}

// MarshalBinary returns the 16-byte encoding of h.
func (h Handle) MarshalBinary() ([]byte, error) { return h.AppendBinary(make([]byte, 0, HandleSize)) }

// UnmarshalBinary decodes a handle encoded by MarshalBinary. It checks only
// the shape; Pool.Resolve checks that the handle names a live buffer.
func (h *Handle) UnmarshalBinary(b []byte) error {
	if len(b) != HandleSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrInvalidHandle, len(b), HandleSize)
	}
	d := Handle{
		Segment: binary.LittleEndian.Uint32(b),
		Gen:     binary.LittleEndian.Uint32(b[4:]),
		Offset:  binary.LittleEndian.Uint64(b[8:]),
	}
	if d.Segment == 0 || d.Gen == 0 {
		return fmt.Errorf("%w: zero segment or generation", ErrInvalidHandle)
	}
	*h = d
	return nil
}

func (h Handle) String() string {
	return fmt.Sprintf("shm.Handle{seg:%08x off:%d gen:%d}", h.Segment, h.Offset, h.Gen)
}
