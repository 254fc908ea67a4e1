//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzSPSCRecords decodes a ring whose data area and tail come from the
// fuzzer, as a hostile producer could leave them: the consumer must return
// records that lie inside the ring, or errors, and never panic.
func FuzzSPSCRecords(f *testing.F) {
	f.Add([]byte{8, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}, uint64(16))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, uint64(64))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40), uint64(8))
	seg, err := CreateMemfd("fuzz-spsc", SPSCSize(256), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { seg.Close() })
	f.Fuzz(func(t *testing.T, data []byte, tail uint64) {
		r, err := CreateSPSC(seg, 0, 256)
		if err != nil {
			t.Fatal(err)
		}
		copy(r.data, data)
		r.tail.Store(tail)
		c, err := r.Consumer(Wait{})
		if err != nil {
			t.Fatal(err)
		}
		total := 0
		for range 100 {
			b, err := c.Next()
			if err != nil {
				if err != ErrRingEmpty && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("unexpected error %v", err)
				}
				break
			}
			total += len(b)
			if total > 256 {
				t.Fatalf("read %d bytes of records from a 256-byte ring", total)
			}
		}
		c.Close()
	})
}

// FuzzHandle decodes handles from the fuzzer and uses them on a real pool:
// a handle that was never loaned must be refused, not dereferenced.
func FuzzHandle(f *testing.F) {
	f.Add(make([]byte, HandleSize))
	f.Add([]byte("0123456789abcdef"))
	size, _ := PoolSize(testPoolConfig)
	seg, err := CreateMemfd("fuzz-handle", size, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { seg.Close() })
	p, err := CreatePool(seg, 0, testPoolConfig)
	if err != nil {
		f.Fatal(err)
	}
	held, err := p.Loan(64)
	if err != nil {
		f.Fatal(err)
	}
	enc, _ := held.Handle().MarshalBinary()
	f.Add(enc)
	f.Fuzz(func(t *testing.T, data []byte) {
		var h Handle
		if err := h.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrInvalidHandle) {
				t.Fatalf("decode error %v does not wrap ErrInvalidHandle", err)
			}
			return
		}
		again, _ := h.MarshalBinary()
		if string(again) != string(data) {
			t.Fatalf("round trip changed %x to %x", data, again)
		}
		b, err := p.Resolve(h)
		if err != nil {
			return
		}
		if h != held.Handle() {
			t.Fatalf("resolved %v, which was never loaned", h)
		}
		_ = b.Bytes()[len(b.Bytes())-1]
	})
}

// FuzzOpenPool opens a pool whose header comes from the fuzzer.
func FuzzOpenPool(f *testing.F) {
	size, _ := PoolSize(testPoolConfig)
	seg, err := CreateMemfd("fuzz-pool", size, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { seg.Close() })
	p, _ := CreatePool(seg, 0, testPoolConfig)
	f.Add(append([]byte(nil), p.mem[:poolClassTable+3*cacheLine]...))
	f.Fuzz(func(t *testing.T, hdr []byte) {
		CreatePool(seg, 0, testPoolConfig)
		copy(seg.Data(), hdr)
		q, err := OpenPool(seg, 0)
		if err != nil {
			return
		}
		for range 4 {
			b, err := q.Loan(100)
			if err != nil {
				return
			}
			clear(b.Bytes())
			if err := b.Return(); err != nil {
				return
			}
		}
	})
}
