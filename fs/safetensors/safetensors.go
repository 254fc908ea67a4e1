// Package safetensors reads safetensors files (the format of Hugging Face's
// safetensors library) as zero-copy tensor views over a loaded file.
//
// A safetensors file is an 8-byte little-endian header length N, N bytes
// of JSON naming each tensor's dtype, shape and byte range in the data
// that follows (plus an optional "__metadata__" map of strings), and the
// data. Parse checks all of it before returning a view: the JSON, every
// dtype and shape, every range inside the data, sizes that match
// dtype times shape, no overlaps and no holes, and limits on the header's
// size (MaxHeader, which bounds the number of tensors too: the format
// itself sets no other limit on it) and the rank. A malformed file is an
// error wrapping ErrInvalid, never a panic.
//
//	m, err := safetensors.Open(ctx, "model.safetensors", nil)
//	if err != nil { ... }
//	defer m.Close()
//	w, _ := m.Tensor("lm_head.weight")
//	fmt.Println(w.DType, w.Shape, len(w.Data))
package safetensors

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ubkit-io/ubkit/fs"
)

// ErrInvalid is wrapped by every error about a file's content.
var ErrInvalid = errors.New("safetensors: invalid file")

// Limits of Parse.
const (
	// MaxHeader is the largest JSON header accepted (the format's own
	// limit, 100 MB).
	MaxHeader = 100_000_000
	// MaxRank is the largest number of dimensions of a tensor.
	MaxRank = 64
)

// DType is a tensor's element type as the format names it.
type DType string

// The format's dtypes.
const (
	Bool    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	F8E5M2  DType = "F8_E5M2"
	F8E4M3  DType = "F8_E4M3"
	F8E8M0  DType = "F8_E8M0"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	F64     DType = "F64"
	I64     DType = "I64"
	U64     DType = "U64"
	F4      DType = "F4"
	F6E2M3  DType = "F6_E2M3"
	F6E3M2  DType = "F6_E3M2"
	C64     DType = "C64"
	unknown DType = ""
)

// Bits is the size of one element in bits (0 for an unknown dtype).
func (d DType) Bits() int {
	switch d {
	case Bool, U8, I8, F8E5M2, F8E4M3, F8E8M0:
		return 8
	case I16, U16, F16, BF16:
		return 16
	case I32, U32, F32:
		return 32
	case F64, I64, U64, C64:
		return 64
	case F4:
		return 4
	case F6E2M3, F6E3M2:
		return 6
	}
	return 0
}

// Tensor is one tensor of a file: a view of its bytes in the loaded file.
type Tensor struct {
	Name  string
	DType DType
	// Shape is the tensor's dimensions (empty: a scalar).
	Shape []int64
	// Offset is where Data starts in the file.
	Offset int64
	// Data is the tensor's bytes, little endian, row-major: a view into
	// the loaded file, read-only, valid while the File is open.
	Data []byte
}

