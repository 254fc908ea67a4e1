package fs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	mmap "github.com/edsrzf/mmap-go"

	"github.com/ubkit-io/ubkit/shm"
)

// runChunks calls do for every chunk of [0, size), o.ChunkSize bytes
// each (the last one shorter), on up to o.Parallel goroutines, and
// report, if set, with the bytes done so far after each chunk, from the
// caller's goroutine. do's ctx ends when another chunk failed. It
// returns the first error, or ctx's.
func runChunks(ctx context.Context, size int64, o Options, report func(done int64), do func(ctx context.Context, off int64, n int) error) error {
	chunk := int64(o.ChunkSize)
	chunks := (size + chunk - 1) / chunk
	w := int(max(1, min(int64(o.Parallel), chunks)))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	done := make(chan int64, w)
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= chunks {
					return
				}
				off := i * chunk
				n := min(chunk, size-off)
				if err := do(ctx, off, int(n)); err != nil {
					once.Do(func() { firstErr = err })
					cancel()
					return
				}
				done <- n
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	var total int64
	for n := range done {
		total += n
		if report != nil {
			report(total)
		}
	}
	if firstErr != nil {
		return firstErr
	}
	if total != size {
		return context.Cause(ctx)
	}
	return nil
}

// reporter turns o.Progress into runChunks's report.
func reporter(o Options, total int64) func(int64) {
	if o.Progress == nil {
		return nil
	}
	return func(done int64) {
		if done < total { // the end is reported once, by Open
			o.Progress(Progress{Done: done, Total: total})
		}
	}
}

// openMap maps f and faults its pages in.
func openMap(ctx context.Context, f *os.File, st shm.FileStat, o Options) (*File, error) {
	mm, err := mmap.MapRegion(f, int(st.Size), mmap.RDONLY, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	fail := func(err error) (*File, error) {
		mm.Unmap()
		return nil, err
	}
	if o.HugePages {
		_ = shm.Advise(mm, shm.AdviseHugePage) // a hint: file mappings rarely get them
	}
	if !o.NoPopulate {
		if err := runChunks(ctx, st.Size, o, reporter(o, st.Size), func(ctx context.Context, off int64, n int) error {
			return populate(mm[off : off+int64(n)])
		}); err != nil {
			return fail(err)
		}
	}
	if o.SHA256 != "" {
		if err := checkSum(mm, o.SHA256); err != nil {
			return fail(err)
		}
	}
	return &File{data: mm, shared: true, close: mm.Unmap}, nil
}

// populate faults the pages of b, a file mapping, in for reading.
func populate(b []byte) error {
	err := shm.Advise(b, shm.AdvisePopulateRead)
	if !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	// Kernels before 5.14: a read of each page.
	var sum byte
	for i := 0; i < len(b); i += 4096 {
		sum += b[i]
	}
	sink.Add(uint32(sum))
	return nil
}

// prefault faults b, memory about to be written whole, in for writing
// (a shared copy's pages are allocated then), so that the writes take
// no faults: done in a chunk's own goroutine before its read, it
// overlaps the other chunks' I/O rather than stalling the one reader
// (a connection, a provider's receive loop) that fills b. A hint: a
// kernel without MADV_POPULATE_WRITE faults at the writes instead.
func prefault(b []byte) { _ = shm.Advise(b, shm.AdvisePopulateWrite) }

// sink keeps populate's reads from being optimized away.
var sink atomic.Uint32

// openPrivate reads f into this process's memory.
func openPrivate(ctx context.Context, f *os.File, st shm.FileStat, o Options) (*File, error) {
	buf := make([]byte, st.Size)
	if err := runChunks(ctx, st.Size, o, reporter(o, st.Size), func(ctx context.Context, off int64, n int) error {
		return readChunk(f, buf[off:off+int64(n)], off, n)
	}); err != nil {
		return nil, err
	}
	if o.SHA256 != "" {
		if err := checkSum(buf, o.SHA256); err != nil {
			return nil, err
		}
	}
	return &File{data: buf, close: func() error { return nil }}, nil
}

// readChunk reads want bytes of f at off into dst (which may be longer:
// O_DIRECT reads whole blocks). A file that ends before is an error: it
// was truncated under us.
func readChunk(f *os.File, dst []byte, off int64, want int) error {
	got := 0
	for got < want {
		n, err := f.ReadAt(dst[got:], off+int64(got))
		got += n
		if err == io.EOF && got < want || n == 0 && err == nil {
			return fmt.Errorf("read %s at %d: the file ended after %d of %d bytes (changed while loading?)", f.Name(), off, got, want)
		}
		if err != nil && err != io.EOF {
			return err
		}
		if err == io.EOF {
			break
		}
	}
	return nil
}

// checkSum compares b's SHA-256 with want (hex).
func checkSum(b []byte, want string) error {
	got := sha256.Sum256(b)
	if hex.EncodeToString(got[:]) != strings.ToLower(want) {
		return fmt.Errorf("%w: %x, want %s", ErrChecksum, got, strings.ToLower(want))
	}
	return nil
}
