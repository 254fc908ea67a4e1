// Package tcpprov is the "tcp" provider of the ub verbs API: endpoints on
// different hosts with no UB hardware, every verb emulated over TCP (as
// soft-RoCE emulates RDMA over Ethernet), one-sided Write, Read and atomics
// included. Import it for its side effect:
//
//	import _ "github.com/ubkit-io/ubkit/ub/provider/tcpprov"
//	ctx, err := ub.Open(context.Background(), "tcp", ub.Config{Options: map[string]string{"listen": "10.0.0.5:0"}})
//
// Each context listens on a TCP address (Config.Options["listen"], else the
// UB_TCP_LISTEN variable, else 127.0.0.1:0); descriptors carry that address,
// or Options["advertise"] (required when listening on a wildcard address).
// A one-sided operation is a request to the owner's context, which checks
// token, access and bounds and answers; the initiator's completion arrives
// with the answer. Requests to one peer travel in order on one connection,
// and a jetty's completions are delivered in the order it posted them.
//
// A peer that dies closes its connections (the kernel resets them): every
// request in flight to it, and every later one, completes with
// StatusPeerDead.
//
// Segments and jetties have random wire ids. Requests that fail
// authorization (an unknown id, a wrong token) are answered with their
// status at once up to a burst, then at a bounded rate per source host; and
// a source host, like the context, is served a bounded number of
// connections at once (docs/security.md).
package tcpprov
