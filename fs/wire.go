package fs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/ubkit-io/ubkit/ub"
)

// The export protocol (docs/fs.md, "Reading from other nodes"): on each
// connection the client sends requests and the server answers each in
// turn. Integers are little endian.
//
//	request  magic u32 | op u8 | 0 u8 | path length u16 | offset u64 | length u64 | path
//	response magic u32 | status u8 | 0 u8 | message length u16 | payload length u64 | message | payload
//
// opStat's payload is the file's size u64, mtime i64 (ns), chunk size
// u32, chunk count u32, then a hash (xxhash64) per chunk. opRead's is
// the length bytes from offset, exactly.
//
// opMap asks for one-sided reads: the export loads the file into memory
// registered with its ub context for remote Read and answers
//
//	idle ms u32 | token u32 | segment size u64 | EID [16] | provider length u16 | name length u16 | provider | name | stat
//
// (the registration lives as long as the connection); an export that
// cannot answers statusUnsupported. opPing (no path) is answered with an
// empty statusOK: it keeps a connection that holds a registration from
// its idle timeout.
const (
	wireMagic  = 0x53464255 // "UBFS"
	opStat     = 1
	opRead     = 2
	opMap      = 3
	opPing     = 4
	reqSize    = 24
	respSize   = 16
	maxPath    = 4096
	maxMessage = 1024

	statusOK       = 0
	statusNotFound = 1
	statusDenied   = 2
	statusBad      = 3
	statusIO       = 4
	statusBusy     = 5
	// statusUnsupported: no one-sided reads from this export (no ub
	// context, or turned off); the client reads through the connection.
	statusUnsupported = 6

	// Chunk sizes an export may use, and so the most a read asks for.
	minChunk = 64 << 10
	maxChunk = 64 << 20
	// maxChunks bounds a stat's hash list (a 1<<46-byte file in 64 MiB
	// chunks: 1M hashes, 8 MiB).
	maxChunks = 1 << 20
)

// Errors of OpenRemote. Match them with errors.Is.
var (
	// ErrRemote: the export answered with an error (its message says
	// which), or broke the protocol.
	ErrRemote = errors.New("fs: remote export")
	// ErrNotFound: the export has no such regular file.
	ErrNotFound = errors.New("fs: no such file in the export")
	// ErrDenied: the export refused the path (outside it, a symlink out
	// of it, not a regular file) or the client.
	ErrDenied = errors.New("fs: refused by the export")
	// ErrBusy: the export serves as many connections as it may.
	ErrBusy = errors.New("fs: export busy")
	// errBroken: a connection failed (a write, or the wait for an
	// answer) before the export answered.
	errBroken = errors.New("connection broken")
	// errUnsupported: the export does no one-sided reads (OpenRemote
	// reads through the connection instead).
	errUnsupported = errors.New("fs: no one-sided reads from this export")
)

type request struct {
	op       uint8
	off, len uint64
	path     string
}

func (r request) encode() []byte {
	b := make([]byte, reqSize, reqSize+len(r.path))
	binary.LittleEndian.PutUint32(b, wireMagic)
	b[4] = r.op
	binary.LittleEndian.PutUint16(b[6:], uint16(len(r.path)))
	binary.LittleEndian.PutUint64(b[8:], r.off)
	binary.LittleEndian.PutUint64(b[16:], r.len)
	return append(b, r.path...)
}

// readRequest reads one request, checking what it can without the file.
func readRequest(r io.Reader) (request, error) {
	var h [reqSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return request{}, err
	}
	if binary.LittleEndian.Uint32(h[:]) != wireMagic {
		return request{}, fmt.Errorf("%w: bad magic %#x", ErrRemote, binary.LittleEndian.Uint32(h[:]))
	}
	q := request{op: h[4], off: binary.LittleEndian.Uint64(h[8:]), len: binary.LittleEndian.Uint64(h[16:])}
	n := binary.LittleEndian.Uint16(h[6:])
	switch {
	case q.op != opStat && q.op != opRead && q.op != opMap && q.op != opPing:
		return q, fmt.Errorf("%w: unknown op %d", ErrRemote, q.op)
	case q.op == opPing && n != 0:
		return q, fmt.Errorf("%w: a ping with a path", ErrRemote)
	case q.op == opPing:
		return q, nil
	case n == 0 || n > maxPath:
		return q, fmt.Errorf("%w: path of %d bytes", ErrRemote, n)
	case q.op == opRead && (q.len == 0 || q.len > maxChunk || q.off > 1<<62):
		return q, fmt.Errorf("%w: read of %d bytes at %d", ErrRemote, q.len, q.off)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return q, err
	}
	q.path = string(p)
	return q, nil
}

