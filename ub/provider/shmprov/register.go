package shmprov

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

// Registered memory (RegisterSegment). Peers reach memory by mapping shm
// files, so only memory inside a named (or file-backed) shm segment
// mapped in this process can be registered. A registration is a small shm
// segment of the context's own, named like an allocated segment with kind
// "r", whose header has the token, access and state where an allocated
// segment's has them, and says where the memory is: the target segment's
// name (or file-backed segment's path), its file's identity and its ID
// (so that a segment unlinked and made again under the name is refused,
// never written), and the offset of the memory in its data area.
//
//	0  magic   u64 "UBKURRG2" (2: the layout with the in-flight word)
//	8  token   u32
//	12 access  u32
//	16 size    u64  registered bytes
//	24 state   u32  1 registered, 0 deregistered
//	28 kind    u32  1 named segment, 2 file-backed segment
//	32 dev     u64  the target's file
//	40 ino     u64
//	48 offset  u64  of the memory in the target's data area
//	56 id      u32  the target's segment ID
//	60 nameLen u32
//	64 inflight u32 importers' accesses under way (see segment.drain)
//	72 name    the target's name (kind 1) or path (kind 2)
const (
	regMagic       = 0x3247_5252_554b_4255 // "UBKURRG2"
	regHeader      = 72
	regOffInflight = 64
	regOffKind     = 28
	regOffDev      = 32
	regOffIno      = 40
	regOffOffset   = 48
	regOffID       = 56
	regOffName     = 60
	kindNamed      = 1
	kindFile       = 2
	// maxTargetLen bounds a target's name or path (PATH_MAX).
	maxTargetLen = 4096
	// maxRegSize bounds what a registration header may claim (shm's
	// largest segment).
	maxRegSize = 1 << 46
)

// registration is a registration header, decoded.
type registration struct {
	size     uint64
	kind     uint32
	dev, ino uint64
	offset   uint64
	id       uint32
	target   string // name or path
}

// encode writes everything but the magic and the state, which the caller
// stores last (the magic) and first.
func (r registration) encode(d []byte, cfg ub.SegmentConfig) {
	binary.LittleEndian.PutUint32(d[segOffToken:], uint32(cfg.Token))
	binary.LittleEndian.PutUint32(d[segOffAccess:], uint32(cfg.Access.Normalize()))
	binary.LittleEndian.PutUint64(d[segOffSize:], r.size)
	binary.LittleEndian.PutUint32(d[regOffKind:], r.kind)
	binary.LittleEndian.PutUint64(d[regOffDev:], r.dev)
	binary.LittleEndian.PutUint64(d[regOffIno:], r.ino)
	binary.LittleEndian.PutUint64(d[regOffOffset:], r.offset)
	binary.LittleEndian.PutUint32(d[regOffID:], r.id)
	binary.LittleEndian.PutUint32(d[regOffName:], uint32(len(r.target)))
	copy(d[regHeader:], r.target)
}

// decodeRegistration reads a registration header from d, the data area of
// a peer's registration segment, which that peer could have filled with
// anything: every field is checked before use.
func decodeRegistration(d []byte) (registration, error) {
	if len(d) < regHeader {
		return registration{}, fmt.Errorf("%d bytes, too small for a registration", len(d))
	}
	if binary.LittleEndian.Uint64(d) != regMagic {
		return registration{}, errors.New("not a registration (bad magic)")
	}
	r := registration{
		size:   binary.LittleEndian.Uint64(d[segOffSize:]),
		kind:   binary.LittleEndian.Uint32(d[regOffKind:]),
		dev:    binary.LittleEndian.Uint64(d[regOffDev:]),
		ino:    binary.LittleEndian.Uint64(d[regOffIno:]),
		offset: binary.LittleEndian.Uint64(d[regOffOffset:]),
		id:     binary.LittleEndian.Uint32(d[regOffID:]),
	}
	n := binary.LittleEndian.Uint32(d[regOffName:])
	switch {
	case r.kind != kindNamed && r.kind != kindFile:
		return registration{}, fmt.Errorf("registration of unknown kind %d", r.kind)
	case n == 0 || n > maxTargetLen || uint64(n) > uint64(len(d)-regHeader):
		return registration{}, fmt.Errorf("registration names a target of %d bytes in %d", n, len(d)-regHeader)
	case r.size == 0 || r.size > maxRegSize || r.offset > maxRegSize:
		return registration{}, fmt.Errorf("registration of %d bytes at offset %d", r.size, r.offset)
	}
	r.target = string(d[regHeader : regHeader+n])
	if r.kind == kindFile && (!filepath.IsAbs(r.target) || filepath.Clean(r.target) != r.target) {
		return registration{}, fmt.Errorf("registration names a file by %q, not a clean absolute path", r.target)
	}
	return r, nil
}

