// Package shmprov is the "shm" provider of the ub verbs API: endpoints on one
// host, in one process or several, with real zero copy through shared
// memory. Import it for its side effect:
//
//	import _ "github.com/ubkit-io/ubkit/ub/provider/shmprov"
//	ctx, err := ub.Open(context.Background(), "shm", ub.Config{})
//
// Every segment and jetty is a named shm segment (/dev/shm/ubkit-<uid>-ub-...),
// opened by peers from its descriptor. One-sided operations load and store
// the peer's memory directly; sends copy the payload straight into the
// receiver's posted buffer (one copy, as an RDMA NIC would do it) and push
// the receive completion into a ring in the receiver's jetty. Operations run
// when posted, so a completion is ready as soon as PostSend returns.
//
// Everything a peer can write is validated before use (see package shm):
// a hostile peer makes operations complete with an error status.
package shmprov
