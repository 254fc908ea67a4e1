package shmprov_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/ub"
)

const regToken = ub.Token(0x7e9)

// newShmSegment makes a named shm segment that the test closes at its end.
func newShmSegment(t *testing.T, name string, size int) *shm.Segment {
	t.Helper()
	s, err := shm.CreateSegment(name, size, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// segName is a segment name of this test and process.
func segName(t *testing.T, suffix string) string {
	return fmt.Sprintf("regtest-%d-%d-%s", os.Getpid(), time.Now().UnixNano(), suffix)
}

// write writes data at off of r from a scratch segment of c, on a
// fresh jetty (shm runs requests when they are posted), and returns the
// write's status.
func write(c ub.Context, r ub.RemoteSegment, off int, data string) (ub.Status, error) {
	loc, err := c.AllocSegment(len(data), ub.SegmentConfig{})
	if err != nil {
		return 0, err
	}
	defer loc.Close()
	copy(loc.Bytes(), data)
	q, err := c.NewCQ(ub.CQConfig{})
	if err != nil {
		return 0, err
	}
	defer q.Close()
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	if err != nil {
		return 0, err
	}
	defer j.Close()
	if _, err := j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: loc, Len: len(data)}, Remote: ub.Remote{Seg: r, Offset: off}}}); err != nil {
		return 0, err
	}
	out := make([]ub.Completion, 1)
	if n, err := q.Poll(out); n != 1 || err != nil {
		return 0, fmt.Errorf("poll: %d completions, %v", n, err)
	}
	return out[0].Status, nil
}

