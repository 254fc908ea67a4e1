package ubgrpc_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ubkit-io/ubkit/internal/bench"
	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/transport/ubgrpc"
)

var seq atomic.Int64

// The sum service's messages travel as they are: the server picks this
// codec by the content subtype the client's ForceCodec names.
func init() { encoding.RegisterCodec(bytesCodec{}) }

// endpoint is a transport endpoint of this test's own (its own registry
// directory), closed when the test ends.
func endpoint(t *testing.T) *transport.Endpoint {
	t.Helper()
	ep, err := transport.NewEndpoint(transport.Config{RuntimeDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

func service(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid(), seq.Add(1))
}

// bytesCodec moves []byte messages as they are.
type bytesCodec struct{}

func (bytesCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (bytesCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (bytesCodec) Name() string { return "ubgrpc-test-bytes" }

// sumService is a client stream: it answers with the byte count and the
// checksum (bench.Sum) of everything it received.
var sumService = grpc.ServiceDesc{
	ServiceName: "ubgrpc.test.Sum",
	HandlerType: (*any)(nil),
	Streams:     []grpc.StreamDesc{{StreamName: "Sum", ClientStreams: true, Handler: sum}},
}

func sum(_ any, s grpc.ServerStream) error {
	var n, total uint64
	for {
		var b []byte
		if err := s.RecvMsg(&b); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		n += uint64(len(b))
		total += bench.Sum(b)
	}
	res := []byte(fmt.Sprintf("%d %d", n, total))
	return s.SendMsg(&res)
}

// holdService has a client stream that reads nothing until release is
// closed, and a server stream that sends 3 MiB at once and then says so on
// sent: a stream's window decides how far either gets before its peer
// reads.
type holdService struct {
	release, sent chan struct{}
}

var holdDesc = grpc.ServiceDesc{
	ServiceName: "ubgrpc.test.Hold",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "In",
		ClientStreams: true,
		Handler: func(srv any, s grpc.ServerStream) error {
			<-srv.(*holdService).release
			return sum(srv, s)
		},
	}, {
		StreamName:    "Out",
		ServerStreams: true,
		Handler: func(srv any, s grpc.ServerStream) error {
			var req []byte
			if err := s.RecvMsg(&req); err != nil {
				return err
			}
			for range 3 {
				b := make([]byte, 1<<20)
				if err := s.SendMsg(&b); err != nil {
					return err
				}
			}
			close(srv.(*holdService).sent)
			return nil
		},
	}},
}

// serve starts a NewServer with the health and sum services (and hold's,
// if not nil) on a listener for addr, wrapped by wrap if not nil; it stops
// with the test.
func serve(t *testing.T, ep *transport.Endpoint, addr string, wrap func(net.Listener) net.Listener, hold *holdService) {
	t.Helper()
	l, err := ep.Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := ubgrpc.NewServer(grpc.MaxRecvMsgSize(4 << 20))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	srv.RegisterService(&sumService, struct{}{})
	if hold != nil {
		srv.RegisterService(&holdDesc, hold)
	}
	var ln net.Listener = l
	if wrap != nil {
		ln = wrap(l)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
}

// client is a gRPC client of target with DialOptions(ep) and opts; it
// closes with the test.
func client(t *testing.T, ep *transport.Endpoint, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(target, append(append(ubgrpc.DialOptions(ep),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(4<<20))), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// pump sends msgs messages of size bytes on one client stream and checks
// the server's count and checksum.
func pump(ctx context.Context, cc *grpc.ClientConn, msgs, size int) error {
	cs, err := cc.NewStream(ctx, &sumService.Streams[0], "/ubgrpc.test.Sum/Sum", grpc.ForceCodec(bytesCodec{}))
	if err != nil {
		return err
	}
	var sum uint64
	for i := range msgs {
		b := make([]byte, size)
		bench.Fill(b, uint64(i))
		sum += bench.FillSum(size, uint64(i))
		if err := cs.SendMsg(&b); err != nil {
			return err
		}
	}
	if err := cs.CloseSend(); err != nil {
		return err
	}
	var res []byte
	if err := cs.RecvMsg(&res); err != nil {
		return err
	}
	if want := fmt.Sprintf("%d %d", msgs*size, sum); string(res) != want {
		return fmt.Errorf("server summed %q, want %q", res, want)
	}
	return nil
}

// TestEveryPath makes unary calls and streams 1 MiB messages through
// NewServer and a client with DialOptions on each path, the target given
// to gRPC as a ub:// address.
func TestEveryPath(t *testing.T) {
	for _, path := range []string{"shm", "ub", "tcp"} {
		t.Run(path, func(t *testing.T) {
			ep := endpoint(t)
			addr := "ub://" + ep.Node() + "/" + service(t)
			serve(t, ep, addr, nil, nil)
			cc := client(t, ep, addr+"?path="+path)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("unary call: %v, %v", resp, err)
			}
			if err := pump(ctx, cc, 8, 1<<20); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// readSizes wraps connections and records the largest buffer any Read
// was given.
type readSizes struct {
	mu  sync.Mutex
	max int
}

func (r *readSizes) conn(c net.Conn) net.Conn { return &sizedConn{Conn: c, r: r} }

func (r *readSizes) largest() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.max
}

type sizedConn struct {
	net.Conn
	r *readSizes
}

func (c *sizedConn) Read(b []byte) (int, error) {
	c.r.mu.Lock()
	c.r.max = max(c.r.max, len(b))
	c.r.mu.Unlock()
	return c.Conn.Read(b)
}

type sizedListener struct {
	net.Listener
	r *readSizes
}

func (l *sizedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.r.conn(c), nil
}

// TestReadsGoStraightIntoFrames checks what the options are for: with
// them, neither end reads through a buffer of gRPC's own (32 KiB, a
// copy of every byte), so no Read asks for more than an HTTP/2 frame
// (16 KiB). Without them this fails with 32 KiB reads.
func TestReadsGoStraightIntoFrames(t *testing.T) {
	ep := endpoint(t)
	addr := "ub://" + ep.Node() + "/" + service(t)
	var server, clientReads readSizes
	serve(t, ep, addr, func(l net.Listener) net.Listener { return &sizedListener{Listener: l, r: &server} }, nil)
	dial := ubgrpc.Dialer(ep)
	cc := client(t, ep, addr, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		c, err := dial(ctx, a)
		if err != nil {
			return nil, err
		}
		return clientReads.conn(c), nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := pump(ctx, cc, 4, 1<<20); err != nil {
		t.Fatal(err)
	}
	// The client reads only small frames (settings, window updates, the
	// answer); through gRPC's buffer even those are 32 KiB reads.
	const frame = 16 << 10
	if got := server.largest(); got == 0 || got > frame {
		t.Errorf("the server's largest read asked for %d bytes, want 1 to %d", got, frame)
	}
	if got := clientReads.largest(); got == 0 || got > frame {
		t.Errorf("the client's largest read asked for %d bytes, want 1 to %d", got, frame)
	}
}

// TestWindows: with the options' windows, 3 MiB fit in flight on one
// stream in each direction before its receiver reads a byte; gRPC's own
// windows start at 64 KiB and take no more.
func TestWindows(t *testing.T) {
	ep := endpoint(t)
	addr := "ub://" + ep.Node() + "/" + service(t)
	h := &holdService{release: make(chan struct{}), sent: make(chan struct{})}
	serve(t, ep, addr, nil, h)
	defer close(h.release)
	cc := client(t, ep, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// Client to server: three 1 MiB sends return while the server holds.
	in, err := cc.NewStream(ctx, &holdDesc.Streams[0], "/ubgrpc.test.Hold/In", grpc.ForceCodec(bytesCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		for range 3 {
			b := make([]byte, 1<<20)
			if err := in.SendMsg(&b); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("3 MiB of sends did not fit in the server's windows")
	}

	// Server to client: the server's three sends return before the
	// client reads.
	out, err := cc.NewStream(ctx, &holdDesc.Streams[1], "/ubgrpc.test.Hold/Out", grpc.ForceCodec(bytesCodec{}))
	if err != nil {
		t.Fatal(err)
	}
	req := []byte("go")
	if err := out.SendMsg(&req); err != nil {
		t.Fatal(err)
	}
	out.CloseSend()
	select {
	case <-h.sent:
	case <-time.After(5 * time.Second):
		t.Fatal("3 MiB of server sends did not fit in the client's windows")
	}
	for range 3 {
		var b []byte
		if err := out.RecvMsg(&b); err != nil || len(b) != 1<<20 {
			t.Fatalf("received %d bytes, %v", len(b), err)
		}
	}
}

// TestTargets: NewClient takes ub:// addresses only, and says why it
// refuses one before any call; a bad target given to grpc.NewClient with
// DialOptions fails its calls with the same reason.
func TestTargets(t *testing.T) {
	for _, bad := range []string{"dns:///greeter", "ub://n0", "ub://n0/", "ub://n0/svc?path=carrier-pigeon"} {
		if cc, err := ubgrpc.NewClient(bad, grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
			cc.Close()
			t.Errorf("NewClient(%q) = nil error", bad)
		} else if !strings.Contains(err.Error(), bad) {
			t.Errorf("NewClient(%q): %v (does not name the target)", bad, err)
		}
	}
	cc, err := ubgrpc.NewClient("ub:///greeter", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	cc.Close()

	ep := endpoint(t)
	cc, err = grpc.NewClient("ub://n0", append(ubgrpc.DialOptions(ep), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err == nil || !strings.Contains(err.Error(), "lacks a service") {
		t.Fatalf("a call to ub://n0: %v, want the resolver's reason", err)
	}
	if code := status.Code(err); code != codes.Unavailable {
		t.Fatalf("a call to ub://n0 ended with %v, want Unavailable at once, not its deadline", code)
	}
}
