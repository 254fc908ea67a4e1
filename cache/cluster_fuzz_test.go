package cache

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzClusterWire: requests and responses from a hostile node give errors,
// never panics or allocations beyond the wire limits.
func FuzzClusterWire(f *testing.F) {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	writeRequest(w, request{op: opSet, key: []byte("k"), val: []byte("v")})
	f.Add(buf.Bytes())
	buf.Reset()
	writeResponse(w, nil, Info{Version: 3}, []byte("value"))
	f.Add(buf.Bytes())
	f.Add([]byte{opGet, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		if r, err := readRequest(bufio.NewReader(bytes.NewReader(in))); err == nil {
			if len(r.key) > 1<<20 || r.op < opGet || r.op > opDelete {
				t.Fatalf("accepted %+v", r)
			}
		}
		if r, err := readResponse(bufio.NewReader(bytes.NewReader(in))); err == nil && len(r.val) > maxWire {
			t.Fatal("a response beyond the limit")
		}
	})
}
