package offload

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func sampleRef() Ref {
	return Ref{Log: "results-1", Partition: 3, Offset: 4096, Length: 1 << 20, CRC: 0xdeadbeef, Fetch: "ub://n1/mq-offload"}
}

func TestRefRoundTrip(t *testing.T) {
	for _, r := range []Ref{sampleRef(), {Log: "a", Length: 1}, {Log: strings.Repeat("x", 255), Partition: 255, Offset: 1 << 60, Length: ^uint32(0), Fetch: "ub:///" + strings.Repeat("s", 249)}} {
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		if !IsRef(b) {
			t.Fatalf("%v: not IsRef", r)
		}
		got, err := ParseRef(b)
		if err != nil || got != r {
			t.Fatalf("%v: parsed %v, %v", r, got, err)
		}
	}
}

// TestRefInvalid: every field ParseRef checks, checked.
func TestRefInvalid(t *testing.T) {
	good, _ := sampleRef().MarshalBinary()
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for name, b := range map[string][]byte{
		"empty":     nil,
		"short":     good[:refFixed-1],
		"magic":     edit(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":   edit(func(b []byte) []byte { b[4] = 2; return b }),
		"flags":     edit(func(b []byte) []byte { b[5] = 1; return b }),
		"offset":    edit(func(b []byte) []byte { b[8] |= 1; return b }),
		"length 0":  edit(func(b []byte) []byte { copy(b[16:20], []byte{0, 0, 0, 0}); return b }),
		"trailing":  append(bytes.Clone(good), 0),
		"truncated": good[:len(good)-1],
		"name len":  edit(func(b []byte) []byte { b[24]++; return b }),
		"no name":   edit(func(b []byte) []byte { b[25] += b[24]; b[24] = 0; return b }),
		"name char": edit(func(b []byte) []byte { b[refFixed] = '/'; return b }),
		"fetch":     edit(func(b []byte) []byte { b[refFixed+int(b[24])] = 'x'; return b }),
		"partition": edit(func(b []byte) []byte { b[7] = 1; return b }),
	} {
		if _, err := ParseRef(b); !errors.Is(err, ErrBadRef) {
			t.Errorf("%s: %v, want ErrBadRef", name, err)
		}
	}
	for _, r := range []Ref{{Log: "", Length: 1}, {Log: "a/b", Length: 1}, {Log: "a", Length: 1, Partition: -1}, {Log: "a", Length: 1, Fetch: "tcp://x"}} {
		if _, err := r.MarshalBinary(); !errors.Is(err, ErrBadRef) {
			t.Errorf("%v encoded: %v", r, err)
		}
	}
}

// FuzzParseRef: whatever the bytes, a reference or ErrBadRef, and a
// reference encodes back to the same bytes.
func FuzzParseRef(f *testing.F) {
	good, _ := sampleRef().MarshalBinary()
	f.Add(good)
	f.Add(good[:refFixed])
	f.Add([]byte("UBOF"))
	min, _ := Ref{Log: "a", Length: 1}.MarshalBinary()
	f.Add(min)
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRef(b)
		if err != nil {
			if !errors.Is(err, ErrBadRef) {
				t.Fatalf("an error that is not ErrBadRef: %v", err)
			}
			return
		}
		again, err := r.MarshalBinary()
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("%v re-encodes to %x (%v), was %x", r, again, err, b)
		}
	})
}