// Elements is the number of elements (the product of Shape).
func (t Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Header is a parsed file: its tensors in file order and its metadata.
type Header struct {
	// Tensors are in the order of their data in the file.
	Tensors []Tensor
	// Metadata is the "__metadata__" map (nil if none).
	Metadata map[string]string
	// DataOffset is where the data region starts in the file (8 plus the
	// header's length).
	DataOffset int64
	byName     map[string]int
}

// Tensor returns the tensor called name.
func (h *Header) Tensor(name string) (Tensor, bool) {
	i, ok := h.byName[name]
	if !ok {
		return Tensor{}, false
	}
	return h.Tensors[i], true
}

// Names returns the tensors' names in file order.
func (h *Header) Names() []string {
	names := make([]string, len(h.Tensors))
	for i, t := range h.Tensors {
		names[i] = t.Name
	}
	return names
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Parse checks file, a whole safetensors file in memory, and returns its
// tensors as views into it.
func Parse(file []byte) (*Header, error) {
	if len(file) < 8 {
		return nil, invalid("%d bytes, shorter than the header's length", len(file))
	}
	n := binary.LittleEndian.Uint64(file)
	if n > MaxHeader {
		return nil, invalid("header of %d bytes, more than %d", n, MaxHeader)
	}
	if n > uint64(len(file)-8) {
		return nil, invalid("header of %d bytes in a file of %d", n, len(file))
	}
	h, spans, err := parseHeader(file[8 : 8+n])
	if err != nil {
		return nil, err
	}
	h.DataOffset = int64(8 + n)
	data := file[8+n:]
	// The data is indexed whole: tensors in offset order, each starting
	// where the one before ended, the last ending at the file's end.
	end := uint64(0)
	for i := range h.Tensors {
		t := &h.Tensors[i]
		b, e := spans[i][0], spans[i][1]
		if b != end {
			if b < end {
				return nil, invalid("tensor %q starts at %d, inside the tensor before it (ending at %d)", t.Name, b, end)
			}
			return nil, invalid("tensor %q starts at %d, leaving a hole after %d", t.Name, b, end)
		}
		if e > uint64(len(data)) {
			return nil, invalid("tensor %q ends at %d, past the data's %d bytes", t.Name, e, len(data))
		}
		t.Data = data[b:e:e]
		t.Offset = h.DataOffset + int64(b)
		end = e
	}
	if end != uint64(len(data)) {
		return nil, invalid("%d bytes of data after the last tensor", uint64(len(data))-end)
	}
	return h, nil
}

// rawTensor is a tensor's entry in the JSON header.
type rawTensor struct {
	DType       *string
	Shape       *[]json.Number
	DataOffsets *[]*json.Number
}

// readTensor reads a tensor's entry key by key: field names exactly as
// the format spells them, each once (encoding/json would match them in
// any case and keep the last of two), numbers as JSON numbers (not
// strings); other fields are skipped, as the format's own reader does.
func readTensor(dec *json.Decoder, name string) (rawTensor, error) {
	var r rawTensor
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return r, invalid("header: tensor %q is not an object", name)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return r, invalid("header: tensor %q: %v", name, err)
		}
		key, _ := tok.(string)
		if seen[key] {
			return r, invalid("header: tensor %q has %q twice", name, key)
		}
		seen[key] = true
		switch key {
		case "dtype":
			tok, err := dec.Token()
			s, ok := tok.(string)
			if err != nil || !ok {
				return r, invalid("header: tensor %q: dtype is not a string", name)
			}
			r.DType = &s
		case "shape":
			ns, err := readNumbers(dec)
			if err != nil {
				return r, invalid("header: tensor %q: shape: %v", name, err)
			}
			r.Shape = &ns
		case "data_offsets":
			ns, err := readNumbers(dec)
			if err != nil {
				return r, invalid("header: tensor %q: data_offsets: %v", name, err)
			}
			ps := make([]*json.Number, len(ns))
			for i := range ns {
				ps[i] = &ns[i]
			}
			r.DataOffsets = &ps
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return r, invalid("header: tensor %q: %v", name, err)
			}
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return r, invalid("header: tensor %q: %v", name, err)
	}
	return r, nil
}

// readNumbers reads an array of JSON numbers.
func readNumbers(dec *json.Decoder) ([]json.Number, error) {
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, errors.New("not an array")
	}
	var ns []json.Number
	for dec.More() {
		tok, err := dec.Token()
		n, ok := tok.(json.Number)
		if err != nil || !ok {
			return nil, fmt.Errorf("%v is not a number", tok)
		}
		if len(ns) == MaxRank+1 {
			return nil, fmt.Errorf("more than %d numbers", MaxRank+1)
		}
		ns = append(ns, n)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
		return nil, errors.New("unterminated array")
	}
	return ns, nil
}

// readMetadata reads "__metadata__": null, or an object of strings
// (each key once).
func readMetadata(dec *json.Decoder) (map[string]string, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, invalid("header: __metadata__: %v", err)
	}
	meta := map[string]string{}
	if tok == nil {
		return meta, nil
	}
	if tok != json.Delim('{') {
		return nil, invalid("header: __metadata__ is not a map of strings")
	}
	for dec.More() {
		k, err := dec.Token()
		key, _ := k.(string)
		if err != nil {
			return nil, invalid("header: __metadata__: %v", err)
		}
		if _, dup := meta[key]; dup {
			return nil, invalid("header: __metadata__ has %q twice", key)
		}
		v, err := dec.Token()
		val, ok := v.(string)
		if err != nil || !ok {
			return nil, invalid("header: __metadata__ %q is not a string", key)
		}
		meta[key] = val
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, invalid("header: __metadata__: %v", err)
	}
	return meta, nil
}

