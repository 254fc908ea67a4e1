package ub

import (
	"context"
	"encoding/hex"
	"fmt"
)

// EID names an endpoint on the bus, like URMA's 16-byte eid.
type EID [16]byte

func (e EID) String() string { return hex.EncodeToString(e[:]) }

// Token protects a segment or jetty: a peer must present it to reach them
// (URMA's token value).
type Token uint32

// Access says what peers may do with a segment. Write implies Read and
// Atomic implies both, as in URMA.
type Access uint8

const (
	// AccessLocal allows no remote access at all.
	AccessLocal Access = 0
	// AccessRead allows remote Read.
	AccessRead Access = 1 << iota
	// AccessWrite allows remote Read and Write.
	AccessWrite
	// AccessAtomic allows remote Read, Write, CAS and FetchAdd.
	AccessAtomic
)

// Normalize applies the implications: Atomic needs Write, Write needs Read.
func (a Access) Normalize() Access {
	if a&AccessAtomic != 0 {
		a |= AccessWrite
	}
	if a&AccessWrite != 0 {
		a |= AccessRead
	}
	return a
}

func (a Access) String() string {
	a = a.Normalize()
	switch {
	case a&AccessAtomic != 0:
		return "read|write|atomic"
	case a&AccessWrite != 0:
		return "read|write"
	case a&AccessRead != 0:
		return "read"
	}
	return "local"
}

// SegmentConfig describes memory to register.
type SegmentConfig struct {
	Access Access
	Token  Token
}

// SegmentDesc is what a peer needs, besides the token, to import a segment.
// It is plain data: send it to the peer any way you like (it marshals to
// JSON).
type SegmentDesc struct {
	Provider string `json:"provider"`
	EID      EID    `json:"eid"`
	// Name locates the memory for the provider (for "shm", the shared
	// memory segment's name).
	Name string `json:"name"`
	Size int    `json:"size"`
}

// Segment is local memory registered for remote access: allocated by the
// provider (Context.AllocSegment) or the caller's own
// (Context.RegisterSegment).
type Segment interface {
	// Bytes is the registered memory: zeroed when allocated, the caller's
	// mem itself when registered. Peers may read and write it at any time,
	// within the segment's access flags. An allocated segment's must not
	// be used after Close; registered memory stays the caller's.
	Bytes() []byte
	// Desc describes the segment for peers.
	Desc() SegmentDesc
	// Close deregisters the segment: peers' later accesses complete with
	// StatusNoPermission, and work requests that name it as their local
	// buffer with StatusLocalLength. Operations in progress never fault.
	// It frees an allocated segment's memory, but never unmaps or frees
	// registered memory: the caller may go on using it.
	Close() error
}

// RemoteSegment is a peer's segment, imported with its token.
type RemoteSegment interface {
	// Desc is the descriptor it was imported with.
	Desc() SegmentDesc
	// Close releases what the import holds. Work requests that name it
	// afterwards fail with a status, or still reach the segment where an
	// import holds nothing; either way nothing faults.
	Close() error
}

// Mode is a jetty's transport mode.
type Mode uint8

const (
	// ReliableMessage (URMA RM): one jetty sends to many peers, each work
	// request naming its target; delivery is reliable and ordered per
	// initiator.
	ReliableMessage Mode = iota
	// ReliableConnection (URMA RC): the jetty is bound to one peer with
	// Bind; work requests go there in order.
	ReliableConnection
	// Unreliable (URMA UM): sends only, no one-sided operations; a send that
	// finds no posted receive is dropped.
	Unreliable
)

