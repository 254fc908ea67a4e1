package shmprov

import (
	"testing"

	"github.com/ubkit-io/ubkit/ub"
)

// FuzzDecode feeds arbitrary slot contents, as a hostile peer could leave
// them in a jetty's rings, to the decoders: errors, never panics, and no
// name or length outside its bounds.
func FuzzDecode(f *testing.F) {
	slot := make([]byte, recvSlotSize)
	postedRecv{name: []byte("ub-x-s1"), off: 128, len: 64, userCtx: 7}.encode(slot)
	f.Add(slot)
	c := make([]byte, complSlotSize)
	encodeCompletion(c, ub.Completion{Status: ub.StatusSuccess, Op: ub.OpRecv, Len: 5, HasImm: true, Imm: 9})
	f.Add(c)
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRecv(b); err == nil && (len(r.name) == 0 || len(r.name) > maxNameLen) {
			t.Fatalf("accepted a name of %d bytes", len(r.name))
		}
		if c, err := decodeCompletion(b); err == nil && (c.Len < 0 || c.Len > 1<<40) {
			t.Fatalf("accepted length %d", c.Len)
		}
	})
}
