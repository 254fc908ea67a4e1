package bench

import "encoding/binary"

// Fill writes every byte of b: the little-endian words seed, seed+1, ...,
// then seed's low byte into any tail shorter than a word. It is the work of
// producing a payload, done the same way by every contender (the shmipc-go
// baseline program writes the same pattern).
func Fill(b []byte, seed uint64) {
	for len(b) >= 32 {
		binary.LittleEndian.PutUint64(b[0:8], seed)
		binary.LittleEndian.PutUint64(b[8:16], seed+1)
		binary.LittleEndian.PutUint64(b[16:24], seed+2)
		binary.LittleEndian.PutUint64(b[24:32], seed+3)
		seed += 4
		b = b[32:]
	}
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, seed)
		seed++
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(seed)
	}
}

// FillSum is Sum of a buffer of n bytes written by Fill(b, seed), computed
// without touching memory: a sender uses it to know what the receiver must
// report.
func FillSum(n int, seed uint64) uint64 {
	k := uint64(n / 8)
	s := k*seed + k*(k-1)/2
	for range n % 8 {
		s += uint64(byte(seed + k))
	}
	return s
}

// Sum reads every byte of b into a checksum (the sum of its little-endian
// words plus its tail bytes): the work of consuming a payload, done the same
// way by every contender.
func Sum(b []byte) uint64 {
	var s0, s1, s2, s3 uint64
	for len(b) >= 32 {
		s0 += binary.LittleEndian.Uint64(b[0:8])
		s1 += binary.LittleEndian.Uint64(b[8:16])
		s2 += binary.LittleEndian.Uint64(b[16:24])
		s3 += binary.LittleEndian.Uint64(b[24:32])
		b = b[32:]
	}
	for len(b) >= 8 {
		s0 += binary.LittleEndian.Uint64(b)
		b = b[8:]
	}
	for _, c := range b {
		s1 += uint64(c)
	}
	return s0 + s1 + s2 + s3
}

// FillSums is the sum of FillSum(n, seed) for seed = first, first+1, ...,
// first+count-1, in closed form: what a receiver of count messages must
// report.
func FillSums(n int, first, count uint64) uint64 {
	k := uint64(n / 8)
	s := k*(count*first+count*(count-1)/2) + count*(k*(k-1)/2)
	for j := range count {
		for range n % 8 {
			s += uint64(byte(first + j + k))
		}
		if n%8 == 0 {
			break
		}
	}
	return s
}

// Summer computes Sum of a payload that arrives in pieces of any sizes.
type Summer struct {
	sum  uint64
	tail [8]byte
	nt   int
}

// Write adds the next piece.
func (s *Summer) Write(b []byte) {
	if s.nt > 0 {
		k := copy(s.tail[s.nt:], b)
		s.nt += k
		b = b[k:]
		if s.nt < 8 {
			return
		}
		s.sum += binary.LittleEndian.Uint64(s.tail[:])
		s.nt = 0
	}
	whole := len(b) &^ 7
	s.sum += Sum(b[:whole])
	s.nt = copy(s.tail[:], b[whole:])
}

// Sum returns Sum of everything written.
func (s *Summer) Sum() uint64 {
	sum := s.sum
	for _, c := range s.tail[:s.nt] {
		sum += uint64(c)
	}
	return sum
}
