package shmprov

import (
	"encoding/binary"
	"fmt"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// Segment header, at the start of the shm data area of a registered segment:
//
//	0  magic  u64 "UBKUBSEG"
//	8  token  u32
//	12 access u32
//	16 size   u64  registered bytes, which follow the header
//	24 state  u32  1 registered, 0 deregistered
const (
	segMagic      = 0x4745_5342_554b_4255 // "UBKUBSEG"
	segHeader     = 128
	segOffToken   = 8
	segOffAccess  = 12
	segOffSize    = 16
	segOffState   = 24
	stateLive     = 1
	stateDead     = 0
	maxNameLen    = 96
	recvSlotSize  = 128 // posted receive: name len u8, name, offset u64, len u32, ctx u64
	complSlotSize = 48
)

// Jetty header, at the start of the shm data area of a jetty segment,
// followed by the posted-receive ring and the receive-completion ring:
//
//	0  magic      u64 "UBKUBJTY"
//	8  token      u32
//	12 mode       u32
//	16 maxMessage u32
//	20 recvDepth  u32
//	24 state      u32
const (
	jettyMagic       = 0x5954_4a42_554b_4255 // "UBKUBJTY"
	jettyHeader      = 128
	jettyOffToken    = 8
	jettyOffMode     = 12
	jettyOffMaxMsg   = 16
	jettyOffDepth    = 20
	jettyOffState    = 24
	defaultRecvDepth = 64
	defaultMaxMsg    = 64 << 10
)

func jettyLayout(depth int) (recvOff, complOff, size int) {
	recvOff = jettyHeader
	complOff = recvOff + align(shm.MPMCSize(depth, recvSlotSize))
	size = complOff + align(shm.MPMCSize(2*depth, complSlotSize))
	return
}

func align(n int) int { return (n + 127) &^ 127 }

// postedRecv is a receive buffer as the sender reads it from shared memory.
// A decoded name is the bytes of the slot it was decoded from (the
// caller's private copy, popped out of shared memory), valid until the
// slot is reused: a string per receive was an allocation per packet.
type postedRecv struct {
	name    []byte
	off     uint64
	len     uint32
	userCtx uint64
}

func (r postedRecv) encode(b []byte) {
	b[0] = byte(len(r.name))
	copy(b[1:1+maxNameLen], r.name)
	binary.LittleEndian.PutUint64(b[100:], r.off)
	binary.LittleEndian.PutUint32(b[108:], r.len)
	binary.LittleEndian.PutUint64(b[112:], r.userCtx)
}

func decodeRecv(b []byte) (postedRecv, error) {
	if len(b) < recvSlotSize {
		return postedRecv{}, fmt.Errorf("posted receive of %d bytes", len(b))
	}
	n := int(b[0])
	if n == 0 || n > maxNameLen {
		return postedRecv{}, fmt.Errorf("posted receive names a segment of %d bytes", n)
	}
	return postedRecv{
		name:    b[1 : 1+n : 1+n],
		off:     binary.LittleEndian.Uint64(b[100:]),
		len:     binary.LittleEndian.Uint32(b[108:]),
		userCtx: binary.LittleEndian.Uint64(b[112:]),
	}, nil
}

func encodeCompletion(b []byte, c ub.Completion) {
	b[0] = byte(c.Status)
	b[1] = byte(c.Op)
	if c.HasImm {
		b[2] = 1
	}
	binary.LittleEndian.PutUint64(b[8:], c.UserCtx)
	binary.LittleEndian.PutUint64(b[16:], uint64(c.Len))
	binary.LittleEndian.PutUint64(b[24:], c.Imm)
	binary.LittleEndian.PutUint64(b[32:], c.Value)
}

func decodeCompletion(b []byte) (ub.Completion, error) {
	if len(b) < 40 {
		return ub.Completion{}, fmt.Errorf("completion of %d bytes", len(b))
	}
	c := ub.Completion{
		Status:  ub.Status(b[0]),
		Op:      ub.Opcode(b[1]),
		HasImm:  b[2] == 1,
		UserCtx: binary.LittleEndian.Uint64(b[8:]),
		Imm:     binary.LittleEndian.Uint64(b[24:]),
		Value:   binary.LittleEndian.Uint64(b[32:]),
	}
	n := binary.LittleEndian.Uint64(b[16:])
	if n > 1<<40 {
		return ub.Completion{}, fmt.Errorf("completion length %d", n)
	}
	// Peers push only receive-side completions, with a known status.
	if (c.Op != ub.OpRecv && c.Op != ub.OpWriteImm) || c.Status > ub.StatusMisaligned {
		return ub.Completion{}, fmt.Errorf("completion with op %v and status %d", c.Op, c.Status)
	}
	c.Len = int(n)
	return c, nil
}
