package mq

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// TestReadAt reads every record of a partition by its offset, across
// segments and padding, and checks what is not a record.
func TestReadAt(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 3, Full: FullOverwrite})
	ctx := timeout(t, 10*time.Second)
	var offs []uint64
	var want [][]byte
	for i := range 20 {
		b := bytes.Repeat([]byte{byte(i + 1)}, 200+97*i)
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		offs, want = append(offs, off), append(want, b)
	}
	st, _ := l.Stats(0)
	kept := 0
	for i, off := range offs {
		rec, release, err := l.ReadAt(0, off)
		if off < st.Oldest {
			if !errors.Is(err, ErrOffsetGone) {
				t.Fatalf("record %d at %d, below the oldest %d: %v, want ErrOffsetGone", i, off, st.Oldest, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("record %d at %d: %v", i, off, err)
		}
		if rec.Offset != off || !bytes.Equal(rec.Payload, want[i]) {
			t.Fatalf("record %d at %d: offset %d, %d bytes", i, off, rec.Offset, len(rec.Payload))
		}
		release()
		kept++
	}
	if kept == 0 || kept == len(offs) {
		t.Fatalf("%d of %d records kept: the test wants some dropped and some kept", kept, len(offs))
	}
	last := offs[len(offs)-1]
	for _, c := range []struct {
		off  uint64
		want error
	}{
		{last + 8, shm.ErrCorrupt}, // inside a payload: not a header
		{last + 3, ErrNotRecord},   // not aligned
		{st.Tail, ErrNotRecord},    // the tail
		{st.Tail + 4096, ErrNotRecord},
		{0, ErrOffsetGone},
	} {
		if _, _, err := l.ReadAt(0, c.off); !errors.Is(err, c.want) {
			t.Errorf("offset %d: %v, want %v", c.off, err, c.want)
		}
	}
	if _, _, err := l.ReadAt(1, 0); err == nil {
		t.Error("partition 1 of 1 read")
	}
}

// TestReadAtStates: a record being written, an aborted one and one whose
// payload changed after its commit are not returned.
func TestReadAtStates(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	loan, err := l.Loan(ctx, 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.ReadAt(0, loan.Offset()); !errors.Is(err, ErrNotRecord) {
		t.Fatalf("a record being written: %v, want ErrNotRecord", err)
	}
	loan.Abort()
	if _, _, err := l.ReadAt(0, loan.Offset()); !errors.Is(err, ErrNotRecord) {
		t.Fatalf("an aborted record: %v, want ErrNotRecord", err)
	}
	loan, err = l.Loan(ctx, 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	buf := loan.Bytes()
	copy(buf, "payload")
	if err := loan.Commit(); err != nil {
		t.Fatal(err)
	}
	rec, release, err := l.ReadAt(0, loan.Offset())
	if err != nil || string(rec.Payload[:7]) != "payload" {
		t.Fatalf("committed record: %q, %v", rec.Payload, err)
	}
	release()
	// A hostile producer changes the payload after the commit.
	w, err := l.Loan(ctx, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	w.Commit()
	r := newReader(t, l, 0, loan.Offset())
	got, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got.Payload[0] ^= 0xff
	if _, _, err := l.ReadAt(0, loan.Offset()); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("a payload changed after its commit: %v, want shm.ErrCorrupt", err)
	}
}

// TestReadAtAfterDrop: a record read before retention dropped its segment
// stays readable until released.
func TestReadAtAfterDrop(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 2, Full: FullOverwrite})
	ctx := timeout(t, 10*time.Second)
	want := bytes.Repeat([]byte("x"), 3000)
	off, err := l.Send(ctx, 0, want)
	if err != nil {
		t.Fatal(err)
	}
	rec, release, err := l.ReadAt(0, off)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	for range 4 {
		if _, err := l.Send(ctx, 0, make([]byte, 3000)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := l.ReadAt(0, off); !errors.Is(err, ErrOffsetGone) {
		t.Fatalf("after the drop: %v, want ErrOffsetGone", err)
	}
	if !bytes.Equal(rec.Payload, want) {
		t.Fatal("a held record changed after its segment was dropped")
	}
}

// FuzzReadAt: any offset gives a record or an error, never a panic.
func FuzzReadAt(f *testing.F) {
	for _, o := range []uint64{0, 8, 16, 24, 4080, 4088, 4096, 1 << 63, ^uint64(0)} {
		f.Add(o)
	}
	l := newLog(f, Config{SegmentSize: 4096, Segments: 2, Full: FullOverwrite})
	ctx := timeout(f, 10*time.Second)
	for i := range 12 {
		if _, err := l.Send(ctx, 0, bytes.Repeat([]byte{byte(i)}, 200*i)); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, off uint64) {
		rec, release, err := l.ReadAt(0, off)
		// CopyAt agrees with ReadAt on every offset.
		cp, cerr := l.CopyAt(0, off, func(n int) ([]byte, error) { return make([]byte, n), nil })
		if (err == nil) != (cerr == nil) {
			t.Fatalf("offset %d: ReadAt %v, CopyAt %v", off, err, cerr)
		}
		for _, class := range []error{ErrOffsetGone, ErrNotRecord, shm.ErrCorrupt} {
			if errors.Is(err, class) != errors.Is(cerr, class) {
				t.Fatalf("offset %d: ReadAt %v, CopyAt %v", off, err, cerr)
			}
		}
		if err == nil {
			if rec.Offset != off {
				t.Fatalf("offset %d read as %d", off, rec.Offset)
			}
			if cp.Offset != off || cp.CRC != rec.CRC || !bytes.Equal(cp.Payload, rec.Payload) {
				t.Fatalf("offset %d: CopyAt's copy differs from ReadAt's record", off)
			}
			release()
		}
	})
}

// TestReadAtFile reads a record of a log backed by files: ReadAt opens the
// segment where the log keeps it (it opened /dev/shm only, and a log with
// a Dir has no segment there).
func TestReadAtFile(t *testing.T) {
	l, _ := newDirLog(t, Config{SegmentSize: 4096})
	ctx := timeout(t, 10*time.Second)
	off, err := l.Send(ctx, 0, []byte("in a file"))
	if err != nil {
		t.Fatal(err)
	}
	rec, release, err := l.ReadAt(0, off)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if string(rec.Payload) != "in a file" {
		t.Fatalf("ReadAt: %q", rec.Payload)
	}
}

// into is a CopyAt allocator that hands out b.
func into(b []byte) func(int) ([]byte, error) {
	return func(int) ([]byte, error) { return b, nil }
}

// TestCopyAt: CopyAt returns what ReadAt reads, for payloads shorter and
// longer than its pieces, into buffers of any size that holds them;
// refuses a short buffer, returns its allocator's error and fails where
// ReadAt fails; and it sums its own copy: a payload changed after its
// commit is refused, and a shared byte changed just after its piece was
// copied does not reach the copy, which is returned as written.
func TestCopyAt(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 1 << 20, Segments: 2})
	ctx := timeout(t, 20*time.Second)
	sizes := []int{1, 100, 64<<10 - 1, 64 << 10, 64<<10 + 1, 200_000, 300 << 10}
	var offs []uint64
	var want [][]byte
	for i, n := range sizes {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(j*7 + i)
		}
		off, err := l.Send(ctx, 0, b)
		if err != nil {
			t.Fatal(err)
		}
		offs, want = append(offs, off), append(want, b)
	}
	for i, off := range offs {
		in, release, err := l.ReadAt(0, off)
		if err != nil {
			t.Fatal(err)
		}
		for _, extra := range []int{0, 1000} {
			var asked int
			rec, err := l.CopyAt(0, off, func(n int) ([]byte, error) {
				asked = n
				return make([]byte, n+extra), nil
			})
			if err != nil {
				t.Fatalf("record %d (%d bytes) into %d: %v", i, len(want[i]), len(want[i])+extra, err)
			}
			if asked != len(want[i]) || rec.Offset != off || rec.CRC != in.CRC || !bytes.Equal(rec.Payload, want[i]) {
				t.Fatalf("record %d: asked for %d bytes, offset %d, crc %#x (ReadAt's %#x), %d bytes", i, asked, rec.Offset, rec.CRC, in.CRC, len(rec.Payload))
			}
		}
		release()
		if _, err := l.CopyAt(0, off, into(make([]byte, len(want[i])-1))); !errors.Is(err, io.ErrShortBuffer) {
			t.Fatalf("record %d into a buffer a byte short: %v", i, err)
		}
	}
	refuse := errors.New("not that length")
	if _, err := l.CopyAt(0, offs[0], func(int) ([]byte, error) { return nil, refuse }); !errors.Is(err, refuse) {
		t.Fatalf("an allocator's refusal: %v", err)
	}
	st, _ := l.Stats(0)
	last := offs[len(offs)-1]
	for _, c := range []struct {
		off  uint64
		want error
	}{
		{last + 8, shm.ErrCorrupt},
		{last + 3, ErrNotRecord},
		{st.Tail, ErrNotRecord},
	} {
		if _, err := l.CopyAt(0, c.off, into(make([]byte, 1<<20))); !errors.Is(err, c.want) {
			t.Errorf("offset %d: %v, want %v", c.off, err, c.want)
		}
	}

	// A byte past the first piece changed after the commit.
	big := len(offs) - 1
	in, release, err := l.ReadAt(0, offs[big])
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	in.Payload[200_000] ^= 0xff
	if _, err := l.CopyAt(0, offs[big], into(make([]byte, len(want[big])))); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("a payload changed after its commit: %v, want shm.ErrCorrupt", err)
	}
	in.Payload[200_000] ^= 0xff

	// A hostile producer changes a shared byte of each piece just after
	// CopyAt copied it, before the piece is summed: the copy holds what
	// was written, and the sum is the copy's, so it is returned, right.
	// (Summing the shared bytes would refuse it; summing them before the
	// copy would return a copy nobody checked.)
	hook := func(from, to int) { in.Payload[from+(to-from)/2] ^= 0x5a }
	testCopied.Store(&hook)
	rec, err := l.CopyAt(0, offs[big], into(make([]byte, len(want[big]))))
	testCopied.Store(nil)
	if err != nil || !bytes.Equal(rec.Payload, want[big]) {
		t.Fatalf("a copy whose shared side changed after each piece's copy: %v (right: %v)", err, err == nil && bytes.Equal(rec.Payload, want[big]))
	}
}

