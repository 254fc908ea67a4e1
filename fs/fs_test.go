package fs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// TestMain gives the tests (and the children they start, through the
// environment) a /dev/shm of their own: they count the shared copies
// there, and other packages' tests running at once make copies too.
func TestMain(m *testing.M) {
	dir := os.Getenv("FS_TEST_SHMDIR")
	mine := dir == ""
	if mine {
		// Directories of earlier runs that were killed before their
		// teardown (named after their process) go first.
		old, _ := filepath.Glob(filepath.Join(shm.ShmDir, "ubkit-fs-test-*"))
		for _, d := range old {
			pid := strings.SplitN(strings.TrimPrefix(filepath.Base(d), "ubkit-fs-test-"), "-", 2)[0]
			if _, err := os.Stat("/proc/" + pid); err != nil || pid == "" {
				os.RemoveAll(d)
			}
		}
		var err error
		if dir, err = os.MkdirTemp(shm.ShmDir, fmt.Sprintf("ubkit-fs-test-%d-", os.Getpid())); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Setenv("FS_TEST_SHMDIR", dir)
	}
	orig := shm.ShmDir
	shm.ShmDir = dir
	testenv.Main(m, func() {
		// Left behind in it is a leak (the tests count copies there);
		// testenv's own check then looks at the real directory.
		if mine {
			if left, _ := os.ReadDir(dir); len(left) > 0 {
				fmt.Fprintf(os.Stderr, "fs tests left %d files in %s\n", len(left), dir)
			}
			os.RemoveAll(dir)
		}
		shm.ShmDir = orig
	})
}

// writeFile writes n random bytes (seeded) to a new file in dir.
func writeFile(t testing.TB, dir string, n int, seed uint64) (string, []byte) {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	p := filepath.Join(dir, fmt.Sprintf("f-%d-%d", n, seed))
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestOpenEveryWay(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for _, n := range []int{0, 1, 4095, 4096, 70 << 10, 5<<20 + 123} {
		path, want := writeFile(t, dir, n, uint64(n))
		for _, o := range []Options{
			{},
			{Method: Map},
			{Method: Map, NoPopulate: true},
			{Method: Copy},
			{Method: Copy, Private: true},
			{Method: Copy, Direct: true, ChunkSize: 64 << 10, Parallel: 3},
			{Method: Copy, SHA256: sum(want)},
			{Method: Map, SHA256: strings.ToUpper(sum(want))},
		} {
			t.Run(fmt.Sprintf("%d/%v", n, o), func(t *testing.T) {
				var last Progress
				calls := 0
				o.Progress = func(p Progress) {
					if p.Done < last.Done || p.Total != int64(n) || p.Done > p.Total {
						t.Errorf("progress %+v after %+v", p, last)
					}
					last = p
					calls++
				}
				f, err := Open(ctx, path, &o)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(f.Bytes(), want) || f.Size() != int64(n) {
					t.Fatalf("content of %d bytes differs (got %d)", n, len(f.Bytes()))
				}
				if calls == 0 || last.Done != int64(n) {
					t.Errorf("progress ended at %+v after %d calls", last, calls)
				}
				if n > 10 {
					p := make([]byte, 10)
					if k, err := f.ReadAt(p, int64(n-5)); k != 5 || err != io.EOF || !bytes.Equal(p[:5], want[n-5:]) {
						t.Errorf("ReadAt at the end: %d, %v", k, err)
					}
				}
				if m := f.Method(); m != Map && m != Copy {
					t.Errorf("method %v", m)
				}
				if err := f.Close(); err != nil {
					t.Fatal(err)
				}
				if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
					t.Errorf("ReadAt after Close: %v", err)
				}
			})
		}
	}
}

