package mq

import (
	"encoding/binary"

	"github.com/ubkit-io/ubkit/ub"
)

// The replication handshake, over the control connection Replicate and
// Follow are given, in the frames of wire.go:
//
//	offer   (6), leader to follower: magic u32 "uMQ2" | version u8 |
//	        partition u32 | segment size u64 | base u64 |
//	        segments kept u32 (the leader's Config.Segments) |
//	        ack segment (a segment desc) | ack token u32 |
//	        jetty (a jetty desc) | jetty token u32
//	accept  (7), follower to leader: bell segment | bell token u32 |
//	        jetty | jetty token u32
//	segment (8), follower to leader, after the accept, any number:
//	        index u64 | segment (a segment desc) | token u32: the
//	        follower's segment index of the partition, registered for
//	        the leader's writes
//	error   (5), either way, as in wire.go
//
// A segment desc is provider (u8 length, bytes) | EID (16 bytes) | name
// (u16 length, bytes) | size u64; a jetty desc the same without the size.
// After the handshake the records move over ub (see replica.go), and the
// control connection carries the follower's segments and the end: the
// side that ends replication writes an error frame with its reason
// (ErrDiverged, shm.ErrCorrupt, ErrProtocol, ErrReplicaDown,
// ErrClosed...) and closes it. Any other frame is ErrProtocol. (The
// magic was "uMQF" for the ring protocol before: the two refuse each
// other's offer.)
const (
	replMagic    = 0x32514d75 // "uMQ2"
	frameOffer   = 6
	frameAccept  = 7
	frameSegment = 8
	maxDescName  = 1024
	// maxOfferSegments bounds the retention a leader may claim.
	maxOfferSegments = 1 << 16
)

type offer struct {
	partition uint32
	segSize   uint64
	base      uint64
	segments  uint32 // the leader's retention, in segments
	ackSeg    ub.SegmentDesc
	ackToken  ub.Token
	jetty     ub.JettyDesc
	jtToken   ub.Token
}

type accept struct {
	bell      ub.SegmentDesc // where the leader's doorbells and heartbeats land
	bellToken ub.Token
	jetty     ub.JettyDesc
	jtToken   ub.Token
}

// segmentFrame announces a follower segment the leader may write.
type segmentFrame struct {
	index uint64
	seg   ub.SegmentDesc
	token ub.Token
}

