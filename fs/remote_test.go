package fs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ubkit-io/ubkit/shm"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// tcpDevice opens a context of the tcp ub provider, closed when the
// test ends.
func tcpDevice(t *testing.T) ub.Context {
	t.Helper()
	d, err := ub.Open(context.Background(), "tcp", ub.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// tcpExport serves e on a loopback TCP listener and returns a Dial that
// sends every export address there.
func tcpExport(t *testing.T, e *Exporter) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Serve(ln) }()
	t.Cleanup(func() {
		e.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
}

func TestRemoteOverTCP(t *testing.T) {
	dir := t.TempDir()
	_, want := writeFile(t, dir, 3<<20+777, 11)
	os.Rename(filepath.Join(dir, fmt.Sprintf("f-%d-11", len(want))), filepath.Join(dir, "model.bin"))
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "empty"), nil, 0o600)
	e, err := Export(dir, &ExportConfig{ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	dial := tcpExport(t, e)
	ctx := context.Background()
	var last Progress
	a, err := OpenRemote(ctx, "ub://n0/models/model.bin", &RemoteOptions{Dial: dial, Options: Options{Parallel: 3, SHA256: sum(want),
		Progress: func(p Progress) { last = p }}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !bytes.Equal(a.Bytes(), want) || a.Size() != int64(len(want)) || !a.Shared() || last.Done != int64(len(want)) {
		t.Fatalf("remote copy differs from the file (%d bytes, shared %v, progress %+v)", len(a.Bytes()), a.Shared(), last)
	}
	// A second open in this process, and a private one, agree.
	b, err := OpenRemote(ctx, "ub://n0/models/model.bin", &RemoteOptions{Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if &b.Bytes()[0] != &a.Bytes()[0] || copiesInShm(t) != 1 {
		t.Errorf("a second open of the same remote file has its own copy (%d copies)", copiesInShm(t))
	}
	p, err := OpenRemote(ctx, "ub://n0/models/model.bin", &RemoteOptions{Dial: dial, Options: Options{Private: true, Parallel: 16}})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p.Bytes(), want) || p.Shared() {
		t.Error("the private remote copy differs")
	}
	p.Close()
	z, err := OpenRemote(ctx, "ub://n0/models/sub/empty", &RemoteOptions{Dial: dial})
	if err != nil || z.Size() != 0 {
		t.Fatalf("empty remote file: %v", err)
	}
	z.Close()
	if _, err := OpenRemote(ctx, "ub://n0/models/model.bin", &RemoteOptions{Dial: dial, Options: Options{SHA256: sum(nil)}}); !errors.Is(err, ErrChecksum) {
		t.Errorf("wrong SHA-256: %v", err)
	}
	for _, bad := range []string{"ub://n0/models", "ub://n0/", "tcp://n0/x/y", "ub:///x/y", "ub://n0/m/x?y=1"} {
		if _, err := OpenRemote(ctx, bad, &RemoteOptions{Dial: dial}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestExportRefuses(t *testing.T) {
	dir := t.TempDir()
	out := t.TempDir()
	os.WriteFile(filepath.Join(out, "secret"), []byte("secret"), 0o600)
	os.WriteFile(filepath.Join(dir, "ok"), []byte("fine"), 0o600)
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.Symlink(filepath.Join(out, "secret"), filepath.Join(dir, "abs-link"))
	os.Symlink("../"+filepath.Base(out)+"/secret", filepath.Join(dir, "rel-link"))
	os.Symlink("ok", filepath.Join(dir, "in-link"))
	if err := exec.Command("mkfifo", filepath.Join(dir, "fifo")).Run(); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	e, err := Export(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := tcpExport(t, e)
	ctx := context.Background()
	for name, want := range map[string]error{
		"../" + filepath.Base(out) + "/secret": ErrDenied,
		"d/../../x":                            ErrDenied,
		"abs-link":                             ErrDenied,
		"rel-link":                             ErrDenied,
		"d":                                    ErrDenied,
		"fifo":                                 ErrDenied,
		"./ok":                                 ErrDenied,
		"missing":                              ErrNotFound,
	} {
		if _, err := OpenRemote(ctx, "ub://n0/x/"+name, &RemoteOptions{Dial: dial}); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	f, err := OpenRemote(ctx, "ub://n0/x/in-link", &RemoteOptions{Dial: dial})
	if err != nil || string(f.Bytes()) != "fine" {
		t.Fatalf("a link inside the export: %v", err)
	}
	f.Close()
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d copies left", n)
	}
}

// TestExportRefusesDevices: a device node in the export, and a link
// inside it to one, are refused as not regular files (not on another
// ground, such as a nodev mount's EACCES); a link to a device outside
// is refused as an escape. Making the node needs root (CAP_MKNOD), as
// make test has for the network namespaces' tests.
func TestExportRefusesDevices(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mknod", filepath.Join(dir, "null"), "c", "1", "3").CombinedOutput(); err != nil {
		t.Fatalf("mknod, which needs root (CAP_MKNOD): %v: %s", err, out)
	}
	os.Symlink("null", filepath.Join(dir, "null-link"))
	os.Symlink("/dev/zero", filepath.Join(dir, "zero-link"))
	e, err := Export(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	dial := tcpExport(t, e)
	for name, why := range map[string]string{
		"null":      "not a regular file",
		"null-link": "not a regular file",
		"zero-link": "escapes",
	} {
		_, err := OpenRemote(context.Background(), "ub://n0/x/"+name, &RemoteOptions{Dial: dial})
		if !errors.Is(err, ErrDenied) || !strings.Contains(fmt.Sprint(err), why) {
			t.Errorf("%s: %v, want ErrDenied because %q", name, err, why)
		}
	}
}

// hostile is an export that answers its stat honestly (a file of size
// bytes in chunks of 64 KiB, hashes of content) and then misbehaves on
// reads as bad says.
func hostile(t *testing.T, content []byte, bad func(c net.Conn, q request)) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	return fakeExport(t, func(c net.Conn) {
		for {
			q, err := readRequest(c)
			if err != nil {
				return
			}
			if q.op == opStat {
				info := statInfo{size: int64(len(content)), chunk: 64 << 10}
				for off := 0; off < len(content); off += info.chunk {
					info.hashes = append(info.hashes, xxhash.Sum64(content[off:min(off+info.chunk, len(content))]))
				}
				p := info.encode()
				c.Write(append(response{payload: uint64(len(p))}.encode(), p...))
				continue
			}
			bad(c, q)
		}
	})
}

// fakeExport listens on a local port and runs serve for each connection
// (closed after it), until the test ends; it returns a dialer of it.
func fakeExport(t *testing.T, serve func(c net.Conn)) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
}

func TestHostileExport(t *testing.T) {
	content := make([]byte, 300<<10)
	for i := range content {
		content[i] = byte(i * 13)
	}
	ctx := context.Background()
	for name, bad := range map[string]func(c net.Conn, q request){
		"wrong data": func(c net.Conn, q request) {
			b := bytes.Clone(content[q.off : q.off+q.len])
			b[len(b)/2] ^= 1
			c.Write(append(response{payload: q.len}.encode(), b...))
		},
		"long payload": func(c net.Conn, q request) {
			c.Write(append(response{payload: q.len + 8}.encode(), make([]byte, q.len+8)...))
		},
		"short payload": func(c net.Conn, q request) {
			c.Write(append(response{payload: q.len}.encode(), content[q.off:q.off+q.len/2]...))
			c.Close()
		},
		"bad magic": func(c net.Conn, q request) {
			c.Write(make([]byte, respSize))
		},
		"huge message": func(c net.Conn, q request) {
			r := response{}.encode()
			binary.LittleEndian.PutUint16(r[6:], 60000)
			c.Write(r)
		},
		"unknown status": func(c net.Conn, q request) {
			c.Write(response{status: 99}.encode())
		},
		"silent": func(c net.Conn, q request) {},
	} {
		t.Run(name, func(t *testing.T) {
			dial := hostile(t, content, bad)
			for _, private := range []bool{false, true} {
				_, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, RequestTimeout: 500 * time.Millisecond,
					Options: Options{Private: private}})
				if !errors.Is(err, ErrRemote) && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("private %v: %v, want ErrRemote", private, err)
				}
			}
			if n := copiesInShm(t); n != 0 {
				t.Errorf("%d copies left", n)
			}
		})
	}
	// A stat that lies about its own shape.
	for name, stat := range map[string][]byte{
		"hash count": statInfo{size: 1 << 20, chunk: 64 << 10, hashes: make([]uint64, 3)}.encode(),
		"tiny chunk": statInfo{size: 10, chunk: 512, hashes: make([]uint64, 1)}.encode(),
		"negative":   statInfo{size: -5, chunk: 64 << 10}.encode(),
		"short":      {1, 2, 3},
	} {
		if _, err := decodeStat(stat); !errors.Is(err, ErrRemote) {
			t.Errorf("stat %s: %v, want ErrRemote", name, err)
		}
	}
}

// TestConsistentLiar: an export that serves other content than the
// caller expects, with hashes to match, is the file as far as the chunk
// hashes can tell (docs/fs.md); Options.SHA256 from the caller's own
// source refuses it, and no copy is left to share.
func TestConsistentLiar(t *testing.T) {
	ctx := context.Background()
	truth := make([]byte, 200<<10)
	for i := range truth {
		truth[i] = byte(i * 11)
	}
	lie := bytes.Clone(truth)
	lie[len(lie)/3] ^= 0x40
	dial := hostile(t, lie, func(c net.Conn, q request) {
		c.Write(append(response{payload: q.len}.encode(), lie[q.off:q.off+q.len]...))
	})
	f, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, Options: Options{Private: true}})
	if err != nil {
		t.Fatalf("an export consistent with its own hashes: %v", err)
	}
	if !bytes.Equal(f.Bytes(), lie) {
		t.Fatal("the copy is not what the export served")
	}
	f.Close()
	for _, private := range []bool{false, true} {
		_, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, Options: Options{Private: private, SHA256: sum(truth)}})
		if !errors.Is(err, ErrChecksum) {
			t.Errorf("private %v: the lie against the caller's SHA-256: %v, want ErrChecksum", private, err)
		}
	}
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d copies left", n)
	}
}

