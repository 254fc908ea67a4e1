// Package ub is ubkit's bus: a verbs API shaped like Huawei's URMA (the UB
// verbs of openEuler UMDK), so that a hardware provider can later be a thin
// binding, and the providers that implement it without UB hardware.
//
// The objects mirror URMA's:
//
//   - [Context]: a device endpoint, named by its [EID] (urma_create_context).
//   - [Segment]: local memory registered for remote access, with access
//     flags and a [Token] (urma_register_seg): memory the provider
//     allocates (Context.AllocSegment) or memory the caller already has
//     (Context.RegisterSegment); a peer reaches it through a
//     [RemoteSegment] it imports with the segment's descriptor and token
//     (urma_import_seg).
//   - [Jetty]: a send queue and a receive queue (urma_create_jetty), in
//     reliable-connection, reliable-message or unreliable mode; a peer's
//     jetty is reached through a [Target] (urma_import_jetty).
//   - [CQ]: a completion queue (urma_create_jfc) with non-blocking Poll and
//     blocking Wait.
//
// Work requests ([WR]) are posted in batches and each finishes with a
// [Completion]. Errors in the operation itself (out of bounds, wrong token,
// missing permission, no posted receive, a dead peer) are completion
// statuses, never panics: a post returns an error only when the request
// could not even be queued.
//
// Calls that cannot do what they are asked fail with errors that match
// this package's sentinels ([ErrClosed], [ErrCQFull], [ErrRecvQueueFull],
// [ErrSendQueueFull], [ErrForeignObject], [ErrBadDescriptor],
// [ErrInvalidArgument]) with errors.Is, whichever provider made them. A CQ
// may implement the optional [Interrupter], whose waits can be ended
// without a completion.
//
// Providers register by name with [Register], like database/sql drivers,
// and are opened with [Open] ([ErrUnknownProvider], naming the import, for
// a name nobody registered; [Providers] lists those registered); a program
// chooses them by importing their packages, and library code opens them
// by name. [Config] carries a provider's own options and a Logger for what
// it has to say that no call returns. ubkit ships "shm"
// (processes on one host, real zero copy through shared memory) in package
// ub/provider/shmprov, "tcp" (verbs over TCP) in ub/provider/tcpprov and
// "sim" (a simulated super node) in ub/provider/simprov. A process that
// plays a node of a super node opens its provider with [OpenNode], which
// tells a provider that can play any node ([NodeProvider], such as sim)
// which one, and checks a context that knows where it is ([NodeInfo]).
// "Writing a provider" in docs/ub.md states the whole contract a provider
// keeps, and ub/ubtest checks it; ub/internal/refprov, a provider written
// from that text and this package's documentation alone, passes it in
// ubkit's own tests. The super node's topology (nodes, links, path costs)
// is package ub/topology.
//
// ub is not a message protocol: connections, streams and flow control live
// in ubkit's transport package.
package ub