// writeTo is write, failing the test on an error.
func writeTo(t *testing.T, c ub.Context, r ub.RemoteSegment, off int, data string) ub.Status {
	t.Helper()
	st, err := write(c, r, off, data)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestRegisterRefusesUnnamedMemory: peers reach memory by mapping shm
// files, so memory that is in none (a Go slice, a memfd) is refused,
// saying why.
func TestRegisterRefusesUnnamedMemory(t *testing.T) {
	c := openContext(t)
	mfd, err := shm.CreateMemfd("regtest", 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer mfd.Close()
	for what, mem := range map[string][]byte{"a Go slice": make([]byte, 4096), "a memfd": mfd.Data()} {
		s, err := c.RegisterSegment(mem, ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
		if !errors.Is(err, ub.ErrInvalidArgument) || !errors.Is(err, shm.ErrNotInSegment) || !strings.Contains(err.Error(), "named") {
			t.Errorf("RegisterSegment of %s: %v; want ErrInvalidArgument saying it is not in a named shm segment", what, err)
		}
		if s != nil {
			s.Close()
		}
	}
}

// TestRegisterRecreatedTarget: a registration whose segment was unlinked
// is not imported any more, and one whose segment's name was given to a
// new segment since is refused and never writes the new one; an import
// made before the unlink keeps working.
func TestRegisterRecreatedTarget(t *testing.T) {
	owner, peer := openContext(t), openContext(t)
	name := segName(t, "target")
	old := newShmSegment(t, name, 8192)
	reg, err := owner.RegisterSegment(old.Data()[4096:8192], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
	if err != nil {
		t.Fatal(err)
	}
	early, err := peer.ImportSegment(reg.Desc(), regToken)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Unlink(); err != nil {
		t.Fatal(err)
	}
	// Unlinked: the registrant still has it mapped, and so has the
	// early import, which keeps working.
	if st := writeTo(t, peer, early, 0, "early"); st != ub.StatusSuccess || string(reg.Bytes()[:5]) != "early" {
		t.Errorf("a write through an import made before the unlink: %v, memory %q", st, reg.Bytes()[:5])
	}
	_, err = peer.ImportSegment(reg.Desc(), regToken)
	if !errors.Is(err, ub.ErrBadDescriptor) || !strings.Contains(err.Error(), "gone") {
		t.Errorf("import after the segment was unlinked: %v; want ErrBadDescriptor saying it is gone", err)
	}
	// Made again under the name: another file, which must not be taken
	// for the registered one.
	fresh := newShmSegment(t, name, 8192)
	copy(fresh.Data()[4096:], "untouched")
	r, err := peer.ImportSegment(reg.Desc(), regToken)
	if !errors.Is(err, ub.ErrBadDescriptor) || !strings.Contains(err.Error(), "another segment") {
		t.Errorf("import after the segment's name was reused: %v; want ErrBadDescriptor saying it is another segment", err)
	}
	if r != nil {
		writeTo(t, peer, r, 0, "WRITTEN!!")
		r.Close()
	}
	if got := string(fresh.Data()[4096:4105]); got != "untouched" {
		t.Errorf("the segment made under the registered name holds %q", got)
	}
}

// TestRegisterFileBacked: memory in a file-backed segment registers, and
// a peer's write lands in the file's mapping.
func TestRegisterFileBacked(t *testing.T) {
	owner, peer := openContext(t), openContext(t)
	f, err := shm.CreateFileSegment(filepath.Join(t.TempDir(), "seg"), 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reg, err := owner.RegisterSegment(f.Data()[128:256], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
	if err != nil {
		t.Fatal(err)
	}
	r, err := peer.ImportSegment(reg.Desc(), regToken)
	if err != nil {
		t.Fatal(err)
	}
	if st := writeTo(t, peer, r, 8, "on file"); st != ub.StatusSuccess || string(f.Data()[136:143]) != "on file" {
		t.Errorf("write into a registered file-backed segment: %v, memory %q", st, f.Data()[136:143])
	}
}

// TestRegisterFileBackedRelativePath: memory in a file-backed segment
// made by a relative or unclean path registers, and a peer imports it and
// writes into it (the registration names the file by its absolute, clean
// path).
func TestRegisterFileBackedRelativePath(t *testing.T) {
	owner, peer := openContext(t), openContext(t)
	dir := t.TempDir()
	t.Chdir(dir)
	for _, p := range []string{"seg", dir + "//seg2"} {
		f, err := shm.CreateFileSegment(p, 4096, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		reg, err := owner.RegisterSegment(f.Data()[:128], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
		if err != nil {
			t.Fatalf("%s: RegisterSegment: %v", p, err)
		}
		defer reg.Close()
		r, err := peer.ImportSegment(reg.Desc(), regToken)
		if err != nil {
			t.Fatalf("%s: registered, but the import fails: %v", p, err)
		}
		defer r.Close()
		if st := writeTo(t, peer, r, 8, "relative"); st != ub.StatusSuccess || string(f.Data()[8:16]) != "relative" {
			t.Errorf("%s: write: %v, memory %q", p, st, f.Data()[8:16])
		}
	}
}

// TestRegisterFileDirChecked: memory in a file-backed segment whose
// directory others may write to (shm.CheckDir) is refused when it is
// registered, and a registration made while the directory passed is
// refused by importers once it no longer does.
func TestRegisterFileDirChecked(t *testing.T) {
	owner, peer := openContext(t), openContext(t)
	dir := filepath.Join(t.TempDir(), "segs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := shm.CreateFileSegment(filepath.Join(dir, "seg"), 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	reg, err := owner.RegisterSegment(f.Data()[:128], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if r, err := peer.ImportSegment(reg.Desc(), regToken); !errors.Is(err, ub.ErrBadDescriptor) || !strings.Contains(err.Error(), dir) {
		if err == nil {
			r.Close()
		}
		t.Errorf("import of memory in a directory others may write to: %v, want ErrBadDescriptor naming %s", err, dir)
	}
	if _, err := owner.RegisterSegment(f.Data()[:128], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken}); !errors.Is(err, ub.ErrInvalidArgument) {
		t.Errorf("RegisterSegment of memory in a directory others may write to: %v, want ErrInvalidArgument", err)
	}
}

// TestRegisterNoReceives: receives cannot be posted in registered memory
// (a sender finds a receive's memory by its segment's name); the error
// says so rather than senders failing later.
func TestRegisterNoReceives(t *testing.T) {
	c := openContext(t)
	s := newShmSegment(t, segName(t, "recv"), 4096)
	reg, err := c.RegisterSegment(s.Data(), ub.SegmentConfig{Access: ub.AccessWrite})
	if err != nil {
		t.Fatal(err)
	}
	q, _ := c.NewCQ(ub.CQConfig{})
	j, err := c.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.PostRecv([]ub.RecvWR{{Buf: ub.Local{Seg: reg, Len: 64}}}); !errors.Is(err, ub.ErrInvalidArgument) {
		t.Errorf("a receive in registered memory: %v, want ErrInvalidArgument", err)
	}
}

// The roles of TestRegisterAcrossProcesses.
const (
	envRegDesc = "SHMPROV_REG_DESC"
	envRegSeg  = "SHMPROV_REG_SEG"
	regBase    = 4096 // where the registered memory starts in the segment's data area
	regOff     = 1000 // where the writer writes in the registered memory
	regData    = "written from another process"
)

// regWriterChild imports the registration in envRegDesc and writes
// regData at regOff.
func regWriterChild() int {
	var desc ub.SegmentDesc
	if err := json.Unmarshal([]byte(os.Getenv(envRegDesc)), &desc); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := ub.Open(context.Background(), "shm", ub.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	r, err := c.ImportSegment(desc, regToken)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if st, err := write(c, r, regOff, regData); err != nil || st != ub.StatusSuccess {
		fmt.Fprintln(os.Stderr, "write:", st, err)
		return 1
	}
	return 0
}

// regReaderChild opens the segment named in envRegSeg by name, as any
// local process would, and prints what the writer wrote there.
func regReaderChild() int {
	s, err := shm.OpenSegment(os.Getenv(envRegSeg))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer s.Close()
	os.Stdout.Write(s.Data()[regBase+regOff : regBase+regOff+len(regData)])
	return 0
}

// TestRegisterAcrossProcesses: memory of a named segment registered here
// is written by a peer in another process, and a third process that opens
// the segment by name sees the bytes.
func TestRegisterAcrossProcesses(t *testing.T) {
	c := openContext(t)
	name := segName(t, "cross")
	s := newShmSegment(t, name, 8192)
	reg, err := c.RegisterSegment(s.Data()[regBase:], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
	if err != nil {
		t.Fatal(err)
	}
	desc, _ := json.Marshal(reg.Desc())
	w := testenv.Child(t, "regwriter", envRegDesc+"="+string(desc))
	if out, err := w.CombinedOutput(); err != nil {
		t.Fatalf("the writer process: %v\n%s", err, out)
	}
	if got := string(reg.Bytes()[regOff : regOff+len(regData)]); got != regData {
		t.Errorf("the registrant sees %q after the peer's write", got)
	}
	r := testenv.Child(t, "regreader", envRegSeg+"="+name)
	var stderr bytes.Buffer
	r.Stderr = &stderr
	out, err := r.Output()
	if err != nil {
		t.Fatalf("the reader process: %v\n%s", err, stderr.Bytes())
	}
	if string(out) != regData {
		t.Errorf("a process that opened the segment by name reads %q, want %q", out, regData)
	}
}

// TestRegisterCorruptHeader: a registration whose header was damaged
// (by a broken or hostile registrant) fails to import with
// ErrBadDescriptor, never a panic or an access out of range.
func TestRegisterCorruptHeader(t *testing.T) {
	owner, peer := openContext(t), openContext(t)
	s := newShmSegment(t, segName(t, "corrupt"), 4096)
	// Offsets and widths of the header's fields (register.go).
	for _, damage := range []struct {
		what       string
		off, width int
		value      uint64
	}{
		{"an unknown kind", 28, 4, 7},
		{"a target name longer than the header", 60, 4, 1 << 20},
		{"no target name", 60, 4, 0},
		{"a size beyond the target", 16, 8, 1 << 40},
		{"an offset beyond the target", 48, 8, 1 << 40},
		{"another target file", 40, 8, 12345},
		{"a target name shm never makes", 72, 4, uint64(binary.LittleEndian.Uint32([]byte("../x")))},
	} {
		reg, err := owner.RegisterSegment(s.Data()[:64], ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
		if err != nil {
			t.Fatal(err)
		}
		h, err := shm.OpenSegment(reg.Desc().Name)
		if err != nil {
			t.Fatal(err)
		}
		if damage.width == 4 {
			binary.LittleEndian.PutUint32(h.Data()[damage.off:], uint32(damage.value))
		} else {
			binary.LittleEndian.PutUint64(h.Data()[damage.off:], damage.value)
		}
		h.Close()
		if r, err := peer.ImportSegment(reg.Desc(), regToken); !errors.Is(err, ub.ErrBadDescriptor) {
			t.Errorf("import of a registration with %s: %v, want ErrBadDescriptor", damage.what, err)
			if r != nil {
				r.Close()
			}
		}
		reg.Close()
	}
}

// TestRegisterCloseEndsPeerWrites: a peer writing into registered memory
// over and over while the registrant closes the registration: once Close
// has returned, the memory is the caller's, and no write that was under
// way lands in it afterwards.
func TestRegisterCloseEndsPeerWrites(t *testing.T) {
	const size = 4 << 20
	owner, peer := openContext(t), openContext(t)
	mem := newShmSegment(t, segName(t, "late"), size).Data()[:size]
	loc, err := peer.AllocSegment(size, ub.SegmentConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range loc.Bytes() {
		loc.Bytes()[i] = 0xAA
	}
	q, err := peer.NewCQ(ub.CQConfig{Depth: 64})
	if err != nil {
		t.Fatal(err)
	}
	j, err := peer.NewJetty(ub.JettyConfig{SendCQ: q, RecvCQ: q})
	if err != nil {
		t.Fatal(err)
	}
	for trial := range 20 {
		clear(mem)
		reg, err := owner.RegisterSegment(mem, ub.SegmentConfig{Access: ub.AccessWrite, Token: regToken})
		if err != nil {
			t.Fatal(err)
		}
		r, err := peer.ImportSegment(reg.Desc(), regToken)
		if err != nil {
			t.Fatal(err)
		}
		// The writer writes until told to stop; its first completed
		// write says it is running.
		running, stop, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			defer close(stopped)
			out := make([]ub.Completion, 1)
			first := true
			for {
				select {
				case <-stop:
					return
				default:
				}
				j.PostSend([]ub.WR{{Op: ub.OpWrite, Local: ub.Local{Seg: loc, Len: size}, Remote: ub.Remote{Seg: r}}})
				q.Poll(out)
				if first {
					first = false
					close(running)
				}
			}
		}()
		<-running
		if err := reg.Close(); err != nil {
			t.Fatal(err)
		}
		clear(mem) // the memory is the caller's again
		close(stop)
		<-stopped // every write the writer started has ended
		if i := bytes.IndexByte(mem, 0xAA); i >= 0 {
			t.Fatalf("trial %d: a peer's write reached byte %d after the registration's Close returned", trial, i)
		}
		r.Close()
	}
}
