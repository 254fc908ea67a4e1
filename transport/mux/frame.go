package mux

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	headerSize = 12
	// protoVersion 1 added the session window (window updates on stream 0).
	protoVersion = 1
	maxFrame     = 16 << 20

	typeData   = 0
	typeWindow = 1
	typePing   = 2
	typeGoAway = 3

	flagSYN = 1
	flagACK = 2
	flagFIN = 4
	flagRST = 8

	initialWindow = 256 << 10
	// maxSessionWindow bounds a session's window, and the credit a peer
	// may give.
	maxSessionWindow = 1 << 30
)

type header struct {
	version, typ uint8
	flags        uint16
	stream       uint32
	length       uint32
}

func (h header) encode(b []byte) {
	b[0], b[1] = protoVersion, h.typ
	binary.BigEndian.PutUint16(b[2:], h.flags)
	binary.BigEndian.PutUint32(b[4:], h.stream)
	binary.BigEndian.PutUint32(b[8:], h.length)
}

// ErrProtocol reports a frame a correct peer cannot send.
var ErrProtocol = errors.New("mux: protocol error")

func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize {
		return header{}, fmt.Errorf("%w: short header", ErrProtocol)
	}
	h := header{version: b[0], typ: b[1], flags: binary.BigEndian.Uint16(b[2:]),
		stream: binary.BigEndian.Uint32(b[4:]), length: binary.BigEndian.Uint32(b[8:])}
	switch {
	case h.version != protoVersion:
		return h, fmt.Errorf("%w: version %d, this side speaks %d (both ends must run the same ubkit release)", ErrProtocol, h.version, protoVersion)
	case h.typ > typeGoAway:
		return h, fmt.Errorf("%w: frame type %d", ErrProtocol, h.typ)
	case h.typ == typeData && h.length > maxFrame:
		return h, fmt.Errorf("%w: data frame of %d bytes", ErrProtocol, h.length)
	case (h.typ == typePing || h.typ == typeGoAway) && h.stream != 0:
		return h, fmt.Errorf("%w: %d frame on stream %d", ErrProtocol, h.typ, h.stream)
	}
	return h, nil
}
