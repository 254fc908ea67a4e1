package shmprov

import (
	"encoding/binary"
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

// FuzzDecodeRegistration feeds arbitrary registration headers, as a
// hostile or broken registrant could leave them in its registration
// segment, to their decoder: errors, never panics, and nothing it accepts
// is out of its bounds.
func FuzzDecodeRegistration(f *testing.F) {
	for _, r := range []registration{
		{size: 4096, kind: kindNamed, dev: 1, ino: 2, offset: 128, id: 3, target: "some-segment"},
		{size: 1, kind: kindFile, offset: 0, target: "/var/lib/ubkit/seg"},
	} {
		d := make([]byte, regHeader+len(r.target))
		r.encode(d, ub.SegmentConfig{Access: ub.AccessWrite, Token: 9})
		binary.LittleEndian.PutUint64(d, regMagic)
		f.Add(d)
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		r, err := decodeRegistration(d)
		if err != nil {
			return
		}
		switch {
		case r.kind != kindNamed && r.kind != kindFile:
			t.Fatalf("accepted kind %d", r.kind)
		case len(r.target) == 0 || len(r.target) > maxTargetLen || len(r.target) > len(d)-regHeader:
			t.Fatalf("accepted a target of %d bytes in %d", len(r.target), len(d))
		case r.size == 0 || r.size > maxRegSize || r.offset > maxRegSize:
			t.Fatalf("accepted %d bytes at %d", r.size, r.offset)
		}
	})
}
