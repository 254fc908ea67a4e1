package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// cacheLine is the spacing between words written by different processes.
// Two lines, because adjacent-line prefetch makes neighbours share traffic.
const cacheLine = 128

// Atomic views of words in mapped memory. Callers guarantee alignment: every
// structure starts at a cacheLine-aligned offset of a page-aligned mapping.
func atomicU64(b []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b[off : off+8][0]))
}

func atomicU32(b []byte, off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b[off : off+4][0]))
}

func align8(n int) int { return (n + 7) &^ 7 }

// region returns the part of a segment's data area a structure lives in,
// checking that it fits and is aligned.
func region(seg *Segment, off, size int) ([]byte, error) {
	d := seg.Data()
	if off < 0 || off%cacheLine != 0 {
		return nil, errorf("offset %d must be a non-negative multiple of %d", off, cacheLine)
	}
	if size < 0 || off > len(d) || size > len(d)-off {
		return nil, errorf("%d bytes at offset %d do not fit in a %d-byte segment", size, off, len(d))
	}
	return d[off : off+size : off+size], nil
}

// WordIn returns the 8-byte word at off of b as an atomic, for memory
// shared with another process or a device (a ub segment's Bytes, say). The
// word must lie inside b and be 8-byte aligned in memory.
func WordIn(b []byte, off int) (*atomic.Uint64, error) {
	if off < 0 || off > len(b)-8 {
		return nil, fmt.Errorf("shm: 8-byte word at %d outside %d bytes", off, len(b))
	}
	if uintptr(unsafe.Pointer(&b[off]))%8 != 0 {
		return nil, fmt.Errorf("shm: word at %d is not 8-byte aligned", off)
	}
	return atomicU64(b, off), nil
}

// Uint64s returns n consecutive 8-byte words of the segment's data from
// off, as atomics: a table of words in shared memory indexed without a
// call per access. off must be 8-byte aligned.
func (s *Segment) Uint64s(off, n int) ([]atomic.Uint64, error) {
	d := s.Data()
	if off < 0 || n < 0 || off%8 != 0 || n > (len(d)-off)/8 {
		return nil, fmt.Errorf("shm: %d words at %d outside a segment of %d bytes", n, off, len(d))
	}
	if n == 0 {
		return nil, nil
	}
	return unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&d[off])), n), nil
}
