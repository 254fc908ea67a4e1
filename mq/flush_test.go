package mq

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/shm"
)

// pageState reads the kernel's flags of the page of this process's
// mapping of file path that holds byte off of the file: dirty (written,
// not yet on disk) or under writeback. It reads /proc/self/maps,
// /proc/self/pagemap and /proc/kpageflags, and so needs root (the
// physical frame numbers are hidden from others).
func pageState(t *testing.T, path string, off uint64) (dirty, writeback bool) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test reads /proc/kpageflags to see whether the flush cleaned a page, which needs root (uid %d here): run it, as `make test` does, as root", os.Geteuid())
	}
	maps, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	var addr uint64
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[5] != path {
			continue
		}
		var start, end, fileOff uint64
		if _, err := fmt.Sscanf(f[0], "%x-%x", &start, &end); err != nil {
			t.Fatal(err)
		}
		if fileOff, err = strconv.ParseUint(f[2], 16, 64); err != nil {
			t.Fatal(err)
		}
		if off >= fileOff && off-fileOff < end-start {
			addr = start + off - fileOff
			break
		}
	}
	if addr == 0 {
		t.Fatalf("no mapping of %s holds offset %d", path, off)
	}
	page := uint64(os.Getpagesize())
	word := func(file string, at uint64) uint64 {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var b [8]byte
		if _, err := f.ReadAt(b[:], int64(at)); err != nil {
			t.Fatalf("%s at %d: %v", file, at, err)
		}
		return binary.LittleEndian.Uint64(b[:])
	}
	pm := word("/proc/self/pagemap", addr/page*8)
	if pm>>63 == 0 {
		t.Fatalf("the page of offset %d of %s is not present", off, path)
	}
	flags := word("/proc/kpageflags", (pm&(1<<55-1))*8)
	const kpfDirty, kpfWriteback = 4, 8
	return flags>>kpfDirty&1 != 0, flags>>kpfWriteback&1 != 0
}

// TestFlushPolicies: whether a record's page is still only in memory
// after Send, as the kernel says. FlushEverySend: on disk when Send
// returns. FlushInterval: written by the handle's goroutine soon after
// (waited for, up to 20 s; the kernel's own writeback takes 30 s).
// FlushNone: still dirty, for the kernel to write later.
func TestFlushPolicies(t *testing.T) {
	for _, flush := range []FlushPolicy{FlushEverySend, FlushInterval, FlushNone} {
		t.Run(strconv.Itoa(int(flush)), func(t *testing.T) {
			c := Config{SegmentSize: 64 << 10, Flush: flush}
			if flush == FlushInterval {
				c.FlushPeriod = time.Millisecond
			}
			l, _ := newDirLog(t, c)
			ctx := timeout(t, 30*time.Second)
			var off uint64
			for i := range 3 { // the last one on a page of its own
				b := make([]byte, 16+4096*i)
				message(b, 3, uint64(i))
				var err error
				if off, err = l.Send(ctx, 0, b); err != nil {
					t.Fatal(err)
				}
			}
			path := l.segPath(0, 0)
			at := shm.HeaderSize + off + headerSize + 4096 // inside the last record
			dirty, wb := pageState(t, path, at)
			switch flush {
			case FlushEverySend:
				if dirty || wb {
					t.Fatalf("after Send returned: dirty %v, under writeback %v", dirty, wb)
				}
			case FlushNone:
				if !dirty && !wb {
					t.Fatal("after Send, with no flush: the page is clean already")
				}
			case FlushInterval:
				deadline := time.Now().Add(20 * time.Second)
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for dirty || wb {
					if time.Now().After(deadline) {
						t.Fatalf("20 s after Send: dirty %v, under writeback %v", dirty, wb)
					}
					<-tick.C
					dirty, wb = pageState(t, path, at)
				}
			}
		})
	}
}
