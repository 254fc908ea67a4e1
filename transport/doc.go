// Package transport gives applications and ubkit's adapters connections over
// the bus: a net.Listener and a net.Conn with full semantics (deadlines,
// half-close, concurrent Read and Write), so net/http and gRPC run on it
// unchanged.
//
// This first version carries the same-host path: a connection is a pair of
// shared-memory rings (package shm) in an anonymous, sealed segment that
// the dialer hands to the listener over a unix socket, after the listener
// has checked that the dialer runs as the same user (SO_PEERCRED). Bytes
// then move through shared memory with no system call on the fast path.
//
// Addresses are "ub://<node>/<service>"; the service names a rendezvous
// socket in a per-user runtime directory ($XDG_RUNTIME_DIR/ubkit, else
// /tmp/ubkit-<uid>).
package transport