// response is a response's header and message (the payload follows it on
// the wire).
type response struct {
	status  uint8
	msg     string
	payload uint64
}

func (r response) encode() []byte {
	msg := r.msg
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	b := make([]byte, respSize, respSize+len(msg))
	binary.LittleEndian.PutUint32(b, wireMagic)
	b[4] = r.status
	binary.LittleEndian.PutUint16(b[6:], uint16(len(msg)))
	binary.LittleEndian.PutUint64(b[8:], r.payload)
	return append(b, msg...)
}

// readResponse reads a response's header and message; the caller reads
// the payload, which it checks against what it asked for.
func readResponse(r io.Reader) (response, error) {
	var h [respSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return response{}, fmt.Errorf("%w: %w: %w", ErrRemote, errBroken, err)
	}
	if binary.LittleEndian.Uint32(h[:]) != wireMagic {
		return response{}, fmt.Errorf("%w: bad magic %#x", ErrRemote, binary.LittleEndian.Uint32(h[:]))
	}
	resp := response{status: h[4], payload: binary.LittleEndian.Uint64(h[8:])}
	n := binary.LittleEndian.Uint16(h[6:])
	if n > maxMessage {
		return resp, fmt.Errorf("%w: message of %d bytes", ErrRemote, n)
	}
	m := make([]byte, n)
	if _, err := io.ReadFull(r, m); err != nil {
		return resp, fmt.Errorf("%w: %v", ErrRemote, err)
	}
	resp.msg = string(m)
	return resp, nil
}

// err is the response's status as an error (nil for statusOK).
func (r response) err() error {
	var base error
	switch r.status {
	case statusOK:
		return nil
	case statusNotFound:
		base = ErrNotFound
	case statusDenied:
		base = ErrDenied
	case statusBusy:
		base = ErrBusy
	case statusBad, statusIO:
		base = ErrRemote
	case statusUnsupported:
		base = errUnsupported
	default:
		return fmt.Errorf("%w: unknown status %d", ErrRemote, r.status)
	}
	return fmt.Errorf("%w: %q", base, r.msg)
}

// statInfo is a stat's payload.
type statInfo struct {
	size   int64
	mtime  int64
	chunk  int
	hashes []uint64
}

