//go:build linux

package mq

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/fdlimit"
	"github.com/ubkit-io/ubkit/internal/testenv"
	"github.com/ubkit-io/ubkit/shm"
)

// Tests of the holes a review of the durability change found (docs/mq.md,
// "Durability", "Tests").

func init() {
	testenv.RegisterChild("durable-fill-disk", durableFillDiskChild)
}

// smallDisk mounts a tmpfs of size bytes on a fresh directory (mode 0700,
// as CheckDir wants) and unmounts it at the end of the test.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test mounts a small file system to fill, which needs root (uid %d here): run it, as `make test` does, as root", os.Geteuid())
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v\n%s", dir, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	return dir
}

// writebackDisk mounts a fresh 64 MiB ext4 file system with
// data=writeback on a directory (mode 0700) and unmounts it at the end of
// the test. The default data=ordered writes a file's other dirty pages
// with the journal commit that an msync of a page in a fallocated extent
// makes, which would hide a missing sync of those pages from a test that
// asks the kernel which pages are dirty; data=writeback writes only the
// range asked for.
func writebackDisk(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test mounts a file system, which needs root (uid %d here): run it, as `make test` does, as root", os.Geteuid())
	}
	tmp := t.TempDir()
	img, dir := filepath.Join(tmp, "disk.img"), filepath.Join(tmp, "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", "-F", img}, {"mount", "-o", "loop,data=writeback", img, dir}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
	})
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// newLogIn is newDirLog in directory dir.
func newLogIn(t *testing.T, dir string, c Config) *Log {
	t.Helper()
	c.Dir = dir
	name := fmt.Sprintf("durable-%d-%d", os.Getpid(), logSeq.Add(1))
	l, err := Create(name, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.Close()
		if err := Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove: %v", err)
		}
	})
	return l
}

// durableFillDiskChild creates log MQ_LOG in MQ_DIR, a file system of
// 8 MiB, with room for 16 segments of 1 MiB, and sends until Send fails:
// it exits 3 if the failure is not ENOSPC, 4 if the disk never filled
// (and dies of SIGBUS if a write through a mapping finds the disk full).
// After ENOSPC it removes the file MQ_FILLER and sends again: 0 if that
// Send succeeds, 5 if not.
func durableFillDiskChild() int {
	l, err := Create(os.Getenv("MQ_LOG"), Config{Dir: os.Getenv("MQ_DIR"), SegmentSize: 1 << 20, Segments: 16})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer l.Close()
	b := make([]byte, 64<<10)
	for i := range 16 * 16 {
		_, err := l.Send(context.Background(), 0, b)
		if err == nil {
			continue
		}
		fmt.Fprintf(os.Stderr, "send %d: %v\n", i, err)
		if !errors.Is(err, shm.ErrNoSpace) {
			return 3
		}
		// Room again: the partition goes on (the segment that could
		// not be made is made by the next Send).
		if err := os.Remove(os.Getenv("MQ_FILLER")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
		if _, err := l.Send(context.Background(), 0, b); err != nil {
			fmt.Fprintf(os.Stderr, "send with room again: %v\n", err)
			return 5
		}
		return 0
	}
	return 4
}

// TestDurableDiskFull: a producer that fills the disk gets ENOSPC from
// Send. Segment files used to be sparse (ftruncate), so the page that
// found the disk full faulted: SIGBUS, fatal in Go, killed the producer.
// Once there is room again, Send goes on: the segment that could not be
// made used to count as made, and every later Send failed.
func TestDurableDiskFull(t *testing.T) {
	dir := smallDisk(t, "8m")
	name := fmt.Sprintf("durable-%d-%d", os.Getpid(), logSeq.Add(1))
	t.Cleanup(func() {
		if err := Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove: %v", err)
		}
	})
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := testenv.Child(t, "durable-fill-disk", "MQ_LOG="+name, "MQ_DIR="+dir, "MQ_FILLER="+filler)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		t.Fatalf("the producer filling the disk: %v\n%s", err, stderr.String())
	}
	t.Logf("the producer: %s", stderr.String())
}

