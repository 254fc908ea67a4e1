package mq

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ubkit-io/ubkit/shm"
)

// The remote reader's wire format (Serve and DialReader), written down
// once here and in docs/mq.md ("Across the super node"). Integers are
// little endian. Every frame is
//
//	length u32   bytes after this field, 1 to the receiver's bound
//	type   u8
//	body
//
// Reader to server:
//
//	hello   (1): magic u32 "uMQR" | version u8 | partition u32 | from u64 |
//	             window u32 | name length u8 | name
//	credit  (2): bytes u32, returned once the reader is done with records
//
// Server to reader:
//
//	welcome (3): partitions u32 | start offset u64 | granted window u32
//	records (4): count u32, then count times: offset u64 | length u32 | payload
//	error   (5): code u8 | message length u16 | message
//
// A records frame costs the server its whole frame (length field
// included) of the reader's window; the reader returns it with credit
// frames once the application has moved past every record of it.
const (
	wireMagic   = 0x52514d75 // "uMQR"
	wireVersion = 1

	frameHello   = 1
	frameCredit  = 2
	frameWelcome = 3
	frameRecords = 4
	frameError   = 5

	// maxControl bounds every frame that is not records.
	maxControl = 1024
	// frameHeader is the length field and the type; a records frame adds
	// its count.
	frameHeader   = 5
	recordsHeader = frameHeader + 4
	// recordHeader is a record's offset and length in a records frame.
	recordHeader = 12
	maxErrorText = 512
	maxNameLen   = 255
)

// Errors of the remote reader. Match them with errors.Is.
var (
	// ErrProtocol: the peer broke the wire format (a frame too long, a
	// field out of range, more records than the window it was given).
	ErrProtocol = errors.New("mq: peer broke the protocol")
	// ErrPeerClosed: the connection ended (the server or the peer died,
	// or closed it) in the middle of a stream.
	ErrPeerClosed = errors.New("mq: peer closed the connection")
	// ErrBusy: the server holds all the connections it allows.
	ErrBusy = errors.New("mq: server busy")
	// ErrDenied: the server's ServeConfig.Authorize refused the reader.
	ErrDenied = errors.New("mq: reader not authorized")
)

func protoErr(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrProtocol)
}

// hello is what a remote reader asks for.
type hello struct {
	name      string
	partition uint32
	from      uint64
	window    uint32
}

func appendHello(b []byte, h hello) []byte {
	at := len(b)
	b = frameStart(b, frameHello)
	b = binary.LittleEndian.AppendUint32(b, wireMagic)
	b = append(b, wireVersion)
	b = binary.LittleEndian.AppendUint32(b, h.partition)
	b = binary.LittleEndian.AppendUint64(b, h.from)
	b = binary.LittleEndian.AppendUint32(b, h.window)
	b = append(b, byte(len(h.name)))
	b = append(b, h.name...)
	return frameEnd(b, at)
}

func decodeHello(body []byte) (hello, error) {
	const fixed = 4 + 1 + 4 + 8 + 4 + 1
	if len(body) < fixed {
		return hello{}, protoErr("hello of %d bytes", len(body))
	}
	if m := binary.LittleEndian.Uint32(body); m != wireMagic {
		return hello{}, protoErr("hello magic %#x", m)
	}
	if v := body[4]; v != wireVersion {
		return hello{}, protoErr("wire version %d, want %d", v, wireVersion)
	}
	h := hello{
		partition: binary.LittleEndian.Uint32(body[5:]),
		from:      binary.LittleEndian.Uint64(body[9:]),
		window:    binary.LittleEndian.Uint32(body[17:]),
	}
	n := int(body[21])
	if len(body) != fixed+n || n == 0 {
		return hello{}, protoErr("hello with a %d-byte name in %d bytes", n, len(body))
	}
	h.name = string(body[fixed:])
	return h, nil
}

func appendCredit(b []byte, n uint32) []byte {
	at := len(b)
	b = frameStart(b, frameCredit)
	b = binary.LittleEndian.AppendUint32(b, n)
	return frameEnd(b, at)
}

func decodeCredit(body []byte) (uint32, error) {
	if len(body) != 4 {
		return 0, protoErr("credit of %d bytes", len(body))
	}
	return binary.LittleEndian.Uint32(body), nil
}

type welcome struct {
	partitions uint32
	start      uint64
	window     uint32
}

func appendWelcome(b []byte, w welcome) []byte {
	at := len(b)
	b = frameStart(b, frameWelcome)
	b = binary.LittleEndian.AppendUint32(b, w.partitions)
	b = binary.LittleEndian.AppendUint64(b, w.start)
	b = binary.LittleEndian.AppendUint32(b, w.window)
	return frameEnd(b, at)
}

func decodeWelcome(body []byte) (welcome, error) {
	if len(body) != 16 {
		return welcome{}, protoErr("welcome of %d bytes", len(body))
	}
	w := welcome{
		partitions: binary.LittleEndian.Uint32(body),
		start:      binary.LittleEndian.Uint64(body[4:]),
		window:     binary.LittleEndian.Uint32(body[12:]),
	}
	if w.start%8 != 0 || w.partitions == 0 || w.partitions > maxPartitions {
		return welcome{}, protoErr("welcome %+v", w)
	}
	return w, nil
}

