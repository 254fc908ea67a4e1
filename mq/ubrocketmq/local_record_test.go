package ubrocketmq

import (
	"bytes"
	"reflect"
	"testing"
)

func encodeLocal(r localRecord) []byte {
	b := make([]byte, r.size())
	r.encode(b)
	return b
}

func TestLocalRecord(t *testing.T) {
	r := localRecord{props: map[string]string{"TAGS": "a", "KEYS": "k", "": "e"}, born: 5, flag: -3, body: []byte("body")}
	b := encodeLocal(r)
	got, err := decodeLocal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
	// Every cut inside the properties fails (a cut in the body is a
	// shorter body).
	for i := range localFixed + 8*3 + 4 + 4 + 2 {
		if _, err := decodeLocal(b[:i]); err == nil {
			t.Fatalf("a record cut at %d of %d bytes decoded", i, len(b))
		}
	}
	bad := bytes.Clone(b)
	bad[20] = 1
	if _, err := decodeLocal(bad); err == nil {
		t.Fatal("reserved bits accepted")
	}
}

// FuzzLocalRecord: any bytes decode or fail without panicking; what
// decodes re-encodes to the same bytes.
func FuzzLocalRecord(f *testing.F) {
	f.Add(encodeLocal(localRecord{body: []byte("x")}))
	f.Add(encodeLocal(localRecord{props: map[string]string{"a": "1", "b": "2"}, body: make([]byte, 100)}))
	f.Add([]byte{})
	f.Add(make([]byte, localFixed))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeLocal(b)
		if err != nil {
			return
		}
		if again := encodeLocal(r); !bytes.Equal(again, b) {
			t.Fatalf("decoded %q, re-encoded %q", b, again)
		}
	})
}
