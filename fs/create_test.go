package fs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestCreate(t *testing.T) {
	dir := t.TempDir()
	_, want := writeFile(t, dir, 5<<20+12345, 9)
	path := filepath.Join(dir, "ckpt")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, o := range []CreateOptions{{}, {Durability: NoSync, Parallel: 1, ChunkSize: 4096}, {Parallel: 3, ChunkSize: 64 << 10, Perm: 0o600}} {
		w, err := Create(path, &o)
		if err != nil {
			t.Fatal(err)
		}
		// Writes of every size, then a tail written at its offset by
		// several goroutines.
		head := len(want) - 100000
		for i, step := 0, 1; i < head; step = step*3 + 1 {
			n := min(step%(1<<20)+1, head-i)
			if k, err := w.Write(want[i : i+n]); k != n || err != nil {
				t.Fatalf("Write: %d, %v", k, err)
			}
			i += n
		}
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lo, hi := head+g*25000, head+(g+1)*25000
				if _, err := w.WriteAt(want[lo:hi], int64(lo)); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if got, _ := os.ReadFile(path); string(got) != "old" {
			t.Fatal("the file changed before Close")
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		if _, err := w.Write([]byte("x")); !errors.Is(err, ErrClosed) {
			t.Errorf("Write after Close: %v", err)
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%+v: the file is not what was written (%d bytes, %v)", o, len(got), err)
		}
		if st, _ := os.Stat(path); o.Perm != 0 && st.Mode().Perm() != o.Perm {
			t.Errorf("mode %v, want %v", st.Mode().Perm(), o.Perm)
		}
		os.WriteFile(path, []byte("old"), 0o600)
	}
	// Abort leaves the old file and no temporary one.
	w, err := Create(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(want[:1<<20])
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Error("Abort changed the file")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".ckpt*")); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
	if err := w.Close(); err == nil {
		t.Error("Close after Abort succeeded")
	}
	if _, err := Create(filepath.Join(dir, "no", "such"), nil); err == nil {
		t.Error("Create in a missing directory succeeded")
	}
	for _, o := range []CreateOptions{{Durability: 5}, {Parallel: -1}, {ChunkSize: 5000}} {
		if _, err := Create(path, &o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// TestCreateAbortWhileWriting: Abort racing Write and WriteAt, and Close
// racing WriteAt, neither panic nor lose a write that was let in.
func TestCreateAbortWhileWriting(t *testing.T) {
	dir := t.TempDir()
	for i := range 20 {
		w, err := Create(filepath.Join(dir, "f"), &CreateOptions{ChunkSize: 4096, Parallel: 2})
		if err != nil {
			t.Fatal(err)
		}
		var wg, writes sync.WaitGroup
		wg.Add(1)
		writes.Add(1)
		go func() {
			defer writes.Done()
			for range 200 {
				if _, err := w.Write(make([]byte, 3000)); err != nil {
					return
				}
			}
		}()
		var wrote sync.Map
		go func() {
			defer wg.Done()
			for k := range 200 {
				if _, err := w.WriteAt([]byte{byte(k)}, int64(1<<20+k)); err != nil {
					return
				}
				wrote.Store(k, true)
			}
		}()
		if i%2 == 0 {
			w.Abort() // racing Write and WriteAt
			wg.Wait()
			writes.Wait()
			continue
		}
		writes.Wait() // Write is the closer's side: WriteAt races Close
		err = w.Close()
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "f"))
		wrote.Range(func(k, _ any) bool {
			if off := 1<<20 + k.(int); off >= len(got) || got[off] != byte(k.(int)) {
				t.Errorf("WriteAt %d returned nil before Close but is not in the file", k)
			}
			return true
		})
	}
}
