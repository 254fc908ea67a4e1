package ubpulsar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
)

// A local topic's record (docs/mq.md, "Local topics"): what a
// pulsar.ProducerMessage carries, little endian.
//
//	0  u32 magic "uPL1"
//	4  u32 number of properties
//	8  i64 event time (Unix ns, 0: none)
//	16 i64 publish time (Unix ns)
//	24 i64 sequence id
//	32 key, ordering key, producer name: each a u32 length then bytes
//	   properties: each key then value, as above, sorted by key
//	   u32 payload length, then the payload (the rest of the record)
const (
	localMagic       = 0x314c5075 // "uPL1"
	localFixed       = 32
	maxLocalProps    = 1024
	maxLocalStrBytes = 1 << 20
)

// localRecord is a decoded record. Strings are copies; payload aliases
// the decoded bytes.
type localRecord struct {
	key, orderingKey, producer string
	props                      map[string]string
	eventTime, publishTime     int64
	seq                        int64
	payload                    []byte
}

func (r *localRecord) size() int {
	n := localFixed + 4*4 + len(r.key) + len(r.orderingKey) + len(r.producer) + len(r.payload)
	for k, v := range r.props {
		n += 8 + len(k) + len(v)
	}
	return n
}

func (r *localRecord) check() error {
	if len(r.props) > maxLocalProps {
		return fmt.Errorf("ubpulsar: %d properties, at most %d on a local topic", len(r.props), maxLocalProps)
	}
	for _, s := range []string{r.key, r.orderingKey, r.producer} {
		if len(s) > maxLocalStrBytes {
			return fmt.Errorf("ubpulsar: a %d-byte key or name, at most %d on a local topic", len(s), maxLocalStrBytes)
		}
	}
	for k, v := range r.props {
		if len(k) > maxLocalStrBytes || len(v) > maxLocalStrBytes {
			return fmt.Errorf("ubpulsar: a %d-byte property, at most %d on a local topic", len(k)+len(v), maxLocalStrBytes)
		}
	}
	return nil
}

// encode writes r into b, which is r.size() bytes.
func (r *localRecord) encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b, localMagic)
	le.PutUint32(b[4:], uint32(len(r.props)))
	le.PutUint64(b[8:], uint64(r.eventTime))
	le.PutUint64(b[16:], uint64(r.publishTime))
	le.PutUint64(b[24:], uint64(r.seq))
	at := localFixed
	put := func(s []byte) {
		le.PutUint32(b[at:], uint32(len(s)))
		at += 4
		at += copy(b[at:], s)
	}
	put([]byte(r.key))
	put([]byte(r.orderingKey))
	put([]byte(r.producer))
	for _, k := range slices.Sorted(maps.Keys(r.props)) {
		put([]byte(k))
		put([]byte(r.props[k]))
	}
	put(r.payload)
}

var errLocalRecord = errors.New("ubpulsar: not a local topic record")

// decodeLocal decodes b strictly: every length within b, properties
// sorted and unique, the payload ending b exactly.
func decodeLocal(b []byte) (localRecord, error) {
	le := binary.LittleEndian
	var r localRecord
	if len(b) < localFixed || le.Uint32(b) != localMagic {
		return r, fmt.Errorf("%w (%d bytes)", errLocalRecord, len(b))
	}
	n := le.Uint32(b[4:])
	if n > maxLocalProps {
		return r, fmt.Errorf("%w: %d properties", errLocalRecord, n)
	}
	r.eventTime, r.publishTime, r.seq = int64(le.Uint64(b[8:])), int64(le.Uint64(b[16:])), int64(le.Uint64(b[24:]))
	at := localFixed
	get := func(limit int) ([]byte, error) {
		if len(b)-at < 4 {
			return nil, fmt.Errorf("%w: truncated at byte %d", errLocalRecord, at)
		}
		l := le.Uint32(b[at:])
		at += 4
		if uint64(l) > uint64(len(b)-at) || uint64(l) > uint64(limit) {
			return nil, fmt.Errorf("%w: a %d-byte field at byte %d of %d", errLocalRecord, l, at, len(b))
		}
		s := b[at : at+int(l)]
		at += int(l)
		return s, nil
	}
	var fields [3][]byte
	for i := range fields {
		s, err := get(maxLocalStrBytes)
		if err != nil {
			return r, err
		}
		fields[i] = s
	}
	r.key, r.orderingKey, r.producer = string(fields[0]), string(fields[1]), string(fields[2])
	if n > 0 {
		r.props = make(map[string]string, n)
	}
	prev := ""
	for i := range n {
		k, err := get(maxLocalStrBytes)
		if err != nil {
			return r, err
		}
		v, err := get(maxLocalStrBytes)
		if err != nil {
			return r, err
		}
		if i > 0 && string(k) <= prev {
			return r, fmt.Errorf("%w: property %q out of order", errLocalRecord, k)
		}
		prev = string(k)
		r.props[prev] = string(v)
	}
	p, err := get(len(b))
	if err != nil {
		return r, err
	}
	if at != len(b) {
		return r, fmt.Errorf("%w: %d bytes after the payload", errLocalRecord, len(b)-at)
	}
	r.payload = p
	return r, nil
}
