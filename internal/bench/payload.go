package bench

import "encoding/binary"

// Fill writes every byte of b from seed, 8 bytes at a time: the work of
// producing a payload, done the same way by every contender.
func Fill(b []byte, seed uint64) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], seed+uint64(i))
	}
	for ; i < len(b); i++ {
		b[i] = byte(seed)
	}
}

// Sum reads every byte of b into a checksum: the work of consuming a
// payload, done the same way by every contender.
func Sum(b []byte) uint64 {
	var s0, s1 uint64
	i := 0
	for ; i+16 <= len(b); i += 16 {
		s0 += binary.LittleEndian.Uint64(b[i:])
		s1 += binary.LittleEndian.Uint64(b[i+8:])
	}
	for ; i < len(b); i++ {
		s0 += uint64(b[i])
	}
	return s0 + s1
}
