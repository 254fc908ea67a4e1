// Package fs loads large immutable files, such as model weights, at memory
// speed, with one copy per host however many processes load them.
//
// Open returns a read-only view of a whole file. It either maps the file
// (Map: the page cache is the host's one copy, and pages are faulted in
// by several goroutines at once, which also reads a cold file in
// parallel) or reads it with parallel chunked preads into a shared-memory
// segment that every process of the user opening the same file content
// shares (Copy: for network and FUSE file systems, whose page cache is
// not to be relied on, and for data that has no local file). Auto picks
// by file system and size; docs/fs.md says how.
//
//	f, err := fs.Open(ctx, "model.safetensors", nil)
//	if err != nil { ... }
//	defer f.Close()
//	weights := f.Bytes() // read-only, valid until Close
//
// A shared copy is named after the file's identity (device, inode, size,
// modification and change times), so a file changed on disk gets a new
// copy. A mapping (Map) is the file itself: a file rewritten in place
// (truncated and written again, as cp does) changes under its readers,
// who get SIGBUS past its new end. Map is for files that are replaced,
// not rewritten (a new file renamed over the old keeps the old mapped
// content); use Copy for files whose writers are not known. It is counted
// across processes by the kernel (a shared lock per holder: a killed
// process cannot leak its reference); the last holder removes it. A
// loader killed mid-load leaves a copy marked loading, never ready: the
// next process that wants it loads it again from the start. Liveness is
// by process identity (pid and start time, as everywhere in ubkit):
// processes that share a copy must share a PID namespace.
package fs

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ubkit-io/ubkit/shm"
)

// Method is how Open loads a file.
type Method int

const (
	// Auto chooses Map for files on local and memory file systems and
	// Copy for network and FUSE file systems and very small files.
	Auto Method = iota
	// Map maps the file read-only and faults its pages in.
	Map
	// Copy reads the file with parallel chunked preads into shared
	// memory, one copy per host (per user) unless Options.Private.
	Copy
)

func (m Method) String() string {
	switch m {
	case Auto:
		return "auto"
	case Map:
		return "map"
	case Copy:
		return "copy"
	}
	return fmt.Sprintf("Method(%d)", int(m))
}

// Errors of Open. Match them with errors.Is.
var (
	// ErrChecksum: the file's content does not have the SHA-256 that
	// Options.SHA256 gave.
	ErrChecksum = errors.New("fs: content does not match its SHA-256")
	// ErrNotRegular: the path is not a regular file (a directory, a
	// device, a FIFO).
	ErrNotRegular = errors.New("fs: not a regular file")
	// ErrClosed: the File is closed.
	ErrClosed = errors.New("fs: closed")
)

// Progress is how far a load is, for Options.Progress.
type Progress struct {
	// Done and Total are bytes.
	Done, Total int64
	// Waiting says another process is loading the shared copy, and Done
	// is its progress.
	Waiting bool
}

// Options tune Open. The zero value (or nil) is Auto with defaults.
type Options struct {
	// Method forces Map or Copy (default Auto).
	Method Method
	// Parallel is how many goroutines read (Copy) or fault pages in
	// (Map) at once; default 16, at least 1. Parallel reads are what
	// make a cold load fast on SSDs and network storage.
	Parallel int
	// ChunkSize is the unit of parallel work and of progress, a multiple
	// of 4 KiB (default 8 MiB).
	ChunkSize int
	// Direct reads with O_DIRECT (Copy): no page-cache copy of the file
	// beside the shared one, which helps a cold read of a file read once.
	// File systems without O_DIRECT (tmpfs) fall back to plain reads.
	// A shared copy of a file of 16 MiB or more on a local disk file
	// system (ext4, XFS, Btrfs), most of whose pages are not in the page
	// cache (cachestat(2)), is read with O_DIRECT without it: a 2 GiB
	// cold file loaded at 2.1-2.2 GB/s here against 0.6-1.2 GB/s through
	// the page cache (docs/fs.md). A warm file is read through the page
	// cache, which then costs no disk read, and so is a file cachestat
	// will not describe (Linux before 6.5, or a file this process may
	// neither write nor owns, as a shared model directory's often is).
	Direct bool
	// Buffered (Copy) reads a cold file through the page cache all the
	// same (see Direct), for a file other readers will read next; Direct
	// wins over it.
	Buffered bool
	// HugePages asks for transparent huge pages for the host's shared
	// copy or the mapping, where the kernel allows them (a Private copy
	// is Go memory, under the runtime's own huge-page policy).
	HugePages bool
	// NoPopulate (Map) maps without faulting pages in: the first touch of
	// each page reads it.
	NoPopulate bool
	// Private (Copy) loads a copy of this process's own instead of the
	// host's shared one.
	Private bool
	// SHA256, if set (64 hex digits), is the expected SHA-256 of the
	// content: the load fails with ErrChecksum if it differs. A shared
	// copy is checked once per sum, by its loader or the first opener
	// that asks for that sum.
	SHA256 string
	// Progress, if set, is called from Open's goroutine as the load goes
	// on, and once at the end with Done == Total.
	Progress func(Progress)
}