func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if _, err := Open(ctx, dir, nil); !errors.Is(err, ErrNotRegular) {
		t.Errorf("a directory: %v, want ErrNotRegular", err)
	}
	if _, err := Open(ctx, filepath.Join(dir, "none"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
	path, _ := writeFile(t, dir, 100<<10, 1)
	for _, m := range []Method{Map, Copy} {
		if _, err := Open(ctx, path, &Options{Method: m, SHA256: strings.Repeat("0", 64)}); !errors.Is(err, ErrChecksum) {
			t.Errorf("%v with the wrong SHA-256: %v, want ErrChecksum", m, err)
		}
	}
	for _, o := range []Options{{Method: 7}, {Parallel: -1}, {ChunkSize: 100}, {SHA256: "xyz"}} {
		if _, err := Open(ctx, path, &o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	// No shared copy is left behind by the failures.
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d shared copies left", n)
	}
}

// copiesInShm counts this user's shared copies in /dev/shm.
func copiesInShm(t testing.TB) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(shm.ShmDir, shm.NamePrefix+strconv.Itoa(os.Geteuid())+"-fs-*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

func TestSharedCopyIsReadOnlyAndOnce(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	path, want := writeFile(t, dir, 1<<20, 2)
	a, err := Open(ctx, path, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(ctx, path, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	if &a.Bytes()[0] != &b.Bytes()[0] || !a.Shared() {
		t.Error("two Opens of a file in one process have two copies")
	}
	if n := copiesInShm(t); n != 1 {
		t.Errorf("%d shared copies, want 1", n)
	}
	old := debug.SetPanicOnFault(true)
	faulted := func() (f bool) {
		defer func() { f = recover() != nil }()
		a.Bytes()[10]++
		return false
	}()
	debug.SetPanicOnFault(old)
	if !faulted || !bytes.Equal(b.Bytes(), want) {
		t.Error("a write to the shared copy did not fault")
	}
	a.Close()
	if n := copiesInShm(t); n != 1 {
		t.Errorf("%d shared copies with one File open, want 1", n)
	}
	b.Close()
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d shared copies after the last Close, want 0", n)
	}
	// A file changed on disk is another copy.
	c, err := Open(ctx, path, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want2 := bytes.Clone(want)
	want2[0] ^= 0xff
	later := time.Now().Add(time.Second)
	if err := os.WriteFile(path, want2, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(path, later, later)
	d, err := Open(ctx, path, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if !bytes.Equal(d.Bytes(), want2) || !bytes.Equal(c.Bytes(), want) {
		t.Error("the changed file's copy is not its new content, or the old copy changed")
	}
	if n := copiesInShm(t); n != 2 {
		t.Errorf("%d shared copies of two contents, want 2", n)
	}
}

func TestOpenCanceled(t *testing.T) {
	dir := t.TempDir()
	path, _ := writeFile(t, dir, 1<<20, 3)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, o := range []Options{{Method: Copy}, {Method: Map}, {Method: Copy, Private: true}} {
		if _, err := Open(ctx, path, &o); !errors.Is(err, context.Canceled) {
			t.Errorf("%v: %v, want context.Canceled", o.Method, err)
		}
	}
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d shared copies left", n)
	}
}

func init() {
	testenv.RegisterChild("fs-holder", fsHolderChild)
	testenv.RegisterChild("fs-stuck-loader", fsStuckLoaderChild)
}

// fsHolderChild opens FS_PATH by FS_METHOD, prints "ready <sha256>", and
// holds the file until its standard input ends.
func fsHolderChild() int {
	m, _ := strconv.Atoi(os.Getenv("FS_METHOD"))
	f, err := Open(context.Background(), os.Getenv("FS_PATH"), &Options{Method: Method(m), Private: os.Getenv("FS_PRIVATE") != ""})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("ready", sum(f.Bytes()))
	io.Copy(io.Discard, os.Stdin)
	if err := f.Close(); err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

// fsStuckLoaderChild loads FS_PATH into a shared copy and stops for good
// after its first chunk, saying "stuck".
func fsStuckLoaderChild() int {
	stop := func(off int64) {
		fmt.Println("stuck")
		select {}
	}
	testAfterChunk.Store(&stop)
	_, err := Open(context.Background(), os.Getenv("FS_PATH"), &Options{Method: Copy, Parallel: 1, ChunkSize: 64 << 10})
	fmt.Println("error", err)
	return 1
}

// holder is a child process holding a file open.
type holder struct {
	pid   int
	stdin io.Closer
	out   *bufio.Scanner
	wait  func() error
}

func startHolder(t *testing.T, path string, m Method, private bool) *holder {
	t.Helper()
	env := []string{"FS_PATH=" + path, "FS_METHOD=" + strconv.Itoa(int(m))}
	if private {
		env = append(env, "FS_PRIVATE=1")
	}
	cmd := testenv.Child(t, "fs-holder", env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return &holder{pid: cmd.Process.Pid, stdin: in, out: bufio.NewScanner(out), wait: cmd.Wait}
}

// line is the holder's next line of output.
func (h *holder) line(t *testing.T) string {
	t.Helper()
	if !h.out.Scan() {
		t.Fatalf("child %d said nothing: %v", h.pid, h.out.Err())
	}
	return h.out.Text()
}

// pss sums the Pss of pid's mappings whose path contains match, in bytes
// (match "": of its anonymous memory).
func pss(t *testing.T, pid int, match string) int64 {
	t.Helper()
	if match == "" {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "Pss_Anon:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
		t.Fatalf("no Pss_Anon in /proc/%d/smaps_rollup", pid)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	in := false
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = len(f) >= 6 && strings.Contains(strings.Join(f[5:], " "), match)
			continue
		}
		if in && len(f) == 3 && f[0] == "Pss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			total += kb << 10
		}
	}
	return total
}

func TestOneCopyPerHost(t *testing.T) {
	dir := t.TempDir()
	const size = 24 << 20
	path, want := writeFile(t, dir, size, 4)
	for _, c := range []struct {
		name    string
		m       Method
		private bool
		match   string
		lo, hi  float64 // total PSS of the file's memory over 4 holders, in file sizes
	}{
		{"copy", Copy, false, "-fs-", 0.95, 1.1},
		{"map", Map, false, path, 0.95, 1.1},
		// The control: four private copies are four sizes of anonymous
		// memory (the Go heap's, with the rest of each process's).
		{"private", Copy, true, "", 3.6, 1e9},
	} {
		t.Run(c.name, func(t *testing.T) {
			var hs []*holder
			for range 4 {
				hs = append(hs, startHolder(t, path, c.m, c.private))
			}
			for _, h := range hs {
				if l := h.line(t); l != "ready "+sum(want) {
					t.Fatalf("child %d: %q", h.pid, l)
				}
			}
			{
				var total int64
				for _, h := range hs {
					total += pss(t, h.pid, c.match)
				}
				if r := float64(total) / size; r < c.lo || r > c.hi {
					t.Errorf("4 processes hold %.2f file sizes of its memory (PSS %d), want %.2f to %.2f", r, total, c.lo, c.hi)
				} else {
					t.Logf("4 processes: PSS of the file's memory %.2f file sizes", r)
				}
				if c.m == Copy && !c.private {
					if n := copiesInShm(t); n != 1 {
						t.Errorf("%d shared copies, want 1", n)
					}
				}
			}
			for _, h := range hs {
				h.stdin.Close()
				if err := h.wait(); err != nil {
					t.Errorf("child %d: %v", h.pid, err)
				}
			}
			if n := copiesInShm(t); n != 0 {
				t.Errorf("%d shared copies after every holder closed, want 0", n)
			}
		})
	}
}

func TestLoaderKilledMidLoad(t *testing.T) {
	dir := t.TempDir()
	path, want := writeFile(t, dir, 4<<20, 5)
	cmd := testenv.Child(t, "fs-stuck-loader", "FS_PATH="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "stuck" {
		t.Fatalf("loader said %q", sc.Text())
	}
	// Meanwhile a waiter in this process: it must not take a half copy.
	type result struct {
		f   *File
		err error
	}
	waiting := make(chan result, 1)
	sawLoader := make(chan struct{})
	var once sync.Once
	go func() {
		f, err := Open(context.Background(), path, &Options{Method: Copy, Progress: func(p Progress) {
			if p.Waiting {
				once.Do(func() { close(sawLoader) })
			}
		}})
		waiting <- result{f, err}
	}()
	// The waiter reports progress while it waits for the live loader:
	// kill the loader once it does.
	select {
	case <-sawLoader:
	case r := <-waiting:
		t.Fatalf("Open returned while the loader was stuck: %v", r.err)
	}
	cmd.Process.Kill() // SIGKILL
	cmd.Wait()
	r := <-waiting
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.f.Close()
	if !bytes.Equal(r.f.Bytes(), want) {
		t.Fatal("the copy taken over from a killed loader differs from the file")
	}
}

// TestSweepKilledHolders: copies whose holders were all killed are
// removed by the next Open that makes a copy; a held copy stays.
func TestSweepKilledHolders(t *testing.T) {
	dir := t.TempDir()
	path, want := writeFile(t, dir, 1<<20, 21)
	other, _ := writeFile(t, dir, 1<<20, 22)
	h := startHolder(t, path, Copy, false)
	if l := h.line(t); l != "ready "+sum(want) {
		t.Fatalf("holder: %q", l)
	}
	held, err := Open(context.Background(), path, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := Sweep(); err != nil || len(removed) != 0 {
		t.Errorf("Sweep of held copies removed %v (%v)", removed, err)
	}
	held.Close()
	// Killed while it holds the copy: it cannot remove it.
	syscallKill(t, h)
	if n := copiesInShm(t); n != 1 {
		t.Fatalf("%d copies after the holder was killed, want its 1", n)
	}
	f, err := Open(context.Background(), other, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n := copiesInShm(t); n != 1 {
		t.Errorf("%d copies: the killed holder's was not swept", n)
	}
}

func syscallKill(t *testing.T, h *holder) {
	t.Helper()
	p, err := os.FindProcess(h.pid)
	if err != nil {
		t.Fatal(err)
	}
	p.Kill()
	h.wait()
}

// TestOpenRaces: processes opening a new file's copy at the same moment
// all get it (one creates it; the others must not take the file being
// created for a corrupt one).
func TestOpenRaces(t *testing.T) {
	dir := t.TempDir()
	for round := range 2 {
		path, want := writeFile(t, dir, 256<<10, uint64(100+round))
		var hs []*holder
		for range 4 {
			hs = append(hs, startHolder(t, path, Copy, false))
		}
		for _, h := range hs {
			if l := h.line(t); l != "ready "+sum(want) {
				t.Errorf("round %d, child %d: %q", round, h.pid, l)
			}
		}
		for _, h := range hs {
			h.stdin.Close()
			h.wait()
		}
	}
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d copies left", n)
	}
}

// TestCreatorKilledBeforeHeader: a copy's file left without a header (its
// creator killed between creating the file and writing the header) is
// made in place by the next Open.
func TestCreatorKilledBeforeHeader(t *testing.T) {
	path, want := writeFile(t, t.TempDir(), 100<<10, 31)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := shm.StatFile(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(shm.ShmDir, shm.NamePrefix+strconv.Itoa(os.Geteuid())+"-"+copyName(st))
	if err := os.WriteFile(left, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), path, &Options{Method: Copy})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !bytes.Equal(c.Bytes(), want) {
		t.Error("the copy made in place differs from the file")
	}
}

// TestOpenSparseMultiGiB loads a 4.5 GiB sparse file (holes, where the
// content does not matter, and marks past the 4 GiB mark, where it
// does) by Map and by Copy into a shared copy; offsets past 32 bits
// land where they should, and the copy is made and removed whole.
func TestOpenSparseMultiGiB(t *testing.T) {
	const size = 4<<30 + 512<<20
	path := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	marks := map[int64]byte{0: 1, 1<<32 - 1: 2, 1 << 32: 3, 1<<32 + 8<<20 + 17: 4, size - 1: 5}
	for off, b := range marks {
		if _, err := f.WriteAt([]byte{b}, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []Method{Map, Copy} {
		file, err := Open(context.Background(), path, &Options{Method: m})
		if err != nil {
			t.Fatalf("%v: %v", m, err)
		}
		b := file.Bytes()
		if int64(len(b)) != size || file.Size() != size {
			t.Fatalf("%v: %d bytes, want %d", m, len(b), int64(size))
		}
		for off, want := range marks {
			if b[off] != want {
				t.Errorf("%v: byte %d is %d, want %d", m, off, b[off], want)
			}
		}
		for _, off := range []int64{1, 1<<32 - 2, 1<<32 + 1, 3 << 30, size - 2} {
			if b[off] != 0 {
				t.Errorf("%v: byte %d of a hole is %d", m, off, b[off])
			}
		}
		if err := file.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if n := copiesInShm(t); n != 0 {
		t.Errorf("%d copies left", n)
	}
}

// TestHugePagesHint: Options.HugePages marks the file's mapping (Map)
// or the host's shared copy (Copy) for transparent huge pages, which
// /proc/self/smaps shows as the VMA flag "hg"; without it, neither is.
// (Whether the kernel then backs them with huge pages is its policy:
// shmem_enabled and the file system's.)
func TestHugePagesHint(t *testing.T) {
	ctx := context.Background()
	path, _ := writeFile(t, t.TempDir(), 8<<20, 5)
	for _, m := range []Method{Map, Copy} {
		for _, huge := range []bool{false, true} {
			f, err := Open(ctx, path, &Options{Method: m, HugePages: huge})
			if err != nil {
				t.Fatal(err)
			}
			flags := vmFlags(t, f.Bytes())
			f.Close()
			if got := slices.Contains(flags, "hg"); got != huge {
				t.Errorf("%v, HugePages %v: VmFlags %v", m, huge, flags)
			}
		}
	}
}

// vmFlags returns the VmFlags of the mapping of this process that holds
// b's first byte, from /proc/self/smaps.
func vmFlags(t *testing.T, b []byte) []string {
	t.Helper()
	addr, err := strconv.ParseUint(strings.TrimPrefix(fmt.Sprintf("%p", &b[0]), "0x"), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for line := range strings.Lines(string(smaps)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(fields[0], "-"); ok && !strings.HasSuffix(fields[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 == nil && err2 == nil {
				in = l <= addr && addr < h
				continue
			}
		}
		if in && fields[0] == "VmFlags:" {
			return fields[1:]
		}
	}
	t.Fatalf("no mapping holds %#x in /proc/self/smaps", addr)
	return nil
}

// TestColdCopyDirect: a shared copy of a file out of the page cache is
// read with O_DIRECT (the file's pages stay out of the cache), unless
// Buffered; a warm file is read through the cache (which keeps it).
func TestColdCopyDirect(t *testing.T) {
	ctx := context.Background()
	path, want := writeFile(t, t.TempDir(), 32<<20+5, 9)
	cachedNow := func() (int64, int64) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c, p, err := shm.CachedPages(f, int64(len(want)))
		if err != nil {
			t.Fatalf("cachestat, which this test needs (Linux 6.5 or later): %v", err)
		}
		return c, p
	}
	f0, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f0.Sync(); err != nil { // clean pages, which Evict drops
		t.Fatal(err)
	}
	st, err := shm.StatFile(f0)
	f0.Close()
	if err != nil {
		t.Fatal(err)
	}
	switch st.FSType {
	case shm.FSExt4, shm.FSXFS, shm.FSBtrfs:
	default:
		t.Fatalf("%s is on a file system of type %#x: this test needs a temporary directory on a local disk file system (ext4, XFS, Btrfs; set TMPDIR)", path, st.FSType)
	}
	for _, c := range []struct {
		name           string
		warm, buffered bool
		wantCached     bool
	}{
		{"cold", false, false, false},
		{"cold, buffered", false, true, true},
		{"warm", true, false, true},
	} {
		if err := Evict(path); err != nil {
			t.Fatal(err)
		}
		if c.warm {
			if _, err := os.ReadFile(path); err != nil {
				t.Fatal(err)
			}
		}
		before, pages := cachedNow()
		if c.warm != (before > pages/2) {
			t.Fatalf("%s: %d of %d pages cached before the load: the page cache did not do as asked; this test needs a temporary directory on a local disk file system (ext4, XFS, Btrfs; not tmpfs or overlay: set TMPDIR)", c.name, before, pages)
		}
		f, err := Open(ctx, path, &Options{Method: Copy, Buffered: c.buffered})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(f.Bytes(), want) {
			t.Errorf("%s: the copy differs from the file", c.name)
		}
		f.Close()
		after, _ := cachedNow()
		if got := after > pages/2; got != c.wantCached {
			t.Errorf("%s: %d of %d pages cached after the load (before %d): want cached %v", c.name, after, pages, before, c.wantCached)
		}
	}
}
