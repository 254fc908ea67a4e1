package safetensors

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ubkit-io/ubkit/fs"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// writePython is run by python3 with Python's safetensors and numpy: it
// writes argv[1] (a safetensors file of random tensors of every numpy
// dtype the format has, seeded by argv[3]) with save_file, reads it back
// with safe_open, and writes argv[2]: what it wrote, per tensor, as JSON.
const writePython = `
import hashlib, json, sys
import numpy as np
from safetensors.numpy import save_file
from safetensors import safe_open

path, manifest, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(seed)
names = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
         "float16": "F16", "int32": "I32", "uint32": "U32", "float32": "F32",
         "float64": "F64", "int64": "I64", "uint64": "U64"}
tensors = {}
for i in range(int(rng.integers(1, 40))):
    dt = list(names)[int(rng.integers(0, len(names)))]
    rank = int(rng.integers(0, 5))
    shape = tuple(int(rng.integers(0, 6 if rank > 2 else 300)) for _ in range(rank))
    if dt == "bool":
        a = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dt.startswith("float"):
        a = rng.standard_normal(size=shape).astype(dt)
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    tensors["layer.%d.%s" % (i, dt)] = np.ascontiguousarray(a)
meta = {"format": "np", "seed": str(seed), "note": "ünïcode"}
save_file(tensors, path, metadata=meta)
out = {"metadata": meta, "tensors": {}}
with safe_open(path, framework="np") as f:
    assert f.metadata() == meta
    for k in f.keys():
        a = f.get_tensor(k)
        assert a.dtype == tensors[k].dtype and a.shape == tensors[k].shape and np.array_equal(a, tensors[k])
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        out["tensors"][k] = {"dtype": names[str(a.dtype)], "shape": list(a.shape), "sha256": hashlib.sha256(b).hexdigest()}
json.dump(out, open(manifest, "w"))
`

type manifest struct {
	Metadata map[string]string `json:"metadata"`
	Tensors  map[string]struct {
		DType  string  `json:"dtype"`
		Shape  []int64 `json:"shape"`
		SHA256 string  `json:"sha256"`
	} `json:"tensors"`
}

// TestPythonFiles reads files written by Python's safetensors back, tensor
// by tensor, through every way fs loads them.
func TestPythonFiles(t *testing.T) {
	python, pypath, err := testenv.Safetensors()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "write.py")
	if err := os.WriteFile(script, []byte(writePython), 0o600); err != nil {
		t.Fatal(err)
	}
	for seed := range 6 {
		path := filepath.Join(dir, fmt.Sprintf("m%d.safetensors", seed))
		mpath := path + ".json"
		cmd := exec.Command(python, script, path, mpath, fmt.Sprint(seed))
		cmd.Env = append(os.Environ(), "PYTHONPATH="+pypath)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		var want manifest
		b, err := os.ReadFile(mpath)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		for _, o := range []fs.Options{{Method: fs.Map}, {Method: fs.Copy}, {Method: fs.Copy, Private: true}} {
			f, err := Open(context.Background(), path, &o)
			if err != nil {
				t.Fatalf("seed %d %v: %v", seed, o.Method, err)
			}
			if !maps(f.Metadata, want.Metadata) {
				t.Errorf("seed %d: metadata %v, Python wrote %v", seed, f.Metadata, want.Metadata)
			}
			if len(f.Tensors) != len(want.Tensors) {
				t.Errorf("seed %d: %d tensors, Python wrote %d", seed, len(f.Tensors), len(want.Tensors))
			}
			for name, w := range want.Tensors {
				got, ok := f.Tensor(name)
				if !ok {
					t.Errorf("seed %d: no tensor %q", seed, name)
					continue
				}
				sum := sha256.Sum256(got.Data)
				if string(got.DType) != w.DType || !slices.Equal(got.Shape, w.Shape) || hex.EncodeToString(sum[:]) != w.SHA256 ||
					got.Elements()*int64(got.DType.Bits())/8 != int64(len(got.Data)) {
					t.Errorf("seed %d %v: tensor %q is %s %v (%d bytes), Python wrote %s %v", seed, o.Method, name, got.DType, got.Shape, len(got.Data), w.DType, w.Shape)
				}
				if len(got.Data) > 0 && !bytes.Equal(got.Data, f.Bytes()[got.Offset:got.Offset+int64(len(got.Data))]) {
					t.Errorf("tensor %q: Offset %d does not locate its data", name, got.Offset)
				}
			}
			f.Close()
		}
	}
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// build makes a safetensors file of header h (padded to 8 bytes) and
// data.
func build(h string, data []byte) []byte {
	for len(h)%8 != 0 {
		h += " "
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(b, h...), data...)
}

