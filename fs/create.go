package fs

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
)

// Durability is what Writer.Close waits for.
type Durability int

const (
	// Sync (the default): the file's data and its name are on disk when
	// Close returns (fsync of the file, rename, fsync of the directory).
	Sync Durability = iota
	// NoSync: Close returns once the data is in the page cache; a crash
	// of the machine may lose it, or leave the old file under the name.
	NoSync
)

// CreateOptions tune Create. The zero value (or nil) is Sync with
// defaults.
type CreateOptions struct {
	Durability Durability
	// Parallel is how many writes are in flight at once (default 8).
	Parallel int
	// ChunkSize is the size of each write, a multiple of 4 KiB (default
	// 8 MiB). Write buffers up to Parallel+1 chunks.
	ChunkSize int
	// Perm is the new file's permissions (default 0644, before umask).
	Perm os.FileMode
}

// Writer writes a large file with parallel chunked writes. The content
// goes to a temporary file beside path, renamed to path by Close: a
// crash or an Abort never leaves half a file under the name. Write is
// sequential and buffered (one goroutine at a time, which also calls
// Close); WriteAt may be
// called from many goroutines, also while Close or Abort runs (it then
// fails with ErrClosed, or with the abort's error).
type Writer struct {
	path, tmp string
	f         *os.File
	o         CreateOptions
	buf       []byte // the chunk being filled by Write
	off       int64  // where buf goes
	free      chan []byte
	wg        sync.WaitGroup
	mu        sync.Mutex
	err       error // the first failure: every later call returns it
	done      bool
}

// Create starts writing the file path (replacing it on Close if it
// exists).
func Create(path string, opts *CreateOptions) (*Writer, error) {
	var o CreateOptions
	if opts != nil {
		o = *opts
	}
	if o.Parallel == 0 {
		o.Parallel = 8
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = 8 << 20
	}
	if o.Perm == 0 {
		o.Perm = 0o644
	}
	switch {
	case o.Durability != Sync && o.Durability != NoSync:
		return nil, fmt.Errorf("fs: unknown durability %d", o.Durability)
	case o.Parallel < 1:
		return nil, fmt.Errorf("fs: %d parallel writes, want at least 1", o.Parallel)
	case o.ChunkSize < 4096 || o.ChunkSize%4096 != 0:
		return nil, fmt.Errorf("fs: chunk size %d, want a multiple of 4096", o.ChunkSize)
	}
	// The temporary file gets Perm through the umask, as os.Create's
	// would (os.CreateTemp makes 0600, and a Chmod would skip the umask).
	var f *os.File
	for try := 0; ; try++ {
		var rnd [8]byte
		rand.Read(rnd[:])
		tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%x.tmp", filepath.Base(path), rnd))
		var err error
		f, err = os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, o.Perm)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || try == 10 {
			return nil, fmt.Errorf("fs: create %s: %w", path, err)
		}
	}
	w := &Writer{path: path, tmp: f.Name(), f: f, o: o, free: make(chan []byte, o.Parallel+1)}
	for range o.Parallel + 1 {
		w.free <- nil // buffers are made when first needed
	}
	return w, nil
}

// fail records the first error.
func (w *Writer) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
}

func (w *Writer) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.failedLocked()
}

func (w *Writer) failedLocked() error {
	if w.done && w.err == nil {
		return ErrClosed
	}
	return w.err
}

// begin counts a write in flight, unless the Writer failed or is being
// closed (then its error): Close and Abort wait for every write begun.
func (w *Writer) begin() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.failedLocked(); err != nil {
		return err
	}
	w.wg.Add(1)
	return nil
}

// Write appends p (buffered: a full chunk is written in the background).
func (w *Writer) Write(p []byte) (int, error) {
	if err := w.failed(); err != nil {
		return 0, err
	}
	n := 0
	for len(p) > 0 {
		if w.buf == nil {
			b := <-w.free
			if b == nil {
				b = make([]byte, 0, w.o.ChunkSize)
			}
			w.buf = b[:0]
		}
		k := copy(w.buf[len(w.buf):cap(w.buf)], p)
		w.buf = w.buf[:len(w.buf)+k]
		p, n = p[k:], n+k
		if len(w.buf) == cap(w.buf) {
			w.flushChunk()
		}
	}
	return n, w.failed()
}

// flushChunk writes the buffered chunk in the background.
func (w *Writer) flushChunk() {
	b, off := w.buf, w.off
	w.buf = nil
	w.off += int64(len(b))
	if w.begin() != nil {
		w.free <- b
		return
	}
	go func() {
		defer w.wg.Done()
		if _, err := w.f.WriteAt(b, off); err != nil {
			w.fail(fmt.Errorf("fs: write %s: %w", w.path, err))
		}
		w.free <- b
	}()
}

// WriteAt writes p at off directly (unbuffered; safe from many goroutines,
// and with Write as long as the ranges differ).
func (w *Writer) WriteAt(p []byte, off int64) (int, error) {
	if err := w.begin(); err != nil {
		return 0, err
	}
	defer w.wg.Done()
	n, err := w.f.WriteAt(p, off)
	if err != nil {
		err = fmt.Errorf("fs: write %s: %w", w.path, err)
		w.fail(err)
	}
	return n, err
}

// Close writes what is buffered, waits for every write (WriteAt calls
// in flight included; none may begin after), makes the file durable as
// Durability says and renames it to its path. On an error before the
// rename the temporary file is removed and path is left as it was; an
// error of the directory's fsync after it says so.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.done {
		defer w.mu.Unlock()
		return w.err
	}
	w.mu.Unlock()
	if len(w.buf) > 0 {
		w.flushChunk()
	}
	w.mu.Lock()
	w.done = true // no write begins after this
	w.mu.Unlock()
	w.wg.Wait()
	w.mu.Lock()
	err := w.err
	w.mu.Unlock()
	if err == nil && w.o.Durability == Sync {
		if err = w.f.Sync(); err != nil {
			err = fmt.Errorf("fs: fsync %s: %w", w.path, err)
		}
	}
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("fs: close %s: %w", w.path, cerr)
	}
	if err == nil {
		if err = os.Rename(w.tmp, w.path); err != nil {
			err = fmt.Errorf("fs: %w", err)
		}
	}
	if err != nil {
		os.Remove(w.tmp)
		w.fail(err)
		return err
	}
	if w.o.Durability == Sync {
		// The file is in place; only the rename's durability failed.
		if err := syncDir(filepath.Dir(w.path)); err != nil {
			err = fmt.Errorf("%s is written and renamed, but a crash may still undo the rename: %w", w.path, err)
			w.fail(err)
			return err
		}
	}
	return nil
}

// Abort gives the file up: the temporary file is removed and path is
// left as it was.
func (w *Writer) Abort() error {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return ErrClosed
	}
	w.done = true // no write begins after this
	if w.err == nil {
		w.err = errors.New("fs: writer aborted")
	}
	w.mu.Unlock()
	w.wg.Wait()
	w.f.Close()
	return os.Remove(w.tmp)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fs: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fs: fsync %s: %w", dir, err)
	}
	return nil
}