func (o *Options) withDefaults() (Options, error) {
	var c Options
	if o != nil {
		c = *o
	}
	if c.Parallel == 0 {
		c.Parallel = 16
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = 8 << 20
	}
	switch {
	case c.Method < Auto || c.Method > Copy:
		return c, fmt.Errorf("fs: unknown method %d", c.Method)
	case c.Parallel < 1:
		return c, fmt.Errorf("fs: %d parallel readers, want at least 1", c.Parallel)
	case c.ChunkSize < 4096 || c.ChunkSize%4096 != 0:
		return c, fmt.Errorf("fs: chunk size %d, want a multiple of 4096", c.ChunkSize)
	case c.SHA256 != "" && !isHex(c.SHA256, 64):
		return c, fmt.Errorf("fs: SHA256 %q is not 64 hex digits", c.SHA256)
	}
	return c, nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// smallFile is the size below which Auto reads a file into the process's
// own memory: a mapping or a shared segment costs more than it saves.
const smallFile = 64 << 10

// coldDirectMin is the smallest file a shared copy reads with O_DIRECT
// when it is cold (Options.Direct).
const coldDirectMin = 16 << 20

// coldOnDisk reports whether f, of stat st, is on a local disk file
// system and most of its pages are out of the page cache: what a shared
// copy reads with O_DIRECT (Options.Direct). Other file systems are not
// asked: overlayfs keeps the pages under the file beneath (its own
// file always looks cold), and O_DIRECT on network and FUSE file systems
// was not measured. cachestat(2) refusing says nothing: not cold.
func coldOnDisk(f *os.File, st shm.FileStat) bool {
	switch st.FSType {
	case shm.FSExt4, shm.FSXFS, shm.FSBtrfs:
	default:
		return false
	}
	cached, pages, err := shm.CachedPages(f, st.Size)
	return err == nil && cached < pages/2
}

// File is a loaded file: a read-only view of its bytes.
type File struct {
	path   string
	size   int64
	method Method
	shared bool
	data   []byte
	close  func() error
	closed bool
}

// Open loads the regular file at path and returns a read-only view of its
// content. ctx bounds the load (and the wait for another process's).
func Open(ctx context.Context, path string, opts *Options) (*File, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	o.Progress = monotonic(o.Progress)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return openFile(ctx, f, path, o)
}

// openFile is Open of a file opened (and named path), with o's defaults
// filled in.
func openFile(ctx context.Context, f *os.File, path string, o Options) (*File, error) {
	st, err := shm.StatFile(f)
	if err != nil {
		return nil, err
	}
	if !st.IsRegular() {
		return nil, fmt.Errorf("fs: open %s: %w", path, ErrNotRegular)
	}
	if int64(int(st.Size)) != st.Size || st.Size > 1<<46 {
		return nil, fmt.Errorf("fs: open %s: %d bytes is too large to map", path, st.Size)
	}
	m := o.Method
	if m == Auto {
		m = choose(st)
	}
	var file *File
	switch {
	case st.Size == 0:
		file = &File{data: []byte{}, close: func() error { return nil }}
		if o.SHA256 != "" {
			err = checkSum(nil, o.SHA256)
		}
	case m == Map:
		file, err = openMap(ctx, f, st, o)
	case o.Private || st.Size < smallFile && o.Method == Auto:
		file, err = openPrivate(ctx, f, st, o)
	default:
		file, err = openShared(ctx, f, path, st, o)
	}
	if err != nil {
		return nil, fmt.Errorf("fs: open %s: %w", path, err)
	}
	file.path, file.size, file.method = path, st.Size, m
	if o.Progress != nil {
		o.Progress(Progress{Done: st.Size, Total: st.Size})
	}
	return file, nil
}

// monotonic wraps a Progress callback so that Done never goes back: a
// load taken over from a dead loader starts again from 0.
func monotonic(f func(Progress)) func(Progress) {
	if f == nil {
		return nil
	}
	var most int64
	return func(p Progress) {
		most = max(most, p.Done)
		p.Done = most
		f(p)
	}
}

// choose is Auto's choice for a file.
func choose(st shm.FileStat) Method {
	switch st.FSType {
	case shm.FSNFS, shm.FSFuse, shm.FSCIFS, shm.FSSMB2, shm.FSCeph, shm.FS9P:
		return Copy
	}
	if st.Size < smallFile {
		return Copy
	}
	return Map
}

// Bytes is the file's content. It must not be modified (a mapping and a
// shared copy are read-only: a write faults). It is valid until Close.
func (f *File) Bytes() []byte { return f.data }

// Size is the file's size in bytes.
func (f *File) Size() int64 { return f.size }

// Path is the path the file was opened by.
func (f *File) Path() string { return f.path }

// Method says how the file was loaded: Map or Copy.
func (f *File) Method() Method { return f.method }

// Shared reports whether the content is the host's shared copy (Copy) or
// the page cache (Map): other processes that open the same file use the
// same memory.
func (f *File) Shared() bool { return f.shared }

// ReadAt reads from the loaded content (io.ReaderAt).
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	if f.closed {
		return 0, ErrClosed
	}
	if off < 0 {
		return 0, fmt.Errorf("fs: read at negative offset %d", off)
	}
	if off >= int64(len(f.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Close lets go of the content; Bytes must not be used after. The last
// process to close a shared copy removes it.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	err := f.close()
	f.data = nil
	return err
}

// Evict drops the page cache's clean pages of the file at path
// (posix_fadvise DONTNEED), which needs no privilege: the next load of it
// is cold where the file system honours it (local disks; tmpfs keeps its
// pages, they are the file). Dirty pages stay until written back.
func Evict(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return shm.AdviseFile(f, 0, 0, shm.AdviseDontNeed)
}
