package tcpprov

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Wire format, little endian. Every frame starts with its length (u32,
// excluding itself).
//
//	request:  op u8, flags u8, pad u16, token u32, object u32, pad u32,
//	          offset u64, n u32, pad u32, a u64, b u64, payload
//	response: status u8, pad 7, value u64, payload
//
// object is a segment id (one-sided ops) or a jetty id (sends); a is the
// jetty id of a WriteImm notification, the immediate of a send, the compare
// value of a CAS or the addend of a FetchAdd; b is the immediate of a
// WriteImm or the swap value of a CAS; n is the length of a Read, or the
// jetty's token for a WriteImm's notification.
const (
	reqHeader  = 48
	respHeader = 16
	// maxFrame bounds what a peer can make us allocate.
	maxFrame = 64<<20 + reqHeader

	opWrite    = 1
	opWriteImm = 2
	opRead     = 3
	opSend     = 4
	opCAS      = 5
	opFetchAdd = 6

	flagImm        = 1
	flagUnreliable = 2 // the sender's mode: drop rather than fail without a receive
)

type request struct {
	op, flags uint8
	token     uint32
	object    uint32
	offset    uint64
	n         uint32
	a, b      uint64
	payload   []byte
}

type response struct {
	status  uint8
	value   uint64
	payload []byte
}

// appendHeader appends the frame's length and header; the payload follows
// on the wire without being copied here.
func (r *request) appendHeader(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(reqHeader+len(r.payload)))
	b = append(b, r.op, r.flags, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, r.token)
	b = binary.LittleEndian.AppendUint32(b, r.object)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, r.offset)
	b = binary.LittleEndian.AppendUint32(b, r.n)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, r.a)
	return binary.LittleEndian.AppendUint64(b, r.b)
}

var errFrame = errors.New("tcpprov: malformed frame")

// readFrame reads one length-prefixed frame into buf (grown as needed).
func readFrame(r io.Reader, buf []byte, minLen int) ([]byte, error) {
	n, err := readLength(r, minLen)
	if err != nil {
		return nil, err
	}
	return readBody(r, buf, n)
}

// readLength reads a frame's length and checks it against minLen and
// maxFrame.
func readLength(r io.Reader, minLen int) (int, error) {
	var l [4]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return 0, err
	}
	n := binary.LittleEndian.Uint32(l[:])
	if n < uint32(minLen) || n > maxFrame {
		return 0, fmt.Errorf("%w: length %d", errFrame, n)
	}
	return int(n), nil
}

// readBody reads n bytes (at most maxFrame) into buf, grown as needed.
func readBody(r io.Reader, buf []byte, n int) ([]byte, error) {
	// Grow the buffer as the bytes arrive, not as the header claims: four
	// bytes from a peer must not cost us a 64 MiB allocation.
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), 1<<20)
		if cap(buf)-len(buf) < step {
			buf = append(buf[:len(buf):len(buf)], make([]byte, step)...)[:len(buf)]
		}
		k, err := io.ReadFull(r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+k]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

func decodeRequest(b []byte) (request, error) {
	if len(b) < reqHeader {
		return request{}, errFrame
	}
	r := request{
		op: b[0], flags: b[1],
		token:   binary.LittleEndian.Uint32(b[4:]),
		object:  binary.LittleEndian.Uint32(b[8:]),
		offset:  binary.LittleEndian.Uint64(b[16:]),
		n:       binary.LittleEndian.Uint32(b[24:]),
		a:       binary.LittleEndian.Uint64(b[32:]),
		b:       binary.LittleEndian.Uint64(b[40:]),
		payload: b[reqHeader:],
	}
	if r.op < opWrite || r.op > opFetchAdd {
		return r, fmt.Errorf("%w: op %d", errFrame, r.op)
	}
	return r, nil
}

func appendResponse(b []byte, status uint8, value uint64, payload []byte) []byte {
	return append(appendResponseHeader(b, status, value, len(payload)), payload...)
}

// appendResponseHeader appends a response's length and header, for a
// payload of n bytes that follows on the wire without being copied here.
func appendResponseHeader(b []byte, status uint8, value uint64, n int) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(respHeader+n))
	b = append(b, status, 0, 0, 0, 0, 0, 0, 0)
	return binary.LittleEndian.AppendUint64(b, value)
}

func decodeResponse(b []byte) (response, error) {
	if len(b) < respHeader {
		return response{}, errFrame
	}
	return response{status: b[0], value: binary.LittleEndian.Uint64(b[8:]), payload: b[respHeader:]}, nil
}