// TestHostileOneSided: an export that offers one-sided reads of
// memory that is not the file, smaller than it, behind a wrong token or
// a dead context, or that answers the map request with garbage, gets an
// error and no copy; one whose descriptor this side's provider cannot
// import is read through the connection.
func TestHostileOneSided(t *testing.T) {
	ctx := context.Background()
	srv, cli := tcpDevice(t), tcpDevice(t)
	content := make([]byte, 300<<10)
	for i := range content {
		content[i] = byte(i * 7)
	}
	info := statInfo{size: int64(len(content)), chunk: 64 << 10}
	for off := 0; off < len(content); off += info.chunk {
		info.hashes = append(info.hashes, xxhash.Sum64(content[off:min(off+info.chunk, len(content))]))
	}
	register := func(mem []byte, token ub.Token) ub.SegmentDesc {
		seg, err := srv.RegisterSegment(mem, ub.SegmentConfig{Access: ub.AccessRead, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { seg.Close() })
		return seg.Desc()
	}
	answer := func(c net.Conn, m mapInfo) {
		m.idle, m.stat = 60000, info
		p := m.encode()
		c.Write(append(response{payload: uint64(len(p))}.encode(), p...))
	}
	wrong := bytes.Clone(content)
	wrong[200<<10] ^= 1
	dead := func() ub.SegmentDesc {
		d, err := ub.Open(ctx, "tcp", ub.Config{})
		if err != nil {
			t.Fatal(err)
		}
		seg, err := d.RegisterSegment(bytes.Clone(content), ub.SegmentConfig{Access: ub.AccessRead, Token: 5})
		if err != nil {
			t.Fatal(err)
		}
		desc := seg.Desc()
		d.Close()
		return desc
	}()
	var silentMaps atomic.Int32
	for name, c := range map[string]struct {
		mapped func(c net.Conn)
		ok     bool // the load succeeds (through the connection)
	}{
		"wrong data": {mapped: func(c net.Conn) { answer(c, mapInfo{token: 1, desc: register(wrong, 1)}) }},
		"small segment": {mapped: func(c net.Conn) {
			d := register(bytes.Clone(content[:100<<10]), 2)
			d.Size = len(content)
			answer(c, mapInfo{token: 2, desc: d})
		}},
		"wrong token":  {mapped: func(c net.Conn) { answer(c, mapInfo{token: 4, desc: register(bytes.Clone(content), 3)}) }},
		"dead context": {mapped: func(c net.Conn) { answer(c, mapInfo{token: 5, desc: dead}) }},
		"garbage": {mapped: func(c net.Conn) {
			c.Write(append(response{payload: 40}.encode(), make([]byte, 40)...))
		}},
		"other provider": {mapped: func(c net.Conn) {
			answer(c, mapInfo{token: 6, desc: ub.SegmentDesc{Provider: "shm", Name: "nothing", Size: len(content)}})
		}, ok: true},
		// A map that never gets its answer (a load slower than the
		// client waits): read through a fresh connection, without
		// asking again (silentMaps counts).
		"silent map": {mapped: func(c net.Conn) { silentMaps.Add(1) }, ok: true},
	} {
		t.Run(name, func(t *testing.T) {
			dial := hostile(t, content, func(conn net.Conn, q request) {
				switch q.op {
				case opMap:
					c.mapped(conn)
				case opPing:
					conn.Write(response{}.encode())
				case opRead:
					conn.Write(append(response{payload: q.len}.encode(), content[q.off:q.off+q.len]...))
				}
			})
			for _, private := range []bool{false, true} {
				f, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, Device: cli, RequestTimeout: 500 * time.Millisecond,
					Options: Options{Private: private}})
				switch {
				case c.ok && err != nil:
					t.Errorf("private %v: %v", private, err)
				case c.ok:
					if !bytes.Equal(f.Bytes(), content) {
						t.Errorf("private %v: the copy differs from the content", private)
					}
					f.Close()
				case !errors.Is(err, ErrRemote):
					t.Errorf("private %v: %v, want ErrRemote", private, err)
				default:
					t.Logf("private %v: %v", private, err)
				}
			}
			if n := copiesInShm(t); n != 0 {
				t.Errorf("%d copies left", n)
			}
			if n := silentMaps.Load(); name == "silent map" && n != 2 {
				t.Errorf("%d map requests for two loads, want one each", n)
			}
		})
	}
}

