package mq

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/ubkit-io/ubkit/internal/testenv"
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
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// durableFillDiskChild creates log MQ_LOG in MQ_DIR, a file system of
// 8 MiB, with room for 16 segments of 1 MiB, and sends until Send fails:
// it exits 0 if the failure is ENOSPC, 3 on another error, 4 if the disk
// never filled (and dies of SIGBUS if a write through a mapping finds the
// disk full).
func durableFillDiskChild() int {
	l, err := Create(os.Getenv("MQ_LOG"), Config{Dir: os.Getenv("MQ_DIR"), SegmentSize: 1 << 20, Segments: 16})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer l.Close()
	b := make([]byte, 64<<10)
	for i := range 16 * 16 {
		if _, err := l.Send(context.Background(), 0, b); err != nil {
			fmt.Fprintf(os.Stderr, "send %d: %v\n", i, err)
			if errors.Is(err, syscall.ENOSPC) {
				return 0
			}
			return 3
		}
	}
	return 4
}

// TestDurableDiskFull: a producer that fills the disk gets ENOSPC from
// Send. Segment files used to be sparse (ftruncate), so the page that
// found the disk full faulted: SIGBUS, fatal in Go, killed the producer.
func TestDurableDiskFull(t *testing.T) {
	dir := smallDisk(t, "8m")
	name := fmt.Sprintf("durable-%d-%d", os.Getpid(), logSeq.Add(1))
	t.Cleanup(func() {
		if err := Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("remove: %v", err)
		}
	})
	cmd := testenv.Child(t, "durable-fill-disk", "MQ_LOG="+name, "MQ_DIR="+dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		t.Fatalf("the producer filling the disk: %v\n%s", err, stderr.String())
	}
	t.Logf("the producer: %s", stderr.String())
}
