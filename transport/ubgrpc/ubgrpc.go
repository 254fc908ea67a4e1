// Package ubgrpc runs unchanged gRPC over ubkit's transport: a server on a
// transport.Listener, a client that dials ub:// targets, and the gRPC
// options that suit a transport connection.
//
//	l, _ := transport.Listen(ctx, "ub:///greeter")
//	srv := ubgrpc.NewServer()
//	go srv.Serve(l)
//
//	cc, _ := ubgrpc.NewClient("ub:///greeter",
//		grpc.WithTransportCredentials(insecure.NewCredentials()))
//
// Plain grpc.NewServer and grpc.NewClient with a transport dialer work too
// (see package transport); this package's options make them faster:
//
//   - No read buffer of gRPC's own. gRPC wraps a connection it cannot read
//     without blocking a thread (anything but a socket) in a 32 KiB read
//     buffer, so a 16 KiB frame is copied from the connection into that
//     buffer and from there into the frame. A transport connection
//     already reads from memory (a shared ring on the shm path, received
//     packets on the others), so that copy is waste.
//   - Flow-control windows of 4 MiB per stream and 8 MiB per connection
//     from the start. gRPC sizes its windows from a bandwidth-delay
//     estimate, which on a bus with microsecond round trips stays small,
//     and the sender then waits on window updates.
//
// The windows move a 1 MiB gRPC stream 20-40% faster on the shm path; no
// read buffer saves a copy of every received byte (about 5% of a stream
// server's CPU), which did not move throughput measurably on top of the
// windows (docs/PERFORMANCE.md, "gRPC options"). Writes keep gRPC's
// buffer: it gathers a call's frames into one write, which wakes the
// reader once.
//
// The windows bound what a stream (connection) may have in flight unread.
// A fixed window is no smaller than what gRPC's estimate reaches on a path
// this fast, but it does not grow past 4 MiB on a slow, long one (the tcp
// path to a distant node), where gRPC's own may reach 16 MiB. No later
// option gives gRPC's adaptive windows back once a window option is set;
// for them, build the options from the parts: grpc.WithResolvers(Resolver()),
// grpc.WithContextDialer(Dialer(ep)) and grpc.WithReadBufferSize(0) (on a
// server, grpc.ReadBufferSize(0)).
package ubgrpc

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"

	"github.com/ubkit-io/ubkit/transport"
)

// Scheme is the target scheme NewClient and DialOptions resolve:
// ub://<node>/<service>[?path=shm|ub|tcp], as transport.Dial takes it.
const Scheme = "ub"

// Flow-control windows ServerOptions and DialOptions set.
const (
	StreamWindow = 4 << 20
	ConnWindow   = 8 << 20
)

// ServerOptions are the options for a gRPC server that serves transport
// listeners: no read buffer of gRPC's own, and fixed windows. Serve only
// transport listeners with such a server: on a plain socket every frame
// header would cost a system call.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ReadBufferSize(0),
		grpc.InitialWindowSize(StreamWindow),
		grpc.InitialConnWindowSize(ConnWindow),
	}
}

// NewServer is grpc.NewServer with ServerOptions first; opts may override
// the window sizes and the read buffer size (not turn the windows back
// into gRPC's adaptive ones).
func NewServer(opts ...grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append(ServerOptions(), opts...)...)
}

// DialOptions are the options for a gRPC client of ub:// targets: a
// resolver for the ub scheme, a dialer that dials with ep (the package
// transport's default endpoint if nil), no read buffer of gRPC's own, and
// fixed windows.
// Credentials stay the caller's choice, as with any gRPC client.
func DialOptions(ep *transport.Endpoint) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithResolvers(Resolver()),
		grpc.WithContextDialer(Dialer(ep)),
		grpc.WithReadBufferSize(0),
		grpc.WithInitialWindowSize(StreamWindow),
		grpc.WithInitialConnWindowSize(ConnWindow),
	}
}

// Dialer returns a dialer for grpc.WithContextDialer that dials the
// address gRPC resolved (a ub:// address) with ep, or with the package
// transport's default endpoint if ep is nil.
func Dialer(ep *transport.Endpoint) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		if ep != nil {
			return ep.Dial(ctx, addr)
		}
		return transport.Dial(ctx, addr)
	}
}

// NewClient is grpc.NewClient for a ub:// target with DialOptions(nil)
// first. opts may override the dialer, the window sizes and the read
// buffer size, not the resolver (gRPC takes the first one for a scheme)
// nor turn the windows back into adaptive ones. A target that is no
// transport address is refused here, not at the first call.
func NewClient(target string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if _, err := transport.ParseAddr(target); err != nil {
		return nil, fmt.Errorf("ubgrpc: %w", err)
	}
	return grpc.NewClient(target, append(DialOptions(nil), opts...)...)
}

// Resolver returns the resolver for ub:// targets DialOptions uses, for a
// client that assembles its own options. It is not registered globally.
func Resolver() resolver.Builder { return builder{} }

// builder resolves a ub:// target to itself: finding the node and the
// service's socket is the dialer's job (transport's registry and
// topology), so the resolver only hands the address over.
type builder struct{}

func (builder) Scheme() string { return Scheme }

func (builder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	addr := t.URL.String()
	if _, err := transport.ParseAddr(addr); err != nil {
		return nil, fmt.Errorf("ubgrpc: %w", err)
	}
	// Like gRPC's passthrough resolver, ignore what the balancer makes of
	// the state: the address does not change, so there is nothing to
	// retry with.
	_ = cc.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
	return nop{}, nil
}

type nop struct{}

func (nop) ResolveNow(resolver.ResolveNowOptions) {}
func (nop) Close()                                {}
