package ub

import "errors"

// The conditions every provider reports the same way. Providers wrap them
// with detail (the provider's name, the depth that was exceeded, the name
// that could not be parsed), so callers match them with errors.Is, never
// by text. They are errors of a call: a work request that fails once it is
// queued completes with a Status instead.
var (
	// ErrClosed: the object, or the context that made it, is closed.
	// Context's constructors and imports, CQ.Poll, CQ.Wait (including a
	// Wait in progress when the queue closes), Jetty.PostSend and
	// Jetty.PostRecv return it.
	ErrClosed = errors.New("use of a closed object")
	// ErrCQFull: a post's completions would not fit in its completion
	// queue. The request at the index PostSend returns, and those after
	// it, were not queued; poll, then post them again.
	ErrCQFull = errors.New("completion queue full")
	// ErrRecvQueueFull: a jetty already holds as many posted receives as
	// its receive depth allows.
	ErrRecvQueueFull = errors.New("receive queue full")
	// ErrSendQueueFull: a jetty already holds as many requests not yet
	// started as its provider allows.
	ErrSendQueueFull = errors.New("send queue full")
	// ErrForeignObject: an argument is an object of another provider, or
	// of another context where the provider needs its own (a receive
	// buffer, a jetty's queues, a Bind target).
	ErrForeignObject = errors.New("object of another provider or context")
	// ErrBadDescriptor: an imported descriptor is of another provider, is
	// malformed, or names no object the provider can find.
	ErrBadDescriptor = errors.New("bad descriptor")
	// ErrInvalidArgument: a size, mode, depth or buffer range is out of
	// range, memory given to RegisterSegment is empty or cannot be exposed
	// by the provider, or a Bind is not allowed (not a reliable-connection
	// jetty, or bound already).
	ErrInvalidArgument = errors.New("invalid argument")
)