func TestExportBounds(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), make([]byte, 100<<10), 0o600)
	e, err := Export(dir, &ExportConfig{MaxConns: 1, IdleTimeout: 200 * time.Millisecond, ChunkSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	dial := tcpExport(t, e)
	ctx := context.Background()
	// One connection held open takes the only place.
	held, err := dial(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	r := &remote{path: "f", timeout: 5 * time.Second}
	if _, err := r.do(held, request{op: opStat, path: "f"}); err != nil {
		t.Fatal(err)
	}
	io.CopyN(io.Discard, held, 24+16)
	if _, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial}); !errors.Is(err, ErrBusy) {
		t.Errorf("over MaxConns: %v, want ErrBusy", err)
	}
	// Requests the export refuses: a read past the end or longer than a
	// chunk (answered; the connection stays), then garbage (answered, and
	// the connection is closed).
	for _, q := range []request{{op: opRead, path: "f", off: 90 << 10, len: 64 << 10}, {op: opRead, path: "f", len: 128 << 10}} {
		if _, err := r.do(held, q); !errors.Is(err, ErrRemote) {
			t.Errorf("%+v: %v, want ErrRemote", q, err)
		}
	}
	held.Write([]byte("GARBAGE GARBAGE GARBAGE GARBAGE"))
	if resp, err := readResponse(held); err != nil || resp.status != statusBad {
		t.Errorf("garbage: %+v, %v", resp, err)
	}
	if _, err := held.Read(make([]byte, 1)); err == nil {
		t.Error("the connection stayed open after garbage")
	}
	held.Close()
	// An idle connection is dropped after IdleTimeout: the place is free
	// again.
	idle, err := dial(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := idle.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("idle connection: %v, want EOF once the export drops it", err)
	}
	if _, err := Export(dir, &ExportConfig{ChunkSize: 1000}); err == nil {
		t.Error("a chunk size off 4 KiB was taken")
	}
}