// RegisterSegment registers memory the caller already has: it must lie
// inside a named shm segment (shm.CreateSegment, OpenSegment,
// RepairSegment) or a file-backed one (shm.CreateFileSegment and the
// rest) that this process has mapped, since peers reach it by mapping the
// same file. Bytes is mem; Close deregisters, and never unmaps mem.
func (c *Context) RegisterSegment(mem []byte, cfg ub.SegmentConfig) (ub.Segment, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("shmprov: %w: no memory to register", ub.ErrInvalidArgument)
	}
	m, err := shm.MappingOf(mem)
	if err != nil {
		return nil, fmt.Errorf("shmprov: %w: peers reach memory by mapping shm files, so only memory inside a named or file-backed shm segment mapped in this process can be registered (allocate with AllocSegment, or make the memory with shm.CreateSegment): %w", ub.ErrInvalidArgument, err)
	}
	reg := registration{size: uint64(len(mem)), kind: kindNamed, dev: m.Dev, ino: m.Ino, offset: uint64(m.Offset), id: m.ID, target: m.Name}
	if m.Path != "" {
		reg.kind, reg.target = kindFile, m.Path
		// Importers refuse a file in a directory others could swap it
		// in (importRegistration): say so now rather than to them.
		if err := shm.CheckDir(filepath.Dir(m.Path)); err != nil {
			return nil, fmt.Errorf("shmprov: %w: importers would refuse memory in %s: %w", ub.ErrInvalidArgument, m.Path, err)
		}
	}
	if len(reg.target) > maxTargetLen {
		return nil, fmt.Errorf("shmprov: %w: the segment's path is longer than %d bytes", ub.ErrInvalidArgument, maxTargetLen)
	}
	name := c.name("r")
	s, err := shm.CreateSegment(name, regHeader+len(reg.target), nil)
	if err != nil {
		return nil, fmt.Errorf("shmprov: register segment: %w", fdlimit.Hint(err))
	}
	d := s.Data()
	reg.encode(d, cfg)
	state, _ := s.Uint32At(segOffState)
	state.Store(stateLive)
	magic, _ := s.Uint64At(0)
	magic.Store(regMagic)
	inflight, _ := s.Uint32At(regOffInflight)
	seg := &segment{c: c, shm: s, name: name, nameBytes: []byte(name), bytes: mem[:len(mem):len(mem)], state: state, inflight: inflight, registered: true}
	if err := c.track(seg); err != nil {
		s.Close()
		return nil, err
	}
	return seg, nil
}

// importRegistration maps the memory a peer registered: its registration
// segment (token, access, state, the owner's liveness) and the target
// segment, which must be the very file that was registered.
func (c *Context) importRegistration(desc ub.SegmentDesc, token ub.Token) (ub.RemoteSegment, error) {
	rs, err := openPeerObject(desc.Name, "r")
	if err != nil {
		return nil, err
	}
	reg, err := decodeRegistration(rs.Data())
	if err != nil {
		rs.Close()
		return nil, fmt.Errorf("shmprov: %w: %s: %w", ub.ErrBadDescriptor, desc.Name, err)
	}
	var target *shm.Segment
	if reg.kind == kindNamed {
		target, err = shm.OpenSegment(reg.target)
	} else {
		// The file's directory must be this user's and closed to
		// others, as CreateFileSegment requires, so that nobody else
		// could have put or swapped the file there.
		if err := shm.CheckDir(filepath.Dir(reg.target)); err != nil {
			rs.Close()
			return nil, fmt.Errorf("shmprov: %w: %s registers memory in %s, refused: %w", ub.ErrBadDescriptor, desc.Name, reg.target, err)
		}
		target, err = shm.OpenFileSegment(reg.target)
	}
	if err != nil {
		rs.Close()
		switch _, outOfFDs := fdlimit.Errno(err); {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, shm.ErrCorrupt):
			return nil, fmt.Errorf("shmprov: %w: %s registers memory in %s, which is gone (unlinked since; importers that mapped it before keep their mapping): %w", ub.ErrBadDescriptor, desc.Name, reg.target, err)
		case outOfFDs:
			return nil, fmt.Errorf("shmprov: import %s: open its memory's segment %s: %w", desc.Name, reg.target, fdlimit.Hint(err))
		}
		// A name shm would never make, a file not this user's: nothing
		// a registrant of this user could have registered.
		return nil, fmt.Errorf("shmprov: %w: %s registers memory in %s, which cannot be opened: %w", ub.ErrBadDescriptor, desc.Name, reg.target, err)
	}
	fail := func(why string) (ub.RemoteSegment, error) {
		target.Close()
		rs.Close()
		return nil, fmt.Errorf("shmprov: %w: %s registers memory in %s, %s", ub.ErrBadDescriptor, desc.Name, reg.target, why)
	}
	m, err := shm.MappingOf(target.Data())
	switch {
	case err != nil:
		return fail(err.Error())
	case m.Dev != reg.dev || m.Ino != reg.ino || m.ID != reg.id:
		return fail("but that name is another segment now (unlinked and made again since it was registered): refused")
	case reg.offset > uint64(m.Size) || reg.size > uint64(m.Size)-reg.offset:
		return fail(fmt.Sprintf("%d bytes at %d, beyond its %d-byte data area", reg.size, reg.offset, m.Size))
	}
	end := int(reg.offset + reg.size)
	state, _ := rs.Uint32At(segOffState)
	inflight, _ := rs.Uint32At(regOffInflight)
	r := &remoteSegment{peerSeg: peerSeg{seg: rs}, c: c, desc: desc, token: token, size: int(reg.size),
		target: target, mem: target.Data()[reg.offset:end:end], state: state, inflight: inflight}
	if err := c.track(r); err != nil {
		target.Close()
		rs.Close()
		return nil, err
	}
	return r, nil
}
