//go:build !linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// On systems other than Linux, shm keeps its API, so that the packages
// above it compile everywhere, but has no shared memory: segments need
// memfds and /dev/shm, wake-ups futexes, descriptor checks memfd seals,
// and liveness /proc and pidfds. Everything that would make or reach a
// segment fails with errUnsupported, and the rings and the pool, which
// only work inside a segment, are never reached.

// errUnsupported is the error of every call that needs Linux. It matches
// errors.ErrUnsupported.
var errUnsupported = fmt.Errorf("shm: shared memory is not supported on %s; ubkit's shm layer needs Linux (memfd, futex, SO_PEERCRED, /proc): %w", runtime.GOOS, errors.ErrUnsupported)

// NamePrefix starts the name of every named segment ubkit creates.
const NamePrefix = "ubkit-"

// ShmDir is where named POSIX segments would live.
var ShmDir = "/dev/shm"

// HeaderSize is the size of the header at the start of every segment.
const HeaderSize = 4096

// SegmentConfig configures a new segment (see the Linux build).
type SegmentConfig struct {
	HugePages bool
	Populate  bool
	Keep      bool
}

// SegmentOptions is the old name of SegmentConfig.
//
// Deprecated: use SegmentConfig.
type SegmentOptions = SegmentConfig

// Segment is a mapped shared-memory segment; on this system none can be
// made, and every method reports an empty segment or errUnsupported.
type Segment struct{}

// CreateSegment fails: shared memory needs Linux.
func CreateSegment(name string, size int, opts *SegmentConfig) (*Segment, error) {
	return nil, errUnsupported
}

// OpenSegment fails: shared memory needs Linux.
func OpenSegment(name string) (*Segment, error) { return nil, errUnsupported }

// RepairSegment fails: shared memory needs Linux.
func RepairSegment(name string, size int, opts *SegmentConfig) (*Segment, error) {
	return nil, errUnsupported
}

// CreateMemfd fails: shared memory needs Linux.
func CreateMemfd(name string, size int, opts *SegmentConfig) (*Segment, error) {
	return nil, errUnsupported
}

// MapCache keeps idle segment mappings on Linux; on this system there are
// none to keep.
type MapCache struct{}

// NewMapCache returns an empty cache.
func NewMapCache(n int) *MapCache { return &MapCache{} }

// Hits is 0.
func (c *MapCache) Hits() uint64 { return 0 }

// Idle is 0.
func (c *MapCache) Idle() int { return 0 }

// Room is 0.
func (c *MapCache) Room() int { return 0 }

// OpenSegment fails: shared memory needs Linux.
func (c *MapCache) OpenSegment(name string) (*Segment, error) { return nil, errUnsupported }

// ReuseSegment fails: shared memory needs Linux.
func (c *MapCache) ReuseSegment(old, name string, size int) (*Segment, error) {
	return nil, errUnsupported
}

// Release closes s.
func (c *MapCache) Release(s *Segment) error { return s.Close() }

// Close does nothing.
func (c *MapCache) Close() error { return nil }

// Sweep fails: there are no segments to sweep.
func Sweep() ([]string, error) { return nil, errUnsupported }

// Segments fails: there are no segments to list.
func Segments() ([]string, error) { return nil, errUnsupported }

func (s *Segment) Name() string                             { return "" }
func (s *Segment) ID() uint32                               { return 0 }
func (s *Segment) Creator() Process                         { return Process{} }
func (s *Segment) Size() int                                { return 0 }
func (s *Segment) Data() []byte                             { return nil }
func (s *Segment) ReadAt(p []byte, off int64) (int, error)  { return 0, errUnsupported }
func (s *Segment) WriteAt(p []byte, off int64) (int, error) { return 0, errUnsupported }
func (s *Segment) Seal() error                              { return errUnsupported }
func (s *Segment) Sealed() bool                             { return false }
func (s *Segment) Unlink() error                            { return errUnsupported }
func (s *Segment) Close() error                             { return nil }
func (s *Segment) Uint64At(off int) (*atomic.Uint64, error) { return nil, errUnsupported }
func (s *Segment) Uint32At(off int) (*atomic.Uint32, error) { return nil, errUnsupported }

// Process identifies a process across pid reuse (see the Linux build).
type Process struct {
	PID   uint32
	Start uint64
}

// Self returns the calling process, known by its pid alone here.
func Self() Process { return Process{PID: uint32(os.Getpid())} }

// LookupProcess fails: telling processes apart across pid reuse needs
// /proc.
func LookupProcess(pid int) (Process, error) { return Process{}, errUnsupported }

// Alive reports whether p is this process: without /proc nothing else
// can be told, and without shared memory there are no peers to watch.
func (p Process) Alive() bool { return p.PID == Self().PID }