func FuzzWire(f *testing.F) {
	f.Add(request{op: opRead, path: "a/b", off: 4096, len: 8192}.encode())
	f.Add(response{status: 1, msg: "no", payload: 3}.encode())
	f.Add(statInfo{size: 100, chunk: 64 << 10, hashes: []uint64{7}}.encode())
	f.Add(request{op: opPing}.encode())
	f.Add(mapInfo{idle: 1000, token: 9, desc: ub.SegmentDesc{Provider: "tcp", Name: "127.0.0.1:1/7", Size: 100},
		stat: statInfo{size: 100, chunk: 64 << 10, hashes: []uint64{7}}}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		if q, err := readRequest(bytes.NewReader(b)); err == nil {
			if len(q.path) == 0 && q.op != opPing || len(q.path) > maxPath || q.op == opRead && (q.len == 0 || q.len > maxChunk) {
				t.Fatalf("accepted %+v", q)
			}
		}
		if r, err := readResponse(bytes.NewReader(b)); err == nil && len(r.msg) > maxMessage {
			t.Fatalf("message of %d bytes", len(r.msg))
		}
		if m, err := decodeMap(b); err == nil {
			if m.desc.Size < int(m.stat.size) || m.stat.size == 0 || m.desc.Provider == "" || len(m.desc.Name) > maxDescName {
				t.Fatalf("accepted %+v", m)
			}
		}
		if s, err := decodeStat(b); err == nil {
			if int64(len(s.hashes)) != (s.size+int64(s.chunk)-1)/int64(s.chunk) || s.chunk < minChunk {
				t.Fatalf("accepted %+v", s)
			}
		}
	})
}