func (m Mode) String() string {
	switch m {
	case ReliableMessage:
		return "RM"
	case ReliableConnection:
		return "RC"
	case Unreliable:
		return "UM"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// JettyConfig describes a new jetty.
type JettyConfig struct {
	Mode Mode
	// SendCQ receives completions of posted sends; RecvCQ of posted
	// receives. They may be the same CQ.
	SendCQ, RecvCQ CQ
	// RecvDepth is how many receives can be posted at once (default 64).
	RecvDepth int
	// MaxMessage is the largest Send payload accepted (default 64 KiB).
	MaxMessage int
	// Token protects the jetty's receive queue.
	Token Token
}

// JettyDesc is what a peer needs, besides the token, to import a jetty.
type JettyDesc struct {
	Provider string `json:"provider"`
	EID      EID    `json:"eid"`
	Name     string `json:"name"`
}

// Target is a peer's jetty, imported with its token: where sends go.
type Target interface {
	// Desc is the descriptor it was imported with.
	Desc() JettyDesc
	Close() error
}

// Jetty is a send queue and a receive queue.
type Jetty interface {
	Desc() JettyDesc
	// Bind ties a reliable-connection jetty to its one peer, once. It
	// fails with ErrInvalidArgument on a jetty of another mode or one
	// bound already, and with ErrForeignObject for another provider's
	// target.
	Bind(Target) error
	// PostSend queues work requests in order and returns how many it
	// queued; on error, the request at that index was not queued. It
	// fails only when a request cannot be queued at all (ErrClosed,
	// ErrCQFull, ErrSendQueueFull): what goes wrong with a queued request
	// is its completion's Status. Each queued request completes exactly
	// once on the SendCQ, in posting order.
	PostSend(wrs []WR) (int, error)
	// PostRecv queues receive buffers, consumed in order by incoming sends
	// (and WriteImm notifications), which complete on the RecvCQ. It fails
	// with ErrClosed, ErrRecvQueueFull, ErrForeignObject (a buffer not in
	// a segment of the jetty's context) or ErrInvalidArgument (a range
	// outside its segment).
	PostRecv(wrs []RecvWR) (int, error)
	// Close flushes posted receives (StatusFlushed, in posting order) and
	// releases the jetty; peers' later sends to it complete with an error
	// status.
	Close() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(out) completions into out, oldest first,
	// without blocking. On a closed queue it returns ErrClosed.
	Poll(out []Completion) (int, error)
	// Wait blocks until a completion is ready to Poll, ctx ends (ctx's
	// error) or the queue closes (ErrClosed). A queue that implements
	// Interrupter also returns nil, with nothing to Poll, after an
	// Interrupt: callers look again in a loop.
	Wait(ctx context.Context) error
	// Close ends the Waits in progress and makes later calls fail.
	Close() error
}

// Interrupter is an optional interface of a CQ: a queue whose waits can be
// ended without a completion, for a waiter that knows something else is
// due (a receiver that has just sent a request polls for the answer
// rather than sleep on). It is the urma_wait_jfc of a completion event
// channel that a second event source can also wake.
//
// The count makes a race-free sleep possible: read Interrupts, tell others
// that you are about to sleep, then WaitInterrupt with the count you read.
// An Interrupt made in between ends that wait at once, where a plain Wait
// would miss it.
//
// A CQ that does not implement it ends its Waits only at a completion, at
// ctx's end or at Close.
type Interrupter interface {
	// Interrupt ends the waits in progress on the queue: each returns
	// nil, whether or not Poll has something.
	Interrupt()
	// Interrupts returns a count that changes at every Interrupt. It may
	// also change for the provider's own reasons (a completion it made
	// itself); a wait that sees it change returns all the same.
	Interrupts() uint64
	// WaitInterrupt is Wait that also returns nil as soon as Interrupts
	// differs from since: at once if it already does.
	WaitInterrupt(ctx context.Context, since uint64) error
}

// CQConfig describes a new completion queue.
type CQConfig struct {
	// Depth bounds the completions held (default 4096). A full CQ makes
	// posts fail (ErrCQFull) rather than lose completions; a provider may
	// hold more than Depth instead, but never loses one.
	Depth int
}

// Context is an open device endpoint of a provider. Its methods, and those
// of every object it makes, are safe for concurrent use. docs/ub.md
// ("Writing a provider") states the whole contract that ub/ubtest checks.
type Context interface {
	// EID names the endpoint; it is unique among open contexts.
	EID() EID
	// Provider is the name the provider registered under.
	Provider() string
	// AllocSegment allocates size bytes of memory registered for remote
	// access (memory a provider can expose to peers). A size that is not
	// positive fails with ErrInvalidArgument.
	AllocSegment(size int, cfg SegmentConfig) (Segment, error)
	// RegisterSegment registers memory the caller already has for remote
	// access (URMA's urma_register_seg): the segment's Bytes is mem
	// itself, and mem stays the caller's, who keeps it valid (mapped)
	// while it is registered. Peers reach it as they reach an allocated
	// segment, with the same descriptor, token and access checks. Close
	// deregisters it only. Empty mem fails with ErrInvalidArgument, and
	// so does memory the provider cannot expose to peers (for "shm",
	// memory outside a named shm segment mapped in this process;
	// docs/ub.md has each provider's rules).
	RegisterSegment(mem []byte, cfg SegmentConfig) (Segment, error)
	// ImportSegment makes a peer's segment reachable with token. A
	// descriptor of another provider, or a malformed one, fails with
	// ErrBadDescriptor; a wrong token is found out by each access
	// (StatusBadToken), not here.
	ImportSegment(desc SegmentDesc, token Token) (RemoteSegment, error)
	NewCQ(cfg CQConfig) (CQ, error)
	// NewJetty makes a jetty. Queues of another provider fail with
	// ErrForeignObject, an unknown mode with ErrInvalidArgument.
	NewJetty(cfg JettyConfig) (Jetty, error)
	// ImportJetty makes a peer's jetty reachable with token, like
	// ImportSegment.
	ImportJetty(desc JettyDesc, token Token) (Target, error)
	// Close closes everything the context made or imported, newest first.
	// Afterwards its constructors and imports fail with ErrClosed, and so
	// do Poll, Wait, PostSend and PostRecv of what it made. Every Close
	// after the first returns nil, here and on every object.
	Close() error
}
