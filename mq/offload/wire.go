package offload

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The fetch protocol, over one transport stream connection, request after
// request:
//
//	request:  "UBFQ" | u16 n | n bytes: an encoded Ref (n <= MaxRefSize)
//	response: u8 status | u32 n | n bytes: the payload (status ok) or a
//	          message (other statuses, n <= maxMessage)
//
// Integers little endian. Either side closes the connection on anything
// else.
const (
	reqMagic   = "UBFQ"
	maxMessage = 1024

	statusOK       = 0
	statusGone     = 1 // the payload is not kept, or its log not served
	statusBad      = 2 // the request is not valid
	statusMismatch = 3 // the record found has another length
	statusError    = 4 // anything else
)

// readRequest reads one request's reference bytes.
func readRequest(r io.Reader, buf []byte) ([]byte, error) {
	var h [6]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	if string(h[:4]) != reqMagic {
		return nil, fmt.Errorf("%w: a request without the magic", ErrBadRef)
	}
	n := int(binary.LittleEndian.Uint16(h[4:]))
	if n > MaxRefSize || n > len(buf) {
		return nil, fmt.Errorf("%w: a %d-byte reference", ErrBadRef, n)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func appendRequest(b, ref []byte) []byte {
	b = append(b, reqMagic...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(ref)))
	return append(b, ref...)
}

// readResponseHeader reads a response's status and length, checking the
// length against the most the caller takes for a payload.
func readResponseHeader(r io.Reader, maxPayload int) (status byte, n int, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, err
	}
	status, n64 := h[0], uint64(binary.LittleEndian.Uint32(h[1:]))
	switch {
	case status > statusError:
		return 0, 0, fmt.Errorf("offload: fetch server answered status %d", status)
	case status == statusOK && n64 > uint64(maxPayload):
		return 0, 0, fmt.Errorf("offload: fetch server sends %d bytes, at most %d taken: %w", n64, maxPayload, ErrTooLarge)
	case status != statusOK && n64 > maxMessage:
		return 0, 0, fmt.Errorf("offload: fetch server sends a %d-byte message", n64)
	}
	return status, int(n64), nil
}

func responseHeader(status byte, n int) []byte {
	b := []byte{status, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(b[1:], uint32(n))
	return b
}
