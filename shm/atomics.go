package shm

import (
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
