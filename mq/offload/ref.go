package offload

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ubkit-io/ubkit/transport"
)

// Errors of offload. Match them with errors.Is.
var (
	// ErrBadRef: bytes that claim to be a reference are not a valid one.
	ErrBadRef = errors.New("offload: not a valid payload reference")
	// ErrPayloadGone: the payload a reference names is no longer kept
	// (retention dropped it, or its log is gone), or cannot be reached.
	ErrPayloadGone = errors.New("offload: payload no longer available")
	// ErrChecksum: the payload found for a reference has another length
	// or checksum than the reference says.
	ErrChecksum = errors.New("offload: payload does not match its reference")
	// ErrTooLarge: a payload exceeds the configured maximum.
	ErrTooLarge = errors.New("offload: payload too large")
)

// Reference wire format (little endian), RefSize(ref) bytes:
//
//	0   4  magic "UBOF"
//	4   1  version (1)
//	5   1  flags, 0
//	6   2  partition
//	8   8  log offset of the record
//	16  4  payload length
//	20  4  CRC-32C (Castagnoli) of the payload
//	24  1  length of the log name (1-255)
//	25  1  length of the fetch address (0-255; 0: none)
//	26     log name, then fetch address
const (
	refMagic      = "UBOF"
	refVersion    = 1
	refFixed      = 26
	maxNameLen    = 255
	maxPartitions = 256
	// MaxRefSize bounds an encoded reference.
	MaxRefSize = refFixed + 2*maxNameLen
)

// Ref names an offloaded payload: where it lives (a record of an
// mq.Log), what it is (length and checksum) and where a consumer on
// another host fetches it (a transport address of a Server).
type Ref struct {
	// Log is the mq.Log's name.
	Log string
	// Partition and Offset are the record's.
	Partition int
	Offset    uint64
	// Length and CRC are the payload's length and CRC-32C.
	Length uint32
	CRC    uint32
	// Fetch is the transport address (ub://<node>/<service>) of a Server
	// that serves the log, or empty: only consumers on the log's host can
	// resolve the reference.
	Fetch string
}

// validName reports whether s is usable as a log name: shm's segment
// name characters, 1-255 bytes.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func (r Ref) check() error {
	switch {
	case !validName(r.Log):
		return fmt.Errorf("%w: log name %q", ErrBadRef, r.Log)
	case r.Partition < 0 || r.Partition >= maxPartitions:
		return fmt.Errorf("%w: partition %d", ErrBadRef, r.Partition)
	case r.Offset%8 != 0:
		return fmt.Errorf("%w: offset %d is not a record's", ErrBadRef, r.Offset)
	case r.Length == 0:
		return fmt.Errorf("%w: an empty payload", ErrBadRef)
	case len(r.Fetch) > maxNameLen:
		return fmt.Errorf("%w: a fetch address of %d bytes", ErrBadRef, len(r.Fetch))
	}
	if r.Fetch != "" {
		if _, err := transport.ParseAddr(r.Fetch); err != nil {
			return fmt.Errorf("%w: fetch address: %v", ErrBadRef, err)
		}
	}
	return nil
}

// AppendBinary appends the encoded reference to b. It fails with ErrBadRef
// if r is not valid (the checks ParseRef makes).
func (r Ref) AppendBinary(b []byte) ([]byte, error) {
	if err := r.check(); err != nil {
		return b, err
	}
	b = append(b, refMagic...)
	b = append(b, refVersion, 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(r.Partition))
	b = binary.LittleEndian.AppendUint64(b, r.Offset)
	b = binary.LittleEndian.AppendUint32(b, r.Length)
	b = binary.LittleEndian.AppendUint32(b, r.CRC)
	b = append(b, byte(len(r.Log)), byte(len(r.Fetch)))
	b = append(b, r.Log...)
	return append(b, r.Fetch...), nil
}

// MarshalBinary encodes the reference.
func (r Ref) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(make([]byte, 0, refFixed+len(r.Log)+len(r.Fetch)))
}

// IsRef reports whether b starts like an encoded reference (its magic);
// ParseRef says whether it is one.
func IsRef(b []byte) bool { return len(b) >= len(refMagic) && string(b[:len(refMagic)]) == refMagic }

// ParseRef decodes an encoded reference, strictly: the magic, version and
// flags, every length, the names and no trailing bytes. b comes from the
// broker, so anything else is ErrBadRef.
func ParseRef(b []byte) (Ref, error) {
	if len(b) < refFixed || !IsRef(b) {
		return Ref{}, fmt.Errorf("%w: %d bytes without the magic or header", ErrBadRef, len(b))
	}
	if b[4] != refVersion || b[5] != 0 {
		return Ref{}, fmt.Errorf("%w: version %d, flags %#x", ErrBadRef, b[4], b[5])
	}
	nl, fl := int(b[24]), int(b[25])
	if len(b) != refFixed+nl+fl {
		return Ref{}, fmt.Errorf("%w: %d bytes, the header says %d", ErrBadRef, len(b), refFixed+nl+fl)
	}
	r := Ref{
		Partition: int(binary.LittleEndian.Uint16(b[6:])),
		Offset:    binary.LittleEndian.Uint64(b[8:]),
		Length:    binary.LittleEndian.Uint32(b[16:]),
		CRC:       binary.LittleEndian.Uint32(b[20:]),
		Log:       string(b[refFixed : refFixed+nl]),
		Fetch:     string(b[refFixed+nl:]),
	}
	if err := r.check(); err != nil {
		return Ref{}, err
	}
	return r, nil
}

func (r Ref) String() string {
	return fmt.Sprintf("%s/p%d@%d (%d bytes, crc %#08x, fetch %q)", r.Log, r.Partition, r.Offset, r.Length, r.CRC, r.Fetch)
}