// parseHeader parses the JSON header. Tensors come back sorted by
// offset, without Data, and with their [begin, end) in the data.
func parseHeader(b []byte) (*Header, [][2]uint64, error) {
	if !utf8.Valid(b) {
		return nil, nil, invalid("header is not UTF-8")
	}
	// The format pads the header with spaces to 8 bytes.
	b = bytes.TrimRight(b, " ")
	if len(b) == 0 || b[0] != '{' {
		return nil, nil, invalid("header does not start with {")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	// The top level is read key by key: duplicates are refused (Go's
	// maps would keep the last silently).
	if _, err := dec.Token(); err != nil {
		return nil, nil, invalid("header: %v", err)
	}
	h := &Header{byName: map[string]int{}}
	type entry struct {
		name       string
		dtype      DType
		shape      []int64
		begin, end uint64
	}
	var entries []entry
	seenMeta := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, invalid("header: %v", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, invalid("header: key %v is not a string", tok)
		}
		if name == "__metadata__" {
			if seenMeta {
				return nil, nil, invalid("header: __metadata__ twice")
			}
			seenMeta = true
			meta, err := readMetadata(dec)
			if err != nil {
				return nil, nil, err
			}
			h.Metadata = meta
			continue
		}
		if _, dup := h.byName[name]; dup {
			return nil, nil, invalid("header: tensor %q twice", name)
		}
		h.byName[name] = -1
		raw, err := readTensor(dec, name)
		if err != nil {
			return nil, nil, err
		}
		e, err := checkTensor(name, raw)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, entry{name, e.dtype, e.shape, e.begin, e.end})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, nil, invalid("header: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, invalid("header: more after its JSON object")
	}
	slices.SortFunc(entries, func(a, b entry) int {
		if a.begin != b.begin {
			if a.begin < b.begin {
				return -1
			}
			return 1
		}
		// Empty tensors share offsets: the empty one first.
		if a.end != b.end {
			if a.end < b.end {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	h.Tensors = make([]Tensor, len(entries))
	spans := make([][2]uint64, len(entries))
	for i, e := range entries {
		h.Tensors[i] = Tensor{Name: e.name, DType: e.dtype, Shape: e.shape}
		spans[i] = [2]uint64{e.begin, e.end}
		h.byName[e.name] = i
	}
	return h, spans, nil
}

type checked struct {
	dtype      DType
	shape      []int64
	begin, end uint64
}

// checkTensor checks one tensor's entry.
func checkTensor(name string, raw rawTensor) (checked, error) {
	var c checked
	if raw.DType == nil || raw.Shape == nil || raw.DataOffsets == nil {
		return c, invalid("tensor %q lacks dtype, shape or data_offsets", name)
	}
	c.dtype = DType(*raw.DType)
	bitsPer := c.dtype.Bits()
	if bitsPer == 0 {
		return c, invalid("tensor %q has unknown dtype %q", name, *raw.DType)
	}
	if len(*raw.Shape) > MaxRank {
		return c, invalid("tensor %q has %d dimensions, more than %d", name, len(*raw.Shape), MaxRank)
	}
	c.shape = make([]int64, len(*raw.Shape))
	elems := uint64(1)
	overflow := false
	for i, d := range *raw.Shape {
		v, err := nonNegative(d)
		if err != nil {
			return c, invalid("tensor %q dimension %d: %v", name, i, err)
		}
		c.shape[i] = int64(v)
		hi, lo := bits.Mul64(elems, v)
		if hi != 0 || lo > math.MaxInt64 {
			overflow = true
		}
		elems = lo
	}
	if len(*raw.DataOffsets) != 2 {
		return c, invalid("tensor %q has %d data_offsets, want 2", name, len(*raw.DataOffsets))
	}
	var offs [2]uint64
	for i, p := range *raw.DataOffsets {
		if p == nil {
			return c, invalid("tensor %q data_offsets[%d] is null", name, i)
		}
		v, err := nonNegative(*p)
		if err != nil {
			return c, invalid("tensor %q data_offsets[%d]: %v", name, i, err)
		}
		offs[i] = v
	}
	c.begin, c.end = offs[0], offs[1]
	if c.end < c.begin {
		return c, invalid("tensor %q ends at %d before it starts at %d", name, c.end, c.begin)
	}
	hi, size := bits.Mul64(elems, uint64(bitsPer))
	if overflow || hi != 0 || size%8 != 0 || size/8 != c.end-c.begin {
		return c, invalid("tensor %q: %v of %s is not the %d bytes of its data_offsets", name, c.shape, c.dtype, c.end-c.begin)
	}
	return c, nil
}

// nonNegative parses a JSON number that must be a non-negative integer.
func nonNegative(n json.Number) (uint64, error) {
	s := string(n)
	if s == "" || strings.ContainsAny(s, ".eE+-") {
		return 0, fmt.Errorf("%q is not a non-negative integer", s)
	}
	var v uint64
	for _, c := range s {
		d := uint64(c - '0')
		if d > 9 {
			return 0, fmt.Errorf("%q is not a non-negative integer", s)
		}
		hi, lo := bits.Mul64(v, 10)
		if hi != 0 || lo+d < lo || lo+d > math.MaxInt64 {
			return 0, fmt.Errorf("%s is too large", s)
		}
		v = lo + d
	}
	return v, nil
}

// File is a safetensors file loaded with fs.Open and parsed.
type File struct {
	*Header
	f *fs.File
}

// Open loads the safetensors file at path with fs.Open (opts as there:
// one shared copy per host, parallel reads, progress) and parses it.
func Open(ctx context.Context, path string, opts *fs.Options) (*File, error) {
	f, err := fs.Open(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	h, err := Parse(f.Bytes())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &File{Header: h, f: f}, nil
}

// Bytes is the whole file.
func (f *File) Bytes() []byte { return f.f.Bytes() }

// Loaded is the underlying fs.File (how it was loaded, whether shared).
func (f *File) Loaded() *fs.File { return f.f }

// Close closes the loaded file: the tensors' Data must not be used after.
func (f *File) Close() error { return f.f.Close() }
