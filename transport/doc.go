// Package transport gives applications and ubkit's adapters connections over
// the bus: a net.Listener and a net.Conn with full semantics (deadlines,
// half-close, concurrent Read and Write, graceful Close), so net/http and
// gRPC run on it unchanged, plus zero-copy messages beside the byte stream
// (Loan, Send, Recv, Release) and multiplexed streams (Conn.Session,
// package transport/mux).
//
// Addresses are "ub://<node>/<service>". A connection takes one of three
// paths, reported by Conn.Path and chosen by where the peer is:
//
//   - shm: the peer plays the same node. Two shared-memory rings in a
//     sealed anonymous segment the dialer hands to the listener over a unix
//     socket, after the listener checked the dialer's user (SO_PEERCRED).
//     Bytes move with no system call on the fast path.
//   - ub: another compute node of the super node. Packets over the ub verbs
//     provider (sim, tcp, or hardware): sends into the peer's posted
//     receive buffers, credits returned by one-sided fetch-and-add.
//   - tcp: any other node. Packets over plain TCP.
//
// A path can be forced per address ("ub://n3/svc?path=tcp") or per
// Endpoint. An Endpoint is a process's place on the super node (its node,
// topology and ub provider); Listen and Dial use one made from the
// environment (UB_NODE, UB_TOPOLOGY, UB_PROVIDER, UBKIT_PATH). transport
// imports no ub provider: the program registers the one it uses by
// importing its package, as it does database/sql drivers
// (ub/provider/tcpprov for the default, "tcp").
//
// Services are found through a per-host registry: a runtime directory of
// rendezvous sockets (one per service) for dialers on this host, and for
// dialers on other hosts a small TCP service at the address the topology
// gives each node (label ubkit.io/registry).
package transport