func (s statInfo) encode() []byte {
	b := make([]byte, 24, 24+8*len(s.hashes))
	binary.LittleEndian.PutUint64(b, uint64(s.size))
	binary.LittleEndian.PutUint64(b[8:], uint64(s.mtime))
	binary.LittleEndian.PutUint32(b[16:], uint32(s.chunk))
	binary.LittleEndian.PutUint32(b[20:], uint32(len(s.hashes)))
	for _, h := range s.hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// decodeStat checks a stat's payload: a chunk size in bounds, and one
// hash per chunk of the size.
func decodeStat(b []byte) (statInfo, error) {
	if len(b) < 24 {
		return statInfo{}, fmt.Errorf("%w: stat of %d bytes", ErrRemote, len(b))
	}
	s := statInfo{size: int64(binary.LittleEndian.Uint64(b)), mtime: int64(binary.LittleEndian.Uint64(b[8:])),
		chunk: int(binary.LittleEndian.Uint32(b[16:]))}
	n := binary.LittleEndian.Uint32(b[20:])
	switch {
	case s.size < 0 || s.size > 1<<46:
		return s, fmt.Errorf("%w: file of %d bytes", ErrRemote, s.size)
	case s.chunk < minChunk || s.chunk > maxChunk || s.chunk%4096 != 0:
		return s, fmt.Errorf("%w: chunk of %d bytes", ErrRemote, s.chunk)
	case int64(n) != (s.size+int64(s.chunk)-1)/int64(s.chunk) || uint64(len(b)) != 24+8*uint64(n):
		return s, fmt.Errorf("%w: %d chunk hashes in %d bytes for %d bytes in chunks of %d", ErrRemote, n, len(b)-24, s.size, s.chunk)
	}
	s.hashes = make([]uint64, n)
	for i := range s.hashes {
		s.hashes[i] = binary.LittleEndian.Uint64(b[24+8*i:])
	}
	return s, nil
}

// mapInfo is an opMap's payload: the registered copy and the file's stat.
type mapInfo struct {
	idle  uint32 // the export's idle timeout, in ms
	token ub.Token
	desc  ub.SegmentDesc
	stat  statInfo
}

const (
	mapHeader      = 36
	maxProviderLen = 64
	maxDescName    = 1024
	// maxMapPayload bounds an opMap's payload.
	maxMapPayload = mapHeader + maxProviderLen + maxDescName + 24 + 8*maxChunks
)

func (m mapInfo) encode() []byte {
	b := make([]byte, mapHeader, mapHeader+len(m.desc.Provider)+len(m.desc.Name)+24+8*len(m.stat.hashes))
	binary.LittleEndian.PutUint32(b, m.idle)
	binary.LittleEndian.PutUint32(b[4:], uint32(m.token))
	binary.LittleEndian.PutUint64(b[8:], uint64(m.desc.Size))
	copy(b[16:32], m.desc.EID[:])
	binary.LittleEndian.PutUint16(b[32:], uint16(len(m.desc.Provider)))
	binary.LittleEndian.PutUint16(b[34:], uint16(len(m.desc.Name)))
	b = append(b, m.desc.Provider...)
	b = append(b, m.desc.Name...)
	return append(b, m.stat.encode()...)
}

// decodeMap checks an opMap's payload: the descriptor's lengths, and the
// stat as decodeStat does. A segment smaller than the file is refused;
// what the descriptor names is the ub context's to check on import.
func decodeMap(b []byte) (mapInfo, error) {
	if len(b) < mapHeader {
		return mapInfo{}, fmt.Errorf("%w: map answer of %d bytes", ErrRemote, len(b))
	}
	m := mapInfo{idle: binary.LittleEndian.Uint32(b), token: ub.Token(binary.LittleEndian.Uint32(b[4:]))}
	size := binary.LittleEndian.Uint64(b[8:])
	copy(m.desc.EID[:], b[16:32])
	np, nn := int(binary.LittleEndian.Uint16(b[32:])), int(binary.LittleEndian.Uint16(b[34:]))
	if np == 0 || np > maxProviderLen || nn > maxDescName || len(b) < mapHeader+np+nn {
		return m, fmt.Errorf("%w: map answer with a provider of %d and a name of %d bytes in %d", ErrRemote, np, nn, len(b))
	}
	m.desc.Provider = string(b[mapHeader : mapHeader+np])
	m.desc.Name = string(b[mapHeader+np : mapHeader+np+nn])
	st, err := decodeStat(b[mapHeader+np+nn:])
	if err != nil {
		return m, err
	}
	m.stat = st
	if size < uint64(st.size) || size > 1<<46 || st.size == 0 {
		return m, fmt.Errorf("%w: a segment of %d bytes for a file of %d", ErrRemote, size, st.size)
	}
	m.desc.Size = int(size)
	return m, nil
}

// equal reports whether two stats describe the same content.
func (s statInfo) equal(o statInfo) bool {
	if s.size != o.size || s.mtime != o.mtime || s.chunk != o.chunk || len(s.hashes) != len(o.hashes) {
		return false
	}
	for i, h := range s.hashes {
		if o.hashes[i] != h {
			return false
		}
	}
	return true
}
