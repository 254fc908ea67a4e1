// Package mux multiplexes streams over one connection: each stream is a
// net.Conn of its own, with credit-based flow control (a slow reader holds
// back only its own stream, and unread streams together hold at most the
// session's window), half-close, deadlines, and keepalives that close a
// session whose peer stopped answering.
//
// The wire format is written down in PROTOCOL.md and mirrored in frame.go.
// Exactly one goroutine writes to the connection, fed by a control queue
// that goes before data; one goroutine reads and dispatches.
package mux