// TestRemoteOverUB reads a file exported by node n0 of the simulated
// dev4 super node from node n1, over transport's ub path.
func TestRemoteOverUB(t *testing.T) {
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("fsremote-%d", os.Getpid())
	fab, err := simprov.OpenFabricNamed(topo, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { fab.Remove(); fab.Close() }()
	rundir := t.TempDir()
	eps := map[string]*transport.Endpoint{}
	for _, n := range []string{"n0", "n1"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: rundir,
			ProviderOptions: map[string]string{simprov.OptFabric: name}})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		eps[n] = ep
	}
	dir := t.TempDir()
	path, want := writeFile(t, dir, 2<<20+5, 12)
	e, err := Export(dir, &ExportConfig{ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := eps["n0"].Listen(context.Background(), "ub://n0/models")
	if err != nil {
		t.Fatal(err)
	}
	go e.Serve(ln)
	defer e.Close()
	var paths sync.Map
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := eps["n1"].Dial(ctx, addr)
		if err == nil {
			paths.Store(c.Path(), true)
		}
		return c, err
	}
	// One-sided reads into the shared copy (the default on the ub
	// path); a private copy, which the shm provider under sim cannot
	// register, through the connections (the export not asked); and
	// through the connections when told to. Each copy closed before the
	// next load, which is a load then.
	for _, c := range []struct {
		name            string
		private, stream bool
		maps, streamed  int64
	}{
		{"one-sided", false, false, 1, 0},
		{"private", true, false, 0, int64(len(want))},
		{"stream only", false, true, 0, int64(len(want))},
	} {
		before := e.Stats()
		f, err := OpenRemote(context.Background(), "ub://n0/models/"+filepath.Base(path), &RemoteOptions{
			Options: Options{Private: c.private}, Dial: dial, StreamOnly: c.stream})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(f.Bytes(), want) {
			t.Fatalf("%s: the copy read over the ub path differs from the file", c.name)
		}
		f.Close()
		st := e.Stats()
		if maps, streamed := st.Maps-before.Maps, st.Streamed-before.Streamed; maps != c.maps || streamed != c.streamed {
			t.Errorf("%s: the export made %d registrations and streamed %d bytes, want %d and %d", c.name, maps, streamed, c.maps, c.streamed)
		}
	}
	if _, ok := paths.Load(transport.PathUB); !ok {
		t.Error("no connection took the ub path")
	}
	// The file stayed loaded between the loads (Linger), and goes with
	// the export.
	if st := e.Stats(); st.Loads != 1 || st.Loaded != int64(len(want)) {
		t.Errorf("export: %+v, want one load still held", st)
	}
	e.Close()
	if st := e.Stats(); st.Loaded != 0 {
		t.Errorf("closed export: %+v, want nothing loaded", st)
	}
}

// TestExportLinger: without Linger, a file is let go with its last
// reader's connection; with it, until Linger ends or a load needs the
// room.
func TestExportLinger(t *testing.T) {
	ctx := context.Background()
	d := tcpDevice(t)
	dir := t.TempDir()
	p1, want1 := writeFile(t, dir, 300<<10, 1)
	p2, want2 := writeFile(t, dir, 200<<10, 2)
	for _, c := range []struct {
		name   string
		linger time.Duration
		max    int64
		loads  int64 // after reading f1, f1, f2, f1
	}{
		{"none", -1, 0, 4},
		{"long", time.Hour, 0, 2},
		{"room for one", time.Hour, 400 << 10, 3},
		{"short", 20 * time.Millisecond, 0, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := Export(dir, &ExportConfig{Device: d, ChunkSize: 64 << 10, Linger: c.linger, MaxLoaded: c.max})
			if err != nil {
				t.Fatal(err)
			}
			o := &RemoteOptions{Device: d, Options: Options{Private: true}, Dial: tcpExport(t, e)}
			for _, r := range []struct {
				path string
				want []byte
			}{{p1, want1}, {p1, want1}, {p2, want2}, {p1, want1}} {
				f, err := OpenRemote(ctx, "ub://n0/x/"+filepath.Base(r.path), o)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(f.Bytes(), r.want) {
					t.Fatal("the copy differs from the file")
				}
				f.Close()
				// The export lets go of the registration when it sees
				// the connection end, after OpenRemote returned.
				waitFor(t, "the connection to end", func() bool { return e.Stats().Conns == 0 })
				if c.linger < 0 && e.Stats().Loaded != 0 {
					t.Fatalf("%d bytes loaded without a reader nor Linger", e.Stats().Loaded)
				}
				if c.max > 0 && e.Stats().Loaded > c.max {
					t.Fatalf("%d bytes loaded, more than MaxLoaded", e.Stats().Loaded)
				}
			}
			if st := e.Stats(); c.loads >= 0 && st.Loads != c.loads {
				t.Errorf("%d loads, want %d", st.Loads, c.loads)
			}
			if c.linger > 0 && c.linger < time.Second {
				waitFor(t, "the lingering loads to go", func() bool { return e.Stats().Loaded == 0 })
			}
		})
	}
}

