package ubrocketmq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// A local topic's record (docs/mq.md, "Local topics"), little endian:
//
//	0  u32 magic "uRL1"
//	4  u32 number of properties
//	8  i64 born timestamp (Unix ms)
//	16 i32 flag, u32 0
//	24 properties: each key then value, a u32 length then bytes, sorted
//	   by key; then the body (the rest of the record)
const (
	localMagic       = 0x314c5275 // "uRL1"
	localFixed       = 24
	maxLocalProps    = 1024
	maxLocalStrBytes = 1 << 20
)

type localRecord struct {
	props map[string]string
	born  int64
	flag  int32
	body  []byte // aliases the decoded bytes
}

func (r *localRecord) size() int {
	n := localFixed + len(r.body)
	for k, v := range r.props {
		n += 8 + len(k) + len(v)
	}
	return n
}

func (r *localRecord) check() error {
	if len(r.props) > maxLocalProps {
		return fmt.Errorf("ubrocketmq: %d properties, at most %d on a local topic", len(r.props), maxLocalProps)
	}
	for k, v := range r.props {
		if len(k) > maxLocalStrBytes || len(v) > maxLocalStrBytes {
			return fmt.Errorf("ubrocketmq: a %d-byte property, at most %d on a local topic", len(k)+len(v), maxLocalStrBytes)
		}
	}
	return nil
}

func (r *localRecord) encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b, localMagic)
	le.PutUint32(b[4:], uint32(len(r.props)))
	le.PutUint64(b[8:], uint64(r.born))
	le.PutUint32(b[16:], uint32(r.flag))
	le.PutUint32(b[20:], 0)
	at := localFixed
	for _, k := range slices.Sorted(maps.Keys(r.props)) {
		for _, s := range []string{k, r.props[k]} {
			le.PutUint32(b[at:], uint32(len(s)))
			at += 4
			at += copy(b[at:], s)
		}
	}
	copy(b[at:], r.body)
}

var errLocalRecord = errors.New("ubrocketmq: not a local topic record")

// decodeLocal decodes b strictly: lengths within b, properties sorted
// and unique, reserved bits zero.
func decodeLocal(b []byte) (localRecord, error) {
	le := binary.LittleEndian
	var r localRecord
	if len(b) < localFixed || le.Uint32(b) != localMagic || le.Uint32(b[20:]) != 0 {
		return r, fmt.Errorf("%w (%d bytes)", errLocalRecord, len(b))
	}
	n := le.Uint32(b[4:])
	if n > maxLocalProps {
		return r, fmt.Errorf("%w: %d properties", errLocalRecord, n)
	}
	r.born, r.flag = int64(le.Uint64(b[8:])), int32(le.Uint32(b[16:]))
	at := localFixed
	get := func() (string, error) {
		if len(b)-at < 4 {
			return "", fmt.Errorf("%w: truncated at byte %d", errLocalRecord, at)
		}
		l := le.Uint32(b[at:])
		at += 4
		if uint64(l) > uint64(len(b)-at) || l > maxLocalStrBytes {
			return "", fmt.Errorf("%w: a %d-byte field at byte %d of %d", errLocalRecord, l, at, len(b))
		}
		s := string(b[at : at+int(l)])
		at += int(l)
		return s, nil
	}
	r.props = make(map[string]string, n)
	prev := ""
	for i := range n {
		k, err := get()
		if err != nil {
			return r, err
		}
		v, err := get()
		if err != nil {
			return r, err
		}
		if i > 0 && k <= prev {
			return r, fmt.Errorf("%w: property %q out of order", errLocalRecord, k)
		}
		prev = k
		r.props[k] = v
	}
	r.body = b[at:]
	return r, nil
}
