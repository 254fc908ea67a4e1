package memcached

import (
	"bytes"
	"math"
	"math/bits"
)

// memcached parses command lines with its own tokenizer and with the C
// library's strtol family; the functions here do the same, byte for byte,
// so that odd input (a tab in a number, "+5", flags of 2^32, a value
// with leading spaces for incr) gets memcached's answer rather than Go's.

// maxTokens is memcached's MAX_TOKENS: a line is cut into at most 23
// tokens; what follows the 23rd stays unsplit (get re-tokenizes it).
const maxTokens = 24

// tokenize splits line on spaces, as memcached's tokenize_command: it
// returns up to maxTokens-1 tokens and the rest of the line after the
// last one (nil when the whole line was split). ntokens, memcached's
// count, is len(tokens)+1: every command check counts the terminal
// token too.
func tokenize(line []byte, tokens [][]byte) ([][]byte, []byte) {
	tokens = tokens[:0]
	s := 0
	for i := 0; i < len(line); i++ {
		if line[i] != ' ' {
			continue
		}
		if i > s {
			tokens = append(tokens, line[s:i])
			if len(tokens) == maxTokens-1 {
				if i+1 < len(line) {
					return tokens, line[i+1:]
				}
				return tokens, nil
			}
		}
		s = i + 1
	}
	if s < len(line) {
		tokens = append(tokens, line[s:])
	}
	return tokens, nil
}

// trimEOL drops a line's "\n" and the "\r" before it, as memcached does
// (only when the line has something before the "\r"), then cuts it at a
// NUL byte: memcached reads the line as a C string.
func trimEOL(line []byte) []byte {
	n := len(line)
	if n > 0 && line[n-1] == '\n' {
		n--
		if n > 1 && line[n-1] == '\r' {
			n--
		}
	}
	line = line[:n]
	if i := bytes.IndexByte(line, 0); i >= 0 {
		line = line[:i]
	}
	return line
}

// cSpace is C's isspace in the C locale.
func cSpace(c byte) bool { return c == ' ' || (c >= '\t' && c <= '\r') }

// cStrtoull is strtoull(s, &end, 10): leading white space, an optional
// sign (a minus negates modulo 2^64), digits. It reports the value, the
// bytes it used (0: no number) and whether the magnitude overflowed
// (ERANGE).
func cStrtoull(s []byte) (v uint64, used int, overflow bool) {
	i := 0
	for i < len(s) && cSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	start := i
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		hi, lo := bits.Mul64(v, 10)
		lo, carry := bits.Add64(lo, uint64(s[i]-'0'), 0)
		if hi != 0 || carry != 0 {
			overflow = true
		}
		v = lo
		i++
	}
	if i == start {
		return 0, 0, false
	}
	if overflow {
		return math.MaxUint64, i, true
	}
	if neg {
		v = -v
	}
	return v, i, false
}

// cStrtoll is strtoll(s, &end, 10), with ERANGE beyond int64.
func cStrtoll(s []byte) (v int64, used int, overflow bool) {
	i := 0
	for i < len(s) && cSpace(s[i]) {
		i++
	}
	neg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	start := i
	var mag uint64
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		d := uint64(s[i] - '0')
		if mag > (math.MaxUint64-d)/10 {
			overflow = true
		} else {
			mag = mag*10 + d
		}
		i++
	}
	if i == start {
		return 0, 0, false
	}
	switch {
	case !neg && (overflow || mag > math.MaxInt64):
		return math.MaxInt64, i, true
	case neg && (overflow || mag > 1<<63):
		return math.MinInt64, i, true
	case neg:
		return -int64(mag), i, false
	}
	return int64(mag), i, false
}

// endsNumber is memcached's check after a strto* call: the number must
// be followed by white space or the end of the token.
func endsNumber(s []byte, used int) bool { return used == len(s) || cSpace(s[used]) }

// safeStrtoull is memcached's safe_strtoull.
func safeStrtoull(s []byte) (uint64, bool) {
	v, used, overflow := cStrtoull(s)
	if overflow || used == 0 || !endsNumber(s, used) {
		return 0, false
	}
	if int64(v) < 0 && bytes.IndexByte(s, '-') >= 0 {
		return 0, false
	}
	return v, true
}

// safeStrtoul is memcached's safe_strtoul: strtoul on a 64-bit unsigned
// long, then stored in 32 bits (so flags of 2^32 become 0).
func safeStrtoul(s []byte) (uint32, bool) {
	v, ok := safeStrtoull(s)
	return uint32(v), ok
}

// safeStrtol is memcached's safe_strtol: strtol on a 64-bit long, then
// stored in 32 bits (so a length of 2^32+1 becomes 1).
func safeStrtol(s []byte) (int32, bool) {
	v, used, overflow := cStrtoll(s)
	if overflow || used == 0 || !endsNumber(s, used) {
		return 0, false
	}
	return int32(v), true
}

// numericValue parses a stored value for incr and decr as memcached
// does: strtoull on the data, which is followed by "\r\n" in memcached's
// item, so a number may have white space around it.
func numericValue(v []byte) (uint64, bool) {
	n, used, overflow := cStrtoull(v)
	if overflow || used == 0 || (used < len(v) && !cSpace(v[used]) && v[used] != 0) {
		return 0, false
	}
	// strtoull stops at a NUL: memcached's negative-sign check sees the
	// value up to there.
	end := len(v)
	if i := bytes.IndexByte(v, 0); i >= 0 {
		end = i
	}
	if int64(n) < 0 && bytes.IndexByte(v[:end], '-') >= 0 {
		return 0, false
	}
	return n, true
}