func TestParse(t *testing.T) {
	h, err := Parse(build(`{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]},"e":{"dtype":"F64","shape":[0,3],"data_offsets":[12,12]},"__metadata__":{"k":"v"}}`,
		[]byte("abcdEFGHijkl")))
	if err != nil {
		t.Fatal(err)
	}
	if got := h.Names(); !slices.Equal(got, []string{"a", "b", "e"}) {
		t.Errorf("order %v", got)
	}
	a, _ := h.Tensor("a")
	b, _ := h.Tensor("b")
	e, _ := h.Tensor("e")
	if string(a.Data) != "abcd" || string(b.Data) != "EFGHijkl" || len(e.Data) != 0 || h.Metadata["k"] != "v" || b.Offset != h.DataOffset+4 {
		t.Errorf("a %q b %q e %q meta %v", a.Data, b.Data, e.Data, h.Metadata)
	}
	if _, ok := h.Tensor("zz"); ok {
		t.Error("found a tensor that is not there")
	}
	if h, err := Parse(build(`{}`, nil)); err != nil || len(h.Tensors) != 0 {
		t.Errorf("empty file: %v", err)
	}
	if h, err := Parse(build(`{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}}`, make([]byte, 8))); err != nil || h.Tensors[0].Elements() != 1 {
		t.Errorf("scalar: %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	t16 := func(extra string) string {
		return `{"t":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}` + extra + `}`
	}
	data := make([]byte, 16)
	for _, c := range []struct {
		name string
		file []byte
	}{
		{"short", []byte{1, 2, 3}},
		{"header past the end", binary.LittleEndian.AppendUint64(nil, 100)},
		{"huge header", binary.LittleEndian.AppendUint64(nil, MaxHeader+1)},
		{"not json", build(`{"t":`, data)},
		{"not an object", build(`[1,2]`, data)},
		{"trailing", build(t16("")+`{}`, data)},
		{"bad utf8", build("{\"\xff\":1}", data)},
		{"duplicate", build(`{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"t":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}}`, data)},
		{"metadata twice", build(t16(`,"__metadata__":{},"__metadata__":{}`), data)},
		{"metadata not strings", build(t16(`,"__metadata__":{"a":1}`), data)},
		{"unknown dtype", build(`{"t":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, data)},
		{"missing shape", build(`{"t":{"dtype":"U8","data_offsets":[0,16]}}`, data)},
		{"negative dim", build(`{"t":{"dtype":"U8","shape":[-16],"data_offsets":[0,16]}}`, data)},
		{"float dim", build(`{"t":{"dtype":"U8","shape":[16.0],"data_offsets":[0,16]}}`, data)},
		{"huge dim", build(`{"t":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,16]}}`, data)},
		{"overflowing shape", build(`{"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,16]}}`, data)},
		{"size mismatch", build(`{"t":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}}`, data)},
		{"reversed offsets", build(`{"t":{"dtype":"U8","shape":[0],"data_offsets":[16,0]}}`, data)},
		{"three offsets", build(`{"t":{"dtype":"U8","shape":[16],"data_offsets":[0,16,16]}}`, data)},
		{"null offset", build(`{"t":{"dtype":"U8","shape":[16],"data_offsets":[null,16]}}`, data)},
		{"past the data", build(`{"t":{"dtype":"U8","shape":[32],"data_offsets":[0,32]}}`, data)},
		{"hole", build(`{"t":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}}`, data)},
		{"overlap", build(`{"a":{"dtype":"U8","shape":[10],"data_offsets":[0,10]},"b":{"dtype":"U8","shape":[10],"data_offsets":[6,16]}}`, data)},
		{"data left over", build(`{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}}`, data)},
		{"too many dims", build(`{"t":{"dtype":"U8","shape":[`+strings.Repeat("1,", MaxRank)+`16],"data_offsets":[0,16]}}`, data)},
		{"odd bits", build(`{"t":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}`, []byte{0})},
	} {
		if _, err := Parse(c.file); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(build(`{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[2,2],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}`, []byte("abcdEFGHijkl")))
	f.Add(build(`{}`, nil))
	f.Add(build(`{"t":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, []byte{1, 2}))
	f.Add(build(`{"t":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}}`, make([]byte, 16)))
	f.Fuzz(func(t *testing.T, file []byte) {
		h, err := Parse(file)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		end := h.DataOffset
		for _, tn := range h.Tensors {
			if tn.Offset != end || tn.Offset+int64(len(tn.Data)) > int64(len(file)) {
				t.Fatalf("tensor %q at %d (%d bytes), want it at %d", tn.Name, tn.Offset, len(tn.Data), end)
			}
			if tn.Elements()*int64(tn.DType.Bits()) != 8*int64(len(tn.Data)) {
				t.Fatalf("tensor %q: %v %s in %d bytes", tn.Name, tn.Shape, tn.DType, len(tn.Data))
			}
			end += int64(len(tn.Data))
		}
		if end != int64(len(file)) {
			t.Fatalf("tensors end at %d of %d", end, len(file))
		}
	})
}