// segFiles lists the segment files of partition 0 of log name in dir.
func segFiles(t *testing.T, dir, name string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, segPrefix(name, 0)+"*.seg"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDurableReopenRefused: a segment file that OpenFileSegment refuses
// for what it is (a second name, a mode open to the group), not for a
// missing header, stops a reopen with an error and is left alone. The
// rebuild used to take every refusal for "its creator died before the
// header", removing the files from the newest down: OpenDir succeeded
// with no segment left and none of the records.
func TestDurableReopenRefused(t *testing.T) {
	for _, alter := range []string{"chmod", "link"} {
		t.Run(alter, func(t *testing.T) {
			l, dir := newDirLog(t, Config{SegmentSize: 4096, Segments: 16})
			ctx := timeout(t, 30*time.Second)
			const n = 40
			for i := range n {
				if _, err := l.Send(ctx, 0, durablePayload(i)); err != nil {
					t.Fatal(err)
				}
			}
			name := l.Name()
			files := segFiles(t, dir, name)
			if len(files) < 2 {
				t.Fatalf("%d segment files, want at least 2", len(files))
			}
			dropMeta(t, l)
			newest := l.segPath(0, uint64(len(files)-1))
			var undo func()
			switch alter {
			case "chmod":
				if err := os.Chmod(newest, 0o640); err != nil {
					t.Fatal(err)
				}
				undo = func() { os.Chmod(newest, 0o600) }
			case "link":
				backup := filepath.Join(t.TempDir(), "backup.seg")
				if err := os.Link(newest, backup); err != nil {
					t.Fatal(err)
				}
				undo = func() { os.Remove(backup) }
			}
			if l2, err := OpenDir(name, dir); err == nil {
				l2.Close()
				t.Fatalf("OpenDir with a refused segment file succeeded; %d of %d segment files left", len(segFiles(t, dir, name)), len(files))
			} else if !errors.Is(err, shm.ErrCorrupt) {
				t.Fatalf("OpenDir: %v, want ErrCorrupt", err)
			}
			if got := segFiles(t, dir, name); len(got) != len(files) {
				t.Fatalf("after the refused reopen: %d segment files, had %d", len(got), len(files))
			}
			undo()
			l2 := reopen(t, name, dir)
			r := newReader(t, l2, 0, Oldest)
			for i := range n {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if _, seq := parse(t, rec.Payload); seq != uint64(i) {
					t.Fatalf("record %d: seq %d", i, seq)
				}
			}
		})
	}
}

// stuckMaker is the state two reviews' findings need, made for real in
// one process of three handles on a FlushEverySend log of 16 KiB
// segments: handle a holds loans d (at 0 of segment 0), c (the next
// page) and f (most of the rest of segment 0), all in writing, so no
// commit in segment 0 has synced d's header; handle m's producer moved
// the tail into segment 1 and stopped in createSeg just after
// CreateFileSegment (as a maker killed there, or slow); handle b then
// sent a record into segment 1, and its Send returned.
type stuckMaker struct {
	l, a, b *Log
	d, c, f Reservation
	bOff    uint64
}

func newStuckMaker(t *testing.T) *stuckMaker {
	t.Helper()
	const size = 16 << 10
	m, _ := newDirLog(t, Config{SegmentSize: size, Segments: 16, Flush: FlushEverySend})
	open := func() *Log {
		l, err := Open(m.Name())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	s := &stuckMaker{l: m, a: open(), b: open()}
	ctx := timeout(t, 30*time.Second)
	loan := func(n int) Reservation {
		r, err := s.a.Loan(ctx, 0, n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range r.Bytes() {
			r.Bytes()[i] = byte(i)
		}
		return r
	}
	s.d = loan(4096 - headerSize)             // [0, 4096)
	s.c = loan(100)                           // [4096, 4216)
	s.f = loan(size - 64 - 4216 - headerSize) // up to 64 bytes before the end
	stopped, release, sent := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	hook := func(l *Log, _ int, k uint64) {
		if l == m && k == 1 {
			close(stopped)
			<-release
		}
	}
	testSegMade.Store(&hook)
	go func() { // does not fit: a pad, and the tail moves into segment 1
		_, err := m.Send(ctx, 0, make([]byte, 100))
		sent <- err
	}()
	t.Cleanup(func() {
		close(release)
		if err := <-sent; err != nil {
			t.Errorf("the maker's Send: %v", err)
		}
		testSegMade.Store(nil)
	})
	t.Cleanup(func() { s.d.Abort(); s.c.Abort(); s.f.Abort() })
	<-stopped
	var err error
	if s.bOff, err = s.b.Send(ctx, 0, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if s.bOff != size {
		t.Fatalf("b's record at %d, want %d (the start of segment 1)", s.bOff, size)
	}
	return s
}

// TestDurableMadeHeaderSynced: under FlushEverySend a record's Send may
// return only once the header of its segment file is on disk, whoever
// made the file: without the header a reopen takes the file for one
// nothing was written in. A producer of another handle than the maker
// used to sync only the directory and its record's pages, the file's
// header page left to the maker's sync, which comes last (or never, if
// the maker dies).
func TestDurableMadeHeaderSynced(t *testing.T) {
	s := newStuckMaker(t)
	if dirty, wb := pageState(t, s.l.segPath(0, 1), 0); dirty || wb {
		t.Fatalf("b's Send in segment 1 returned with the segment file's header page dirty %v, under writeback %v", dirty, wb)
	}
}

// TestDurableWatermarkSegment: under FlushEverySend the watermark (headers
// below it are on disk) may enter segment K+1 only once all of segment K's
// headers are on disk. A producer in K+1 used to move it there while K's
// maker had not synced K yet; a late Commit in K then synced only from its
// own header, and a machine crash could lose the header of a record in
// writing before it (here d's), where a reopen's walk ends: the committed
// record after it (c) would be lost though its Commit returned.
func TestDurableWatermarkSegment(t *testing.T) {
	s := newStuckMaker(t)
	// d's writer fills its payload meanwhile: the page of d's header is
	// dirty again, whatever a sync of the kernel's own (ext4 commits its
	// journal with the data of other files) wrote of it before.
	for i := range s.d.Bytes() {
		s.d.Bytes()[i] ^= 0xff
	}
	if dirty, _ := pageState(t, s.l.segPath(0, 0), shm.HeaderSize); !dirty {
		t.Fatal("the page of d's header is clean just after d's writer wrote in it")
	}
	if err := s.c.Commit(); err != nil {
		t.Fatal(err)
	}
	if dirty, wb := pageState(t, s.l.segPath(0, 0), shm.HeaderSize); dirty || wb {
		t.Fatalf("c's Commit returned with the page of d's header (before c's) dirty %v, under writeback %v", dirty, wb)
	}
}

// TestDurableRebuildSynced: a producer killed between its Commit's CAS
// and its msync leaves a committed record whose header is only in the page
// cache. A reopen shows it, and the records sent after it depend on that
// header (a reopen after a machine crash walks the segment from its
// start): under FlushEverySend the reopen must put it on disk. It used to
// set the watermark to the tail without a sync, so the next Send synced
// from the tail only and returned with that header's page dirty.
func TestDurableRebuildSynced(t *testing.T) {
	dir := writebackDisk(t)
	l := newLogIn(t, dir, Config{SegmentSize: 64 << 10, Segments: 4, Flush: FlushEverySend})
	ctx := timeout(t, 30*time.Second)
	if _, err := l.Send(ctx, 0, make([]byte, 5000)); err != nil { // [0, 5016)
		t.Fatal(err)
	}
	// The killed producer: its Commit's CAS, not its msync.
	r, err := l.Loan(ctx, 0, 4000) // [5016, 9032): its header on the third page of the file
	if err != nil {
		t.Fatal(err)
	}
	r.m.words[r.at/8+1].Store(uint64(crc32.Checksum(r.buf, castagnoli)) | r.offset<<32)
	if !r.m.words[r.at/8].CompareAndSwap(r.state, r.state&^stateMask|stateCommitted) {
		t.Fatal("the commit's CAS failed")
	}
	r.m.release()
	at := shm.HeaderSize + r.offset
	if dirty, _ := pageState(t, l.segPath(0, 0), at); !dirty {
		t.Fatal("the header of the record committed without its msync is on a clean page")
	}
	name := l.Name()
	dropMeta(t, l)
	l2 := reopen(t, name, dir)
	if _, err := l2.Send(ctx, 0, make([]byte, 100)); err != nil { // [9032, ...): the fourth page
		t.Fatal(err)
	}
	if dirty, wb := pageState(t, l2.segPath(0, 0), at); dirty || wb {
		t.Fatalf("a Send after the reopen returned with the header of the record before it dirty %v, under writeback %v", dirty, wb)
	}
}

// TestMaxAgeReaderLeftBehind: under FullFail (and FullBlock) producers
// wait for live readers, but not for one whose segment age retention
// dropped: it can never read there again (its next read is
// ErrOffsetGone). Such a reader used to hold the partition: every
// producer got ErrFull for good.
func TestMaxAgeReaderLeftBehind(t *testing.T) {
	for _, full := range []FullPolicy{FullFail, FullBlock} {
		t.Run(strconv.Itoa(int(full)), func(t *testing.T) {
			l := newLog(t, Config{SegmentSize: 4096, Segments: 4, MaxAge: time.Hour, Full: full})
			now := time.Unix(1_000_000, 0)
			clock := func() time.Time { return now }
			l.clock.Store(&clock)
			ctx := timeout(t, 10*time.Second)
			r := newReader(t, l, 0, 0) // stays in segment 0
			send := func(n int) {
				t.Helper()
				for i := range n {
					if _, err := l.Send(ctx, 0, make([]byte, 1000)); err != nil {
						t.Fatalf("send %d: %v", i, err)
					}
				}
			}
			send(13) // segments 0, 1, 2 full, one record in 3
			now = now.Add(time.Hour + time.Second)
			if n, err := l.Expire(); err != nil || n != 3 {
				t.Fatalf("Expire: %d, %v; want 3 segments dropped", n, err)
			}
			send(4 * 5) // into segments 7 and 8: beyond the reader's segment by more than Segments
			if _, err := r.Next(ctx); !errors.Is(err, ErrOffsetGone) {
				t.Fatalf("the reader left behind: %v, want ErrOffsetGone", err)
			}
		})
	}
}

func init() {
	testenv.RegisterChild("durable-rebuilder", durableRebuilderChild)
}

// durableRebuilderChild reopens log MQ_LOG from MQ_DIR and stops in the
// rebuild before partition 1, saying so on standard output, until it is
// killed.
func durableRebuilderChild() int {
	hook := func(_ string, p int) {
		if p == 1 {
			fmt.Println("rebuilding")
			select {}
		}
	}
	testRebuilding.Store(&hook)
	_, err := OpenDir(os.Getenv("MQ_LOG"), os.Getenv("MQ_DIR"))
	fmt.Fprintln(os.Stderr, "the rebuild ended:", err)
	return 1
}

// sendSome sends n records to each partition of l.
func sendSome(t *testing.T, l *Log, n int) {
	t.Helper()
	ctx := timeout(t, 30*time.Second)
	for p := range l.Config().Partitions {
		for i := range n {
			if _, err := l.Send(ctx, p, durablePayload(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// readAll checks that partition p of l holds records durablePayload(0),
// ..., (n-1).
func readAll(t *testing.T, l *Log, p, n int) {
	t.Helper()
	ctx := timeout(t, 30*time.Second)
	r := newReader(t, l, p, Oldest)
	for i := range n {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("partition %d, record %d: %v", p, i, err)
		}
		if _, seq := parse(t, rec.Payload); seq != uint64(i) {
			t.Fatalf("partition %d, record %d: seq %d", p, i, seq)
		}
	}
}

// TestDurableSlowRebuild: a reopen waits for another process's rebuild
// for as long as the rebuilder lives. It used to wait a second (Open's
// wait for the magic, and OpenDir's deadline), after which it failed with
// "not a log (bad magic)": a rebuild reads every page of each partition's
// newest segment, and a large log after a reboot takes longer. The
// rebuild here stops for 2.5 s before its second partition.
func TestDurableSlowRebuild(t *testing.T) {
	l, dir := newDirLog(t, Config{Partitions: 2, SegmentSize: 4096, Segments: 4})
	sendSome(t, l, 10)
	name := l.Name()
	dropMeta(t, l)
	stopped := make(chan struct{})
	hook := func(n string, p int) {
		if n == name && p == 1 {
			close(stopped)
			time.Sleep(2500 * time.Millisecond) // the slow part of the rebuild itself
		}
	}
	testRebuilding.Store(&hook)
	t.Cleanup(func() { testRebuilding.Store(nil) })
	type result struct {
		l   *Log
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { l, err := OpenDir(name, dir); first <- result{l, err} }()
	<-stopped
	start := time.Now()
	go func() { l, err := OpenDir(name, dir); second <- result{l, err} }()
	for _, c := range []chan result{first, second} {
		r := <-c
		if r.err != nil {
			t.Fatalf("OpenDir during a rebuild of 2.5 s, after %v: %v", time.Since(start), r.err)
		}
		t.Cleanup(func() { r.l.Close() })
		readAll(t, r.l, 1, 10)
	}
}

// TestDurableRebuilderKilled: a rebuilder killed midway leaves a meta
// segment without its magic, made by a dead process; the next reopen
// removes it and rebuilds. Every later OpenDir used to wait a second and
// fail with ErrCorrupt (until a sweep of /dev/shm removed it).
func TestDurableRebuilderKilled(t *testing.T) {
	l, dir := newDirLog(t, Config{Partitions: 2, SegmentSize: 4096, Segments: 4})
	sendSome(t, l, 10)
	name := l.Name()
	dropMeta(t, l)
	cmd := testenv.Child(t, "durable-rebuilder", "MQ_LOG="+name, "MQ_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "rebuilding\n" {
		t.Fatalf("the rebuilder said %q, %v", line, err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	l2 := reopen(t, name, dir)
	for p := range 2 {
		readAll(t, l2, p, 10)
	}
}

func init() {
	testenv.RegisterChild("durable-reopen-fds", durableReopenFdsChild)
}

// durableReopenFdsChild reopens log MQ_LOG from MQ_DIR with at most 64
// open files, and reads MQ_N records of partition 0.
func durableReopenFdsChild() int {
	if err := fdlimit.SetLimit(64); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := OpenDir(os.Getenv("MQ_LOG"), os.Getenv("MQ_DIR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer l.Close()
	n, _ := strconv.Atoi(os.Getenv("MQ_N"))
	r, err := l.NewReader(0, Oldest)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer r.Close()
	for i := range n {
		rec, err := r.Next(context.Background())
		if err != nil {
			fmt.Fprintf(os.Stderr, "record %d: %v\n", i, err)
			return 1
		}
		if len(rec.Payload) != 1000 || binary.LittleEndian.Uint64(rec.Payload[8:]) != uint64(i) {
			fmt.Fprintf(os.Stderr, "record %d: %d bytes, % x\n", i, len(rec.Payload), rec.Payload[:16])
			return 1
		}
	}
	return 0
}

// TestDurableReopenManySegments: a reopen maps one segment file at a
// time, so a log of more segments than the process may open files (150
// here, with 64) reopens. The rebuild used to keep every kept segment of
// a partition open and mapped at once: "too many open files".
func TestDurableReopenManySegments(t *testing.T) {
	l, dir := newDirLog(t, Config{SegmentSize: 4096, Segments: 256})
	const n = 150 * 4 // four records of 1000 bytes a segment
	ctx := timeout(t, 30*time.Second)
	for i := range n {
		b := make([]byte, 1000)
		message(b, 7, uint64(i))
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	if files := segFiles(t, dir, l.Name()); len(files) < 100 {
		t.Fatalf("%d segment files, want more than 100", len(files))
	}
	name := l.Name()
	dropMeta(t, l)
	cmd := testenv.Child(t, "durable-reopen-fds", "MQ_LOG="+name, "MQ_DIR="+dir, "MQ_N="+strconv.Itoa(n))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("reopening with 64 open files: %v\n%s", err, stderr.String())
	}
}

// TestDurableReopenGap: the files a crash (FlushNone) can leave: segments
// 0 and 1, no 2, and a 3 without a header. The reopen removes 3 and
// keeps 0 and 1; producers then make segment 2. It used to count segments
// up to 4 as made (the removed file's number), so the producer reaching
// segment 2 found it made, missing, and got ErrOffsetGone for good.
func TestDurableReopenGap(t *testing.T) {
	l, dir := newDirLog(t, Config{SegmentSize: 4096, Segments: 16})
	ctx := timeout(t, 30*time.Second)
	for i := range 8 { // segments 0 and 1 full (four records of 1000 bytes each)
		b := make([]byte, 1000)
		message(b, 7, uint64(i))
		if _, err := l.Send(ctx, 0, b); err != nil {
			t.Fatal(err)
		}
	}
	name := l.Name()
	dropMeta(t, l)
	if err := os.Remove(l.segPath(0, 2)); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := os.WriteFile(l.segPath(0, 3), make([]byte, 2*shm.HeaderSize), 0o600); err != nil {
		t.Fatal(err)
	}
	l2 := reopen(t, name, dir)
	for i := range 8 {
		b := make([]byte, 1000)
		message(b, 7, uint64(8+i))
		if _, err := l2.Send(ctx, 0, b); err != nil {
			t.Fatalf("send %d after the reopen: %v", i, err)
		}
	}
	r := newReader(t, l2, 0, Oldest)
	for i := range 16 {
		rec, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if _, seq := parse(t, rec.Payload); seq != uint64(i) {
			t.Fatalf("record %d: seq %d", i, seq)
		}
	}
}

// syncFaultOnce makes the next sync of a mapped segment fail with EIO, as
// a disk that failed a write does: the kernel reports a writeback error
// once per open file, and the syncs after it succeed. The returned
// channel is closed when the fault fired.
func syncFaultOnce(t *testing.T) <-chan struct{} {
	var fired atomic.Bool
	done := make(chan struct{})
	f := func(*mapped) error {
		if fired.CompareAndSwap(false, true) {
			close(done)
			return shm.ErrIO
		}
		return nil
	}
	testSyncFault.Store(&f)
	t.Cleanup(func() { testSyncFault.Store(nil) })
	return done
}

// TestDurableSyncErrorSticks: a failed flush is not forgotten. The kernel
// reports a writeback error once per open file, and marks the page clean:
// a later sync of the same range succeeds, though the page that failed
// (with headers later records depend on) is on no disk. Under
// FlushEverySend the Commit after a failed one in the same segment used to
// return nil; under FlushInterval an error the handle's goroutine met was
// dropped, and Close returned nil.
func TestDurableSyncErrorSticks(t *testing.T) {
	t.Run("every-send", func(t *testing.T) {
		l, _ := newDirLog(t, Config{SegmentSize: 64 << 10, Segments: 4, Flush: FlushEverySend})
		ctx := timeout(t, 30*time.Second)
		syncFaultOnce(t)
		if _, err := l.Send(ctx, 0, make([]byte, 100)); !errors.Is(err, shm.ErrIO) {
			t.Fatalf("the Send whose flush failed: %v, want EIO", err)
		}
		if _, err := l.Send(ctx, 0, make([]byte, 100)); !errors.Is(err, shm.ErrIO) {
			t.Fatalf("the next Send in the segment: %v, want the earlier EIO", err)
		}
	})
	t.Run("interval", func(t *testing.T) {
		l, _ := newDirLog(t, Config{SegmentSize: 64 << 10, Segments: 4, Flush: FlushInterval, FlushPeriod: time.Millisecond})
		ctx := timeout(t, 30*time.Second)
		if _, err := l.Send(ctx, 0, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		<-syncFaultOnce(t) // met by the handle's goroutine
		if err := l.Close(); !errors.Is(err, shm.ErrIO) {
			t.Fatalf("Close after the handle's goroutine met a failed flush: %v, want EIO", err)
		}
	})
}

// TestMaxAgeReaderAhead: a reader maps the segment after its own ahead
// (openAhead); when it moves on to it after retention dropped it, it gets
// ErrOffsetGone, as if it had opened it then. It used to read one more
// dropped segment from the mapping made ahead.
func TestMaxAgeReaderAhead(t *testing.T) {
	l := newLog(t, Config{SegmentSize: 4096, Segments: 100, MaxAge: time.Hour})
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	l.clock.Store(&clock)
	ctx := timeout(t, 30*time.Second)
	for range 13 { // segments 0, 1, 2 full (four records of 1016 bytes), one record in 3
		if _, err := l.Send(ctx, 0, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	r := newReader(t, l, 0, 0)
	if _, err := r.Next(ctx); err != nil { // maps segment 0, and 1 ahead
		t.Fatal(err)
	}
	r.opening.Wait() // segment 1 mapped ahead, before the drop
	now = now.Add(time.Hour + time.Second)
	if n, err := l.Expire(); err != nil || n != 3 {
		t.Fatalf("Expire: %d, %v; want 3 segments dropped", n, err)
	}
	for i := 1; ; i++ {
		_, err := r.Next(ctx)
		if errors.Is(err, ErrOffsetGone) {
			if r.Offset() >= 4096 && r.Offset() < 2*4096 && i >= 4 {
				return // in segment 1, after the rest of segment 0, mapped before the drop
			}
			t.Fatalf("ErrOffsetGone at %d, after %d records", r.Offset(), i)
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.Offset() > 4096 {
			t.Fatalf("record %d read at %d, in segment 1, which retention dropped", i, r.Offset()-1016)
		}
	}
}

// TestDurableMakerDied: a producer killed after it counted segment K as
// made (the made CAS) and before the file had its header leaves the
// file missing or without a header, and nobody making it. The producers
// that reach K take it over after a second: they make the file (O_EXCL),
// or give a headerless one whose maker holds no lock on it its header.
// The partition used to be wedged for good: every Send failed after a
// second's wait. The states are made by hand here, as the killed maker
// leaves them.
func TestDurableMakerDied(t *testing.T) {
	for _, state := range []string{"missing", "empty", "sized"} {
		t.Run(state, func(t *testing.T) {
			l, _ := newDirLog(t, Config{SegmentSize: 4096, Segments: 16, Flush: FlushEverySend})
			ctx := timeout(t, 30*time.Second)
			send := func(i int) error {
				b := make([]byte, 1000)
				message(b, 7, uint64(i))
				_, err := l.Send(ctx, 0, b)
				return err
			}
			for i := range 4 { // segment 0 full, as far as records of 1000 bytes go
				if err := send(i); err != nil {
					t.Fatal(err)
				}
			}
			pt := l.parts[0]
			if !pt.made.CompareAndSwap(1, 2) { // the dead maker's CAS
				t.Fatalf("made %d, want 1", pt.made.Load())
			}
			switch state {
			case "empty": // killed just after its O_EXCL open
				if err := os.WriteFile(l.segPath(0, 1), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			case "sized": // killed after sizing the file, before the header
				if err := os.WriteFile(l.segPath(0, 1), make([]byte, shm.HeaderSize+8192), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			for i := 4; i < 8; i++ {
				if err := send(i); err != nil {
					t.Fatalf("send %d, into the segment whose maker died: %v", i, err)
				}
			}
			r := newReader(t, l, 0, Oldest)
			for i := range 8 {
				rec, err := r.Next(ctx)
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				if _, seq := parse(t, rec.Payload); seq != uint64(i) {
					t.Fatalf("record %d: seq %d", i, seq)
				}
			}
		})
	}
}
