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
	"math/rand/v2"
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
	if h, err := Parse(build(`{"__metadata__":null,"t":{"extra":[1,{"x":2}],"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{9})); err != nil || len(h.Metadata) != 0 || h.Tensors[0].Data[0] != 9 {
		t.Errorf("null metadata and an unknown field: %v", err)
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
		// What encoding/json alone would let through (Python's
		// safetensors refuses each).
		{"text after", build(t16("")+`xyz`, data)},
		{"brace after", build(t16("")+`}`, data)},
		{"NUL after", build(t16("")+"\x00\x00", data)},
		{"dim as string", build(`{"t":{"dtype":"U8","shape":["16"],"data_offsets":[0,16]}}`, data)},
		{"offset as string", build(`{"t":{"dtype":"U8","shape":[16],"data_offsets":["0","16"]}}`, data)},
		{"field in capitals", build(`{"t":{"DTYPE":"U8","shape":[16],"data_offsets":[0,16]}}`, data)},
		{"field twice", build(`{"t":{"dtype":"F64","dtype":"U8","shape":[16],"data_offsets":[0,16]}}`, data)},
		{"null metadata value", build(t16(`,"__metadata__":{"a":null}`), data)},
		{"metadata key twice", build(t16(`,"__metadata__":{"a":"1","a":"2"}`), data)},
		{"tensor not an object", build(`{"t":[1]}`, data)},
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

// pythonJudge reads every file named on stdin with Python's safetensors
// (deserialize) and prints, per file, a JSON line: whether it was taken,
// and its tensors' dtype, shape and data.
const pythonJudge = `
import hashlib, json, sys
from safetensors import deserialize
for path in sys.stdin.read().split():
    try:
        ts = deserialize(open(path, "rb").read())
        out = {"ok": True, "tensors": {n: [t["dtype"], list(t["shape"]), hashlib.sha256(bytes(t["data"])).hexdigest()] for n, t in ts}}
    except Exception as e:
        out = {"ok": False, "err": str(e)[:200]}
    print(json.dumps(out))
`

// TestPythonAgrees runs the same files, valid and damaged, through Parse
// and through Python's safetensors, and fails where they disagree about
// taking a file or about what it holds. Deliberate differences: Parse
// refuses a tensor name or metadata key given twice (Python keeps the
// last).
func TestPythonAgrees(t *testing.T) {
	python, pypath, err := testenv.Safetensors()
	if err != nil {
		t.Fatal(err)
	}
	valid := build(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"I64","shape":[],"data_offsets":[24,32]},"__metadata__":{"k":"v"}}`, make([]byte, 32))
	files := [][]byte{valid}
	r := rand.New(rand.NewPCG(1, 2))
	hdr := int(binary.LittleEndian.Uint64(valid))
	for range 600 {
		b := bytes.Clone(valid)
		for range 1 + r.IntN(3) {
			i := 8 + r.IntN(hdr)
			switch r.IntN(3) {
			case 0:
				b[i] = byte(r.IntN(256))
			case 1:
				b[i] = "0123456789{}[]\",: -.eE"[r.IntN(22)]
			default:
				b[i] = ' '
			}
		}
		files = append(files, b)
	}
	dir := t.TempDir()
	var names []string
	for i, f := range files {
		p := filepath.Join(dir, fmt.Sprintf("%d.safetensors", i))
		if err := os.WriteFile(p, f, 0o600); err != nil {
			t.Fatal(err)
		}
		names = append(names, p)
	}
	cmd := exec.Command(python, "-c", pythonJudge)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pypath)
	cmd.Stdin = strings.NewReader(strings.Join(names, "\n"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(files) {
		t.Fatalf("python judged %d files of %d", len(lines), len(files))
	}
	taken, disagree := 0, 0
	for i, l := range lines {
		var py struct {
			OK      bool                      `json:"ok"`
			Err     string                    `json:"err"`
			Tensors map[string][3]interface{} `json:"tensors"`
		}
		if err := json.Unmarshal([]byte(l), &py); err != nil {
			t.Fatal(err)
		}
		h, err := Parse(files[i])
		if py.OK {
			taken++
		}
		if (err == nil) != py.OK {
			if err != nil && strings.Contains(err.Error(), "twice") {
				continue // deliberate
			}
			disagree++
			if disagree <= 5 {
				t.Errorf("file %d (header %q): Parse says %v, Python %v %s", i, files[i][8:8+hdr], err, py.OK, py.Err)
			}
			continue
		}
		if err != nil {
			continue
		}
		if len(h.Tensors) != len(py.Tensors) {
			t.Errorf("file %d: %d tensors, Python %d", i, len(h.Tensors), len(py.Tensors))
		}
		for _, tn := range h.Tensors {
			p, ok := py.Tensors[tn.Name]
			sum := sha256.Sum256(tn.Data)
			if !ok || p[0] != string(tn.DType) || fmt.Sprint(p[1]) != fmt.Sprint(shapeAny(tn.Shape)) || p[2] != hex.EncodeToString(sum[:]) {
				t.Errorf("file %d: tensor %q is %s %v, Python %v", i, tn.Name, tn.DType, tn.Shape, p)
			}
		}
	}
	if disagree > 0 {
		t.Errorf("%d of %d files judged differently", disagree, len(files))
	}
	t.Logf("%d of %d files taken by both", taken, len(files))
}

func shapeAny(s []int64) []any {
	out := make([]any, len(s))
	for i, d := range s {
		out[i] = float64(d)
	}
	return out
}