// TestCommitCopy: a payload committed with CommitCopy reads back as
// written, with the CRC-32C CommitCopy returned, for lengths around its
// pieces; a source of another length gives the reservation up, and the
// records after it read as usual; and the sum is of the source: a shared
// byte a hostile process changes just after its piece was copied makes
// the record fail its checksum instead of being covered by it.
func TestCommitCopy(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 1 << 20, Segments: 2})
	ctx := timeout(t, 20*time.Second)
	for i, n := range []int{1, 64<<10 - 1, 64 << 10, 64<<10 + 1, 300 << 10} {
		src := make([]byte, n)
		for j := range src {
			src[j] = byte(j*13 + i)
		}
		res, err := l.Loan(ctx, 0, n)
		if err != nil {
			t.Fatal(err)
		}
		crc, err := res.CommitCopy(src)
		if err != nil {
			t.Fatal(err)
		}
		if want := crc32.Checksum(src, crc32.MakeTable(crc32.Castagnoli)); crc != want {
			t.Fatalf("%d bytes: CommitCopy says %#x, the payload sums to %#x", n, crc, want)
		}
		rec, release, err := l.ReadAt(0, res.Offset())
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if rec.CRC != crc || !bytes.Equal(rec.Payload, src) {
			t.Fatalf("%d bytes read back as %d bytes, crc %#x", n, len(rec.Payload), rec.CRC)
		}
		release()
	}
	src := bytes.Repeat([]byte("source"), 30000)
	res, err := l.Loan(ctx, 0, len(src))
	if err != nil {
		t.Fatal(err)
	}
	shared := res.Bytes()
	hook := func(from, to int) { shared[from] ^= 0xff }
	testCopied.Store(&hook)
	_, err = res.CommitCopy(src)
	testCopied.Store(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.ReadAt(0, res.Offset()); !errors.Is(err, shm.ErrCorrupt) {
		t.Fatalf("a record whose shared bytes changed during CommitCopy: %v, want shm.ErrCorrupt", err)
	}

	res, err = l.Loan(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.CommitCopy(make([]byte, 99)); err == nil {
		t.Fatal("99 bytes committed into a reservation of 100")
	}
	if _, _, err := l.ReadAt(0, res.Offset()); !errors.Is(err, ErrNotRecord) {
		t.Fatalf("the given-up reservation: %v, want ErrNotRecord", err)
	}
	after, err := l.Send(ctx, 0, []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	r := newReader(t, l, 0, res.Offset())
	rec, err := r.Next(ctx)
	if err != nil || rec.Offset != after || string(rec.Payload) != "after" {
		t.Fatalf("the record after the given-up one: %d %q, %v", rec.Offset, rec.Payload, err)
	}
}