func appendDesc(b []byte, provider string, eid ub.EID, name string) []byte {
	b = append(b, byte(len(provider)))
	b = append(b, provider...)
	b = append(b, eid[:]...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// wireReader takes fields off a body, remembering the first shortfall.
type wireReader struct {
	b   []byte
	err error
}

func (r *wireReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = protoErr("a field of %d bytes with %d left", n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *wireReader) u8() byte {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *wireReader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *wireReader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *wireReader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *wireReader) desc() (provider string, eid ub.EID, name string) {
	provider = string(r.take(int(r.u8())))
	copy(eid[:], r.take(16))
	n := int(r.u16())
	if n > maxDescName && r.err == nil {
		r.err = protoErr("a descriptor name of %d bytes", n)
	}
	name = string(r.take(n))
	if r.err == nil && (provider == "" || name == "") {
		r.err = protoErr("a descriptor without a provider or name")
	}
	return provider, eid, name
}

func (r *wireReader) segDesc() ub.SegmentDesc {
	p, e, n := r.desc()
	size := r.u64()
	if r.err == nil && (size == 0 || size > 1<<40) {
		r.err = protoErr("a segment of %d bytes", size)
	}
	return ub.SegmentDesc{Provider: p, EID: e, Name: n, Size: int(size)}
}

func (r *wireReader) jettyDesc() ub.JettyDesc {
	p, e, n := r.desc()
	return ub.JettyDesc{Provider: p, EID: e, Name: n}
}

func (r *wireReader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = protoErr("%d bytes after the last field", len(r.b))
	}
	return r.err
}

func appendOffer(b []byte, o offer) []byte {
	at := len(b)
	b = frameStart(b, frameOffer)
	b = binary.LittleEndian.AppendUint32(b, replMagic)
	b = append(b, wireVersion)
	b = binary.LittleEndian.AppendUint32(b, o.partition)
	b = binary.LittleEndian.AppendUint64(b, o.segSize)
	b = binary.LittleEndian.AppendUint64(b, o.base)
	b = binary.LittleEndian.AppendUint32(b, o.segments)
	b = appendDesc(b, o.ackSeg.Provider, o.ackSeg.EID, o.ackSeg.Name)
	b = binary.LittleEndian.AppendUint64(b, uint64(o.ackSeg.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(o.ackToken))
	b = appendDesc(b, o.jetty.Provider, o.jetty.EID, o.jetty.Name)
	b = binary.LittleEndian.AppendUint32(b, uint32(o.jtToken))
	return frameEnd(b, at)
}

func decodeOffer(body []byte) (offer, error) {
	r := &wireReader{b: body}
	if m := r.u32(); r.err == nil && m != replMagic {
		return offer{}, protoErr("offer magic %#x", m)
	}
	if v := r.u8(); r.err == nil && v != wireVersion {
		return offer{}, protoErr("wire version %d, want %d", v, wireVersion)
	}
	o := offer{partition: r.u32(), segSize: r.u64(), base: r.u64(), segments: r.u32()}
	o.ackSeg = r.segDesc()
	o.ackToken = ub.Token(r.u32())
	o.jetty = r.jettyDesc()
	o.jtToken = ub.Token(r.u32())
	if err := r.end(); err != nil {
		return offer{}, err
	}
	if o.segSize < 4096 || o.segSize > maxLen || o.segSize%8 != 0 || o.base%o.segSize != 0 || o.ackSeg.Size < 16 ||
		o.segments < 2 || o.segments > maxOfferSegments {
		return offer{}, protoErr("offer of %d segments of %d bytes from %d, an ack segment of %d", o.segments, o.segSize, o.base, o.ackSeg.Size)
	}
	return o, nil
}

func appendAccept(b []byte, a accept) []byte {
	at := len(b)
	b = frameStart(b, frameAccept)
	b = appendDesc(b, a.bell.Provider, a.bell.EID, a.bell.Name)
	b = binary.LittleEndian.AppendUint64(b, uint64(a.bell.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(a.bellToken))
	b = appendDesc(b, a.jetty.Provider, a.jetty.EID, a.jetty.Name)
	b = binary.LittleEndian.AppendUint32(b, uint32(a.jtToken))
	return frameEnd(b, at)
}

func decodeAccept(body []byte) (accept, error) {
	r := &wireReader{b: body}
	a := accept{bell: r.segDesc()}
	a.bellToken = ub.Token(r.u32())
	a.jetty = r.jettyDesc()
	a.jtToken = ub.Token(r.u32())
	if err := r.end(); err != nil {
		return accept{}, err
	}
	if a.bell.Size < 8 {
		return accept{}, protoErr("a doorbell segment of %d bytes", a.bell.Size)
	}
	return a, nil
}

func appendSegment(b []byte, s segmentFrame) []byte {
	at := len(b)
	b = frameStart(b, frameSegment)
	b = binary.LittleEndian.AppendUint64(b, s.index)
	b = appendDesc(b, s.seg.Provider, s.seg.EID, s.seg.Name)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.seg.Size))
	b = binary.LittleEndian.AppendUint32(b, uint32(s.token))
	return frameEnd(b, at)
}

// decodeSegment decodes a segment frame; the leader checks the index and
// size against what it expects.
func decodeSegment(body []byte) (segmentFrame, error) {
	r := &wireReader{b: body}
	s := segmentFrame{index: r.u64(), seg: r.segDesc()}
	s.token = ub.Token(r.u32())
	if err := r.end(); err != nil {
		return segmentFrame{}, err
	}
	return s, nil
}