// Word packs the identity into 64 bits, as on Linux.
func (p Process) Word() uint64 { return p.word() }

func (p Process) word() uint64 { return uint64(p.PID)<<32 | p.Start&0xffffffff }

func processFromWord(w uint64) Process { return Process{PID: uint32(w >> 32), Start: w & 0xffffffff} }

// AliveWord is Alive for an identity stored with Word.
func AliveWord(w uint64) bool { return aliveWord(w) }

func aliveWord(w uint64) bool { return processFromWord(w).Alive() }

// livenessInterval is how often a blocked waiter checks its peer, as on
// Linux.
const livenessInterval = 20 * time.Millisecond

// futexWait waits for at most d, the bound every caller gives; callers
// re-check their condition, as after a spurious wake-up.
func futexWait(addr *atomic.Uint32, val uint32, d time.Duration) {
	if addr.Load() == val {
		time.Sleep(d)
	}
}

// futexWake wakes nobody: waiters wake at the end of their bounded waits.
func futexWake(addr *atomic.Uint32, n int) int { return 0 }

// Yield lets other goroutines run (this system's build has no
// sched_yield call).
func Yield() { runtime.Gosched() }

// sleepAny: no futex_waitv here.
func sleepAny([]*atomic.Uint32, []uint32, time.Duration) error { return ErrSleepAnyUnsupported }

// bell is an MPMC ring's FIFO; there is none here, and rings have a nil
// bell.
type bell struct{ rd *os.File }

func bellPath(seg *Segment, off int) string                    { return "" }
func newBell(path string, armed, written *atomic.Uint32) *bell { return nil }
func (b *bell) ring()                                          {}
func (b *bell) close()                                         {}
func (b *bell) sleep(ctx context.Context, ready func() bool, d time.Duration) bool {
	return false
}

// EnableBell fails: bells need FIFOs next to the ring's segment.
func (r *MPMC) EnableBell() error { return errUnsupported }

// SendSegment fails: passing segments needs Linux.
func SendSegment(conn *net.UnixConn, s *Segment) error { return errUnsupported }

// ReceiveOptions says what ReceiveSegment accepts (see the Linux build).
type ReceiveOptions struct {
	AllowUnsealed bool
	Size          int
}

// ReceiveSegment fails: passing segments needs Linux.
func ReceiveSegment(conn *net.UnixConn, opts *ReceiveOptions) (*Segment, error) {
	return nil, errUnsupported
}

// PipeEnd is the end of a pipe ReceivePipes expects.
type PipeEnd int

// The ends of a pipe.
const (
	PipeReadEnd PipeEnd = iota + 1
	PipeWriteEnd
)

func (e PipeEnd) String() string {
	switch e {
	case PipeReadEnd:
		return "read end"
	case PipeWriteEnd:
		return "write end"
	}
	return fmt.Sprintf("PipeEnd(%d)", int(e))
}

// SendPipes fails: checked descriptor passing needs Linux.
func SendPipes(conn *net.UnixConn, ends ...*os.File) error { return errUnsupported }

// ReceivePipes fails: checked descriptor passing needs Linux.
func ReceivePipes(conn *net.UnixConn, want ...PipeEnd) ([]*os.File, error) {
	return nil, errUnsupported
}

// PinProcess fails: CPU affinity needs Linux.
func PinProcess(n int) (int, error) { return 0, errUnsupported }

// Credentials identify the process at the other end of a unix socket.
type Credentials struct {
	PID, UID, GID int
}

// PeerCredentials fails: SO_PEERCRED is Linux's.
func PeerCredentials(conn *net.UnixConn) (Credentials, error) {
	return Credentials{}, errUnsupported
}

// ErrWouldBlock reports a PipeWriter's write that found the pipe full and
// did not wait for room.
var ErrWouldBlock = errors.New("shm: the pipe is full")

// PipeWriter writes to a pipe without waiting (see the Linux build).
type PipeWriter struct{}

// NewPipeWriter fails: writes that never wait need Linux's build.
func NewPipeWriter(f *os.File) (*PipeWriter, error) { return nil, errUnsupported }

// TryWrite fails: writes that never wait need Linux's build.
func (w *PipeWriter) TryWrite(b []byte) (int, error) { return 0, errUnsupported }

// AllowedCPU is not supported on this system.
func AllowedCPU(n int) (int, error) { return 0, errUnsupported }

// MappingOf fails: shared memory needs Linux.
func MappingOf(b []byte) (Mapping, error) { return Mapping{}, errUnsupported }

// RenameSegment fails: see the Linux version.
func RenameSegment(old, name string) (*Segment, error) { return nil, errUnsupported }

// ReuseSegment fails: see the Linux version.
func ReuseSegment(old, name string, size int) (*Segment, error) { return nil, errUnsupported }