// waitFor polls cond every 10 ms for 10 s at most.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(10 * time.Second); !cond(); <-tick.C {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestRemoteReviewCases: a busy export refusing extra connections slows a
// load down instead of failing it; one bad chunk ends the load at once,
// not at the other requests' timeouts; a stat claiming a huge file is
// refused before anything is allocated; a client Authorize refuses learns
// nothing of what exists; Close does not wait for a stat hashing a huge
// file.
func TestRemoteReviewCases(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	_, want := writeFile(t, dir, 1<<20, 51)
	name := fmt.Sprintf("f-%d-51", len(want))

	t.Run("busy", func(t *testing.T) {
		e, err := Export(dir, &ExportConfig{MaxConns: 2, ChunkSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		dial := tcpExport(t, e)
		f, err := OpenRemote(ctx, "ub://n0/x/"+name, &RemoteOptions{Dial: dial, Options: Options{Parallel: 6, Private: true}})
		if err != nil {
			t.Fatalf("with MaxConns 2 and 6 stripes: %v", err)
		}
		if !bytes.Equal(f.Bytes(), want) {
			t.Error("content differs")
		}
		f.Close()
	})

	t.Run("fail fast", func(t *testing.T) {
		content := make([]byte, 1<<20)
		var once sync.Once
		badClosed := make(chan struct{})
		dialHostile := hostile(t, content, func(c net.Conn, q request) {
			bad := false
			once.Do(func() { bad = true })
			if bad {
				c.Write(append(response{payload: q.len}.encode(), bytes.Repeat([]byte{0xff}, int(q.len))...)) // wrong data
				// Until the client drops this connection.
				io.Copy(io.Discard, c)
				close(badClosed)
				return
			}
			// the other connections never answer
		})
		// Only the stat's connection is made at once, so the bad answer is
		// its first chunk's; the others are dialled after the client gave
		// up on that one: a connection made after the load ended must not
		// wait out its request's timeout.
		var dials atomic.Int32
		dial := func(ctx context.Context, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				select {
				case <-badClosed:
				case <-time.After(15 * time.Second):
					return nil, errors.New("the client kept the connection that answered wrong data")
				}
				ctx = context.Background()
			}
			return dialHostile(ctx, addr)
		}
		start := time.Now()
		_, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, RequestTimeout: 20 * time.Second,
			Options: Options{Parallel: 4, Private: true}})
		if err == nil {
			t.Fatal("no error")
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the load failed after %v, waiting for the other requests' timeouts", took)
		}
		// The bad chunk's error, not one of the requests it ended.
		if !strings.Contains(err.Error(), "does not match its hash") {
			t.Errorf("the load failed with %v, not the bad chunk's error", err)
		}
	})

	t.Run("huge stat", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					if _, err := readRequest(c); err != nil {
						return
					}
					n := uint32(1 << 20)
					p := statInfo{size: 1 << 46, chunk: 64 << 20}.encode()
					binary.LittleEndian.PutUint32(p[20:], n)
					p = append(p, make([]byte, 8*int(n))...)
					c.Write(append(response{payload: uint64(len(p))}.encode(), p...))
					io.Copy(io.Discard, c)
				}()
			}
		}()
		dial := func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", ln.Addr().String())
		}
		for _, private := range []bool{true, false} {
			if _, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, Options: Options{Private: private}}); !errors.Is(err, ErrRemote) && err == nil {
				t.Errorf("private %v: a 64 TiB file was taken", private)
			} else if err == nil || strings.Contains(err.Error(), "bad address") {
				t.Errorf("private %v: %v", private, err)
			}
		}
		if n := copiesInShm(t); n != 0 {
			t.Errorf("%d copies left", n)
		}
	})

	t.Run("authorize first", func(t *testing.T) {
		e, err := Export(dir, &ExportConfig{Authorize: func(net.Conn, string) error { return errors.New("no") }})
		if err != nil {
			t.Fatal(err)
		}
		dial := tcpExport(t, e)
		var msgs []string
		for _, p := range []string{name, "missing"} {
			_, err := OpenRemote(ctx, "ub://n0/x/"+p, &RemoteOptions{Dial: dial})
			if !errors.Is(err, ErrDenied) {
				t.Errorf("%s: %v, want ErrDenied", p, err)
			}
			msgs = append(msgs, strings.ReplaceAll(fmt.Sprint(err), p, "P"))
		}
		if msgs[0] != msgs[1] {
			t.Errorf("a refused client tells an existing file from a missing one: %q, %q", msgs[0], msgs[1])
		}
	})

	t.Run("close while hashing", func(t *testing.T) {
		big := filepath.Join(t.TempDir(), "sparse")
		f, err := os.Create(big)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(64 << 30) // 64 GiB of holes: hashing it takes a long while
		f.Close()
		e, err := Export(filepath.Dir(big), nil)
		if err != nil {
			t.Fatal(err)
		}
		dial := tcpExport(t, e)
		c, err := dial(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(request{op: opStat, path: "sparse"}.encode())
		// The stat is being computed once the export has the request;
		// the connection answering nothing for a moment says so.
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the stat of 64 GiB answered at once: %v", err)
		}
		start := time.Now()
		e.Close()
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Close took %v while a stat hashed a 64 GiB file", took)
		}
	})
}

