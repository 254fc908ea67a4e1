package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

func TestFsLoad(t *testing.T) {
	// A small safetensors file: two tensors, one metadata entry.
	h := `{"w":{"dtype":"F32","shape":[4,1024],"data_offsets":[0,16384]},"b":{"dtype":"U8","shape":[8],"data_offsets":[16384,16392]},"__metadata__":{"m":"x"}}`
	for len(h)%8 != 0 {
		h += " "
	}
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	file = append(append(file, h...), make([]byte, 16392)...)
	for i := range file[8+len(h):] {
		file[8+len(h)+i] = byte(i)
	}
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(file)
	for _, args := range [][]string{
		{"load", "-tensors", path},
		{"load", "-method", "copy", "-cold", "-sha256", hex.EncodeToString(sum[:]), "-tensors", path},
		{"load", "-method", "map", "-parallel", "2", "-chunk", "1", "-tensors", path},
	} {
		var out bytes.Buffer
		if err := fsCmd(args, &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if !regexp.MustCompile(`m\.safetensors: 16\.[0-9] KiB in .*: [0-9.]+ GB/s \((map|copy), (shared|private)`).MatchString(out.String()) ||
			!regexp.MustCompile(`2 tensors \(F32 16\.0 KiB, U8 8 B\), 1 metadata entries`).MatchString(out.String()) {
			t.Errorf("%v said:\n%s", args, out.String())
		}
	}
	var out bytes.Buffer
	if err := fsCmd([]string{"load", "-sha256", "00", path}, &out); err == nil {
		t.Error("a bad -sha256 was taken")
	}
	if err := fsCmd([]string{"load", "-method", "copy", "-sha256", string(bytes.Repeat([]byte("0"), 64)), path}, &out); err == nil {
		t.Error("the wrong SHA-256 was not noticed")
	}
	if err := fsCmd([]string{"nothing"}, &out); err == nil {
		t.Error("an unknown subcommand was taken")
	}
}