// Error codes of error frames, each a sentinel on the reader's side.
const (
	codeBadRequest = 1 + iota
	codeNoLog
	codeNoPartition
	codeOffsetGone
	codeTooLarge
	codeBusy
	codeNoSlot
	codeCorrupt
	codeClosed
	codeDiverged
	codeDown
	codeDenied
)

func errorCode(err error) byte {
	switch {
	case errors.Is(err, ErrOffsetGone):
		return codeOffsetGone
	case errors.Is(err, ErrTooLarge):
		return codeTooLarge
	case errors.Is(err, ErrBusy):
		return codeBusy
	case errors.Is(err, ErrDenied):
		return codeDenied
	case errors.Is(err, ErrNoSlot):
		return codeNoSlot
	case errors.Is(err, shm.ErrCorrupt):
		return codeCorrupt
	case errors.Is(err, ErrClosed):
		return codeClosed
	case errors.Is(err, ErrDiverged):
		return codeDiverged
	case errors.Is(err, ErrReplicaDown):
		return codeDown
	case errors.Is(err, os.ErrNotExist):
		return codeNoLog
	case errors.Is(err, errNoPartition):
		return codeNoPartition
	}
	return codeBadRequest
}

var errNoPartition = errors.New("mq: no such partition")

func codeError(code byte) error {
	switch code {
	case codeOffsetGone:
		return ErrOffsetGone
	case codeTooLarge:
		return ErrTooLarge
	case codeBusy:
		return ErrBusy
	case codeDenied:
		return ErrDenied
	case codeNoSlot:
		return ErrNoSlot
	case codeCorrupt:
		return shm.ErrCorrupt
	case codeClosed:
		return ErrClosed
	case codeNoLog:
		return os.ErrNotExist
	case codeNoPartition:
		return errNoPartition
	case codeDiverged:
		return ErrDiverged
	case codeDown:
		return ErrReplicaDown
	case codeBadRequest:
		return ErrProtocol
	}
	return nil
}

func appendError(b []byte, err error) []byte {
	msg := err.Error()
	if len(msg) > maxErrorText {
		msg = msg[:maxErrorText]
	}
	at := len(b)
	b = frameStart(b, frameError)
	b = append(b, errorCode(err))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	return frameEnd(b, at)
}

// decodeError turns an error frame into the error it reports: the
// peer's message, wrapping the sentinel its code names.
func decodeError(body []byte) error {
	if len(body) < 3 {
		return protoErr("error frame of %d bytes", len(body))
	}
	code, n := body[0], int(binary.LittleEndian.Uint16(body[1:]))
	if n > maxErrorText || len(body) != 3+n {
		return protoErr("error frame with a %d-byte message in %d bytes", n, len(body))
	}
	sentinel := codeError(code)
	if sentinel == nil {
		return protoErr("error code %d", code)
	}
	return fmt.Errorf("mq: the peer says %q: %w", body[3:], sentinel)
}

// decodeRecords checks a records frame's body (after the type) and calls
// fn for each record in order. Offsets must be 8-aligned and increasing,
// each at least next (the end of the record before: records between
// them were aborted or padding); the body must be used up exactly. It
// returns the end of the last record. The payloads are slices of body.
func decodeRecords(body []byte, next uint64, fn func(Record)) (uint64, error) {
	if len(body) < 4 {
		return next, protoErr("records frame of %d bytes", len(body))
	}
	count := binary.LittleEndian.Uint32(body)
	rest := body[4:]
	if count == 0 || uint64(count) > uint64(len(rest))/recordHeader {
		return next, protoErr("%d records in %d bytes", count, len(rest))
	}
	for range count {
		if len(rest) < recordHeader {
			return next, protoErr("record header cut short")
		}
		off := binary.LittleEndian.Uint64(rest)
		n := binary.LittleEndian.Uint32(rest[8:])
		rest = rest[recordHeader:]
		if uint64(n) > uint64(len(rest)) {
			return next, protoErr("record of %d bytes in %d", n, len(rest))
		}
		end := off + align8(headerSize+uint64(n))
		if off%8 != 0 || off < next || end < off {
			return next, protoErr("record offset %d after %d", off, next)
		}
		fn(Record{Offset: off, Payload: rest[:n:n]})
		rest = rest[n:]
		next = end
	}
	if len(rest) != 0 {
		return next, protoErr("%d bytes after the last record", len(rest))
	}
	return next, nil
}

// frameStart appends a frame's length (filled in by frameEnd) and type.
func frameStart(b []byte, typ byte) []byte {
	return append(b, 0, 0, 0, 0, typ)
}

// frameEnd fills in the length of the frame that starts at b[at:].
func frameEnd(b []byte, at int) []byte {
	binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b
}

// readFrame reads one frame of at most limit bytes (after the length
// field) into buf (grown if needed) and returns its type and body.
// io.EOF before the first byte comes back as is.
func readFrame(r *bufio.Reader, limit int, buf []byte) (byte, []byte, error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n == 0 || uint64(n) > uint64(limit) {
		return 0, nil, protoErr("frame of %d bytes, at most %d allowed", n, limit)
	}
	if cap(buf) < int(n-1) {
		// Rounded up to 4 KiB, so that a reused buffer fits most frames.
		buf = make([]byte, n-1, (int(n-1)+4095)&^4095)
	}
	buf = buf[:n-1]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[4], buf, nil
}