// readBytes is this process's read_bytes of /proc/self/io: the bytes it
// made the kernel fetch from storage.
func readBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "read_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no read_bytes in /proc/self/io")
	return 0
}

// TestExportReadsDiskOnce: five nodes read one file of an export at
// once, three with one-sided reads (each its own tcp provider context,
// as on its own node) and two through their connections; the file,
// out of the page cache at the start, is read from the disk once, not
// once per node.
func TestExportReadsDiskOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, want := writeFile(t, dir, 48<<20+5, 77)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil { // clean pages, which Evict drops
		t.Fatal(err)
	}
	f.Close()
	if free, err := shm.FreeSpace(); err != nil || free < 256<<20 {
		t.Fatalf("%s has %d bytes free (%v): this test needs 256 MiB there for the export's copy", shm.ShmDir, free, err)
	}
	e, err := Export(dir, &ExportConfig{Device: tcpDevice(t), ChunkSize: 1 << 20, MaxLoaded: 128 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dial := tcpExport(t, e)
	if err := Evict(path); err != nil {
		t.Fatal(err)
	}
	before := readBytes(t)
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		o := &RemoteOptions{Options: Options{Private: true}, Dial: dial, StreamOnly: i >= 3}
		if i < 3 {
			o.Device = tcpDevice(t)
		}
		wg.Go(func() {
			f, err := OpenRemote(ctx, "ub://n0/x/"+filepath.Base(path), o)
			if err == nil {
				if !bytes.Equal(f.Bytes(), want) {
					err = fmt.Errorf("node %d: the copy differs from the file", i)
				}
				f.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	read := readBytes(t) - before
	t.Logf("%d bytes read from the disk for 5 reads of %d", read, len(want))
	if read < int64(len(want))/2 {
		t.Fatalf("only %d bytes of the %d-byte file came from the disk: it was not out of the page cache, so this measures nothing; the test needs a temporary directory on a disk file system, not tmpfs (%s; set TMPDIR)", read, len(want), dir)
	}
	if read > int64(len(want))*3/2 {
		t.Errorf("%d bytes read from the disk for a %d-byte file read by 5 nodes", read, len(want))
	}
	// One load for the three one-sided readers, whether they overlapped
	// or came after each other (it lingers).
	if st := e.Stats(); st.Maps != 3 || st.Loads != 1 || st.Streamed != 2*int64(len(want)) {
		t.Errorf("export: %+v, want 3 registrations of one load and 2 files streamed", st)
	}
}

// TestRemoteKeepAlive: a one-sided load that takes longer than the
// export's idle timeout keeps its registration (the client pings the
// connection that holds it).
func TestRemoteKeepAlive(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path, want := writeFile(t, dir, 2<<20, 78)
	const idle = 300 * time.Millisecond
	// No Linger: the file would stay loaded without the connection.
	e, err := Export(dir, &ExportConfig{Device: tcpDevice(t), ChunkSize: 64 << 10, IdleTimeout: idle, Linger: -1})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	f, err := OpenRemote(ctx, "ub://n0/x/"+filepath.Base(path), &RemoteOptions{
		Options: Options{Parallel: 2, Progress: func(Progress) {
			// A slow consumer of progress holds the load up for four
			// idle timeouts after its first chunk.
			once.Do(func() { <-time.After(4 * idle) })
		}},
		Dial:   tcpExport(t, e),
		Device: tcpDevice(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !bytes.Equal(f.Bytes(), want) {
		t.Fatal("the copy differs from the file")
	}
	if st := e.Stats(); st.Maps != 1 || st.Streamed != 0 {
		t.Errorf("export: %+v, want one registration and nothing streamed", st)
	}
}

// TestExportMapRefusals: what keeps an export from one-sided reads of a
// file (bigger than MaxLoaded, no room beside the files being read) has
// the client read through the connection, and a refused load lets no
// lingering file go; a connection holds at most 4 registrations.
func TestExportMapRefusals(t *testing.T) {
	ctx := context.Background()
	d := tcpDevice(t)
	dir := t.TempDir()
	small, wantSmall := writeFile(t, dir, 300<<10, 3)
	big, wantBig := writeFile(t, dir, 600<<10, 4)
	e, err := Export(dir, &ExportConfig{Device: d, ChunkSize: 64 << 10, Linger: time.Hour, MaxLoaded: 500 << 10})
	if err != nil {
		t.Fatal(err)
	}
	dial := tcpExport(t, e)
	o := &RemoteOptions{Device: d, Options: Options{Private: true}, Dial: dial}
	held := 0 // connections the test holds open
	read := func(path string, want []byte) {
		t.Helper()
		f, err := OpenRemote(ctx, "ub://n0/x/"+filepath.Base(path), o)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if !bytes.Equal(f.Bytes(), want) {
			t.Fatal("the copy differs from the file")
		}
		waitFor(t, "its connection to end", func() bool { return e.Stats().Conns == held })
	}
	read(small, wantSmall) // loaded, then lingering
	before := e.Stats()
	read(big, wantBig) // bigger than MaxLoaded: streamed
	st := e.Stats()
	if st.Maps != before.Maps || st.Streamed-before.Streamed != int64(len(wantBig)) {
		t.Errorf("the big file: %d registrations and %d bytes streamed, want none and all", st.Maps-before.Maps, st.Streamed-before.Streamed)
	}
	if st.Loaded != int64(len(wantSmall)) {
		t.Errorf("%d bytes loaded after a refused load, want the lingering %d", st.Loaded, len(wantSmall))
	}

	// No room beside a file being read: a connection holds the small
	// file's registration while another of its size is read.
	holder, err := dial(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&remote{path: filepath.Base(small)}).mapFile(holder, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	held = 1
	other, wantOther := writeFile(t, dir, 300<<10, 5)
	before = e.Stats()
	read(other, wantOther)
	st = e.Stats()
	if st.Maps != before.Maps || st.Streamed-before.Streamed != int64(len(wantOther)) || st.Loaded != int64(len(wantSmall)) {
		t.Errorf("beside a held file: %d registrations, %d bytes streamed, %d loaded; want none, %d, %d",
			st.Maps-before.Maps, st.Streamed-before.Streamed, st.Loaded, len(wantOther), len(wantSmall))
	}
	holder.Close()

	// Five maps on one connection: the fifth is refused.
	c, err := dial(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &remote{timeout: 5 * time.Second, path: filepath.Base(small)}
	for i := range 5 {
		_, err := r.mapFile(c, 5*time.Second)
		if i < 4 && err != nil || i == 4 && !errors.Is(err, ErrBusy) {
			t.Fatalf("map %d on one connection: %v", i+1, err)
		}
	}
}

// TestRemoteCancelCause: a load whose ctx ends says so with the ctx's
// cause, whether it ended while the stat was waited for or while chunks
// were read.
func TestRemoteCancelCause(t *testing.T) {
	for _, stage := range []string{"stat", "chunks"} {
		t.Run(stage, func(t *testing.T) {
			asked := make(chan struct{}, 16)
			var dial func(ctx context.Context, addr string) (net.Conn, error)
			if stage == "chunks" {
				// Stats answered, chunk requests never.
				dial = hostile(t, make([]byte, 1<<20), func(net.Conn, request) { asked <- struct{}{} })
			} else {
				dial = silent(t, asked)
			}
			cause := errors.New("the caller gave up")
			ctx, cancel := context.WithCancelCause(context.Background())
			go func() {
				<-asked
				cancel(cause)
			}()
			_, err := OpenRemote(ctx, "ub://n0/x/f", &RemoteOptions{Dial: dial, RequestTimeout: time.Minute,
				Options: Options{Parallel: 4, Private: true}})
			if !errors.Is(err, cause) {
				t.Fatalf("the load ended with %v, not the ctx's cause", err)
			}
		})
	}
}

// silent is a dialer of an export that reads requests and never answers
// them, telling asked of each connection's first bytes.
func silent(t *testing.T, asked chan<- struct{}) func(ctx context.Context, addr string) (net.Conn, error) {
	t.Helper()
	return fakeExport(t, func(c net.Conn) {
		if _, err := c.Read(make([]byte, 1)); err == nil {
			asked <- struct{}{}
		}
		io.Copy(io.Discard, c)
	})
}
