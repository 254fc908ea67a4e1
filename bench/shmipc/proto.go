package main

import (
	"encoding/binary"
	"fmt"
	"os"
	"time"

	shmipc "github.com/cloudwego/shmipc-go"
)

// Wire format used on top of the shmipc-go byte stream.
//
// shmipc-go streams carry bytes, not messages, so message boundaries come
// from fixed sizes:
//
//   - pingpong-64B: every request and every reply is exactly 64 bytes, one
//     per Flush. Word 0 of a request is its sequence number; a request whose
//     word 0 equals quitWord asks the server to stop (it is still answered).
//   - stream-*: every Flush carries one 64-byte frame header followed by
//     `count` messages of the case's size. The header is also used alone for
//     control frames (sync, ack, quit). The header is 64 bytes so that the
//     payload that follows it stays cache-line aligned in shared memory.
const (
	msgSize64  = 64
	msgSize1M  = 1 << 20
	headerSize = 64

	quitWord = ^uint64(0)

	// Frame kinds (header word 0, low 32 bits).
	kindData    = 1 // client->server: `count` messages follow. a = cumulative frame number, flags&flagAckReq asks for an ack.
	kindSync    = 2 // client->server: a = messages since last sync, b = checksum since last sync.
	kindSyncAck = 3 // server->client: a, b = what the server consumed since last sync.
	kindAck     = 4 // server->client: a = cumulative frame number consumed.
	kindQuit    = 5 // client->server: stop.
	kindBye     = 6 // server->client: a = server-side shm fallback/error counters (must be 0).

	flagAckReq = 1
)

// Per-message pattern: word k of message number seq is seqBase(seq)+k.
const patternSeed = 0x5DEECE66DB1F3A27

func seqBase(seq uint64) uint64 { return patternSeed + seq*0x9E3779B97F4A7C15 }

// patternSum is the wrapping sum of the words base, base+1, ..., base+n-1.
func patternSum(base uint64, n uint64) uint64 { return n*base + n*(n-1)/2 }

type frameHeader struct {
	kind  uint32
	count uint32
	flags uint32
	a, b  uint64
}

func putHeader(p []byte, h frameHeader) {
	_ = p[headerSize-1]
	binary.LittleEndian.PutUint32(p[0:4], h.kind)
	binary.LittleEndian.PutUint32(p[4:8], h.count)
	binary.LittleEndian.PutUint32(p[8:12], h.flags)
	binary.LittleEndian.PutUint32(p[12:16], 0)
	binary.LittleEndian.PutUint64(p[16:24], h.a)
	binary.LittleEndian.PutUint64(p[24:32], h.b)
}

func getHeader(p []byte) frameHeader {
	_ = p[headerSize-1]
	return frameHeader{
		kind:  binary.LittleEndian.Uint32(p[0:4]),
		count: binary.LittleEndian.Uint32(p[4:8]),
		flags: binary.LittleEndian.Uint32(p[8:12]),
		a:     binary.LittleEndian.Uint64(p[16:24]),
		b:     binary.LittleEndian.Uint64(p[24:32]),
	}
}

// fillPattern writes base, base+1, ... as little-endian uint64 words over p
// (len(p) must be a multiple of 32).
func fillPattern(p []byte, base uint64) {
	for len(p) >= 32 {
		binary.LittleEndian.PutUint64(p[0:8], base)
		binary.LittleEndian.PutUint64(p[8:16], base+1)
		binary.LittleEndian.PutUint64(p[16:24], base+2)
		binary.LittleEndian.PutUint64(p[24:32], base+3)
		base += 4
		p = p[32:]
	}
}

// sumWords returns the wrapping sum of the little-endian uint64 words of p
// (len(p) must be a multiple of 32). Every byte is read.
func sumWords(p []byte) uint64 {
	var s0, s1, s2, s3 uint64
	for len(p) >= 32 {
		s0 += binary.LittleEndian.Uint64(p[0:8])
		s1 += binary.LittleEndian.Uint64(p[8:16])
		s2 += binary.LittleEndian.Uint64(p[16:24])
		s3 += binary.LittleEndian.Uint64(p[24:32])
		p = p[32:]
	}
	return s0 + s1 + s2 + s3
}

// sendControl writes one header-only frame and flushes it.
func sendControl(st *shmipc.Stream, h frameHeader) error {
	p, err := st.BufferWriter().Reserve(headerSize)
	if err != nil {
		return fmt.Errorf("reserve control frame: %w", err)
	}
	putHeader(p, h)
	if err := st.Flush(false); err != nil {
		return fmt.Errorf("flush control frame: %w", err)
	}
	return nil
}

// readHeader reads one frame header. The caller must call
// ReleasePreviousRead once it is done with the frame.
func readHeader(st *shmipc.Stream) (frameHeader, error) {
	p, err := st.BufferReader().ReadBytes(headerSize)
	if err != nil {
		return frameHeader{}, err
	}
	return getHeader(p), nil
}

// caseSpec describes one benchmark case.
type caseSpec struct {
	name     string
	msgSize  int
	pingpong bool
	unit     string
	better   string
}

var cases = map[string]caseSpec{
	"pingpong-64B": {name: "pingpong-64B", msgSize: msgSize64, pingpong: true, unit: "ns/op", better: "lower"},
	"stream-64B":   {name: "stream-64B", msgSize: msgSize64, unit: "msg/s", better: "higher"},
	"stream-1MiB":  {name: "stream-1MiB", msgSize: msgSize1M, unit: "GB/s", better: "higher"},
}

// msgsPerFrame is the number of messages the client puts in one Flush.
func (c caseSpec) msgsPerFrame(batch int) int {
	if c.pingpong || c.msgSize >= msgSize1M {
		return 1
	}
	return batch
}

// sliceCap returns the capacity of the single shmipc buffer-slice class used
// for a case: big enough to hold a whole flush (header + messages) in one
// slice, and chosen so that capacity+20 (shmipc's slice header) is a multiple
// of 64, which keeps every slice's data 64-byte aligned in the mapping.
func (c caseSpec) sliceCap(batch int) uint32 {
	need := c.msgSize
	if !c.pingpong {
		need = headerSize + c.msgSize*c.msgsPerFrame(batch)
	}
	if need < 4096 {
		need = 4096
	}
	const sliceHdr = 20
	return uint32((need+sliceHdr+63)&^63 - sliceHdr)
}

// newConfig returns the shmipc-go session configuration used by both sides.
func newConfig(c caseSpec, batch int, shmCap uint32, memfd bool, pathPrefix string) *shmipc.Config {
	conf := shmipc.DefaultConfig()
	conf.LogOutput = os.Stderr
	conf.InitializeTimeout = 10 * time.Second
	conf.ConnectionWriteTimeout = 10 * time.Second
	conf.QueueCap = 65536
	conf.ShareMemoryBufferCap = shmCap
	conf.BufferSliceSizes = []*shmipc.SizePercentPair{{Size: c.sliceCap(batch), Percent: 100}}
	conf.ShareMemoryPathPrefix = pathPrefix
	conf.QueuePath = pathPrefix + "_queue"
	if memfd {
		conf.MemMapType = shmipc.MemMapTypeMemFd
	} else {
		conf.MemMapType = shmipc.MemMapTypeDevShmFile
	}
	return conf
}

// slicesAvailable estimates how many buffer slices the shm buffer holds.
func slicesAvailable(c caseSpec, batch int, shmCap uint32) int {
	return int((uint64(shmCap) - 64) / uint64(c.sliceCap(batch)+20))
}
