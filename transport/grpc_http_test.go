package transport_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ubkit-io/ubkit/transport"
)

var seq atomic.Int64

func service(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("ub:///%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid(), seq.Add(1))
}

// paths are the address suffixes that force each path.
var paths = map[string]string{"shm": "", "tcp": "?path=tcp", "ub": "?path=ub"}

// TestGRPC runs an unchanged gRPC server on a transport listener and an
// unchanged client through transport.Dial, on every path: a unary call and
// a server stream.
func TestGRPC(t *testing.T) {
	for name, query := range paths {
		t.Run(name, func(t *testing.T) { testGRPC(t, query) })
	}
}

func testGRPC(t *testing.T, query string) {
	addr := service(t)
	l, err := transport.Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(l)
	defer srv.Stop()

	cc, err := grpc.NewClient("passthrough:///ubkit",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return transport.Dial(ctx, addr+query) }))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("unary call: %v %v", resp, err)
	}
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{Service: "svc"})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	hs.SetServingStatus("svc", healthpb.HealthCheckResponse_SERVING)
	second, err := stream.Recv()
	if err != nil || second.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("stream: %v then %v, %v", first.Status, second, err)
	}
}

// TestHTTP serves net/http on a transport listener and calls it through an
// http.Transport whose DialContext is transport.Dial, on every path.
func TestHTTP(t *testing.T) {
	for name, query := range paths {
		t.Run(name, func(t *testing.T) { testHTTP(t, query) })
	}
}

func testHTTP(t *testing.T, query string) {
	addr := service(t)
	l, err := transport.Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, len(body))
	})}
	go srv.Serve(l)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return transport.Dial(ctx, addr+query) },
	}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for i := range 3 { // the connection is reused
		resp, err := client.Post("http://ubkit/echo", "text/plain", strings.NewReader(strings.Repeat("x", 100000*i)))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("POST /echo %d", 100000*i); string(body) != want {
			t.Fatalf("got %q, want %q", body, want)
		}
	}
}

// TestHTTP2Cleartext serves HTTP/2 without TLS (h2c) over a transport
// listener to an HTTP/2 client dialing through transport, with net/http's
// own unencrypted HTTP/2.
func TestHTTP2Cleartext(t *testing.T) {
	addr := service(t)
	l, err := transport.Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &h2, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Proto, r.URL.Path)
	})}
	go srv.Serve(l)
	defer srv.Close()
	tr := &http.Transport{Protocols: &h2, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return transport.Dial(ctx, addr)
	}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for range 3 {
		resp, err := client.Get("http://ubkit/h2")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "HTTP/2.0 /h2" {
			t.Fatalf("got %q", body)
		}
	}
}

// TestGRPCOverStreams serves gRPC on the streams of one session over one
// same-host connection: every client connection is a stream.
func TestGRPCOverStreams(t *testing.T) {
	addr := service(t)
	l, err := transport.Listen(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dialed, err := transport.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	serverSide := (<-accepted).(*transport.Conn).Session(nil)
	clientSide := dialed.Session(nil)
	defer clientSide.Close()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(serverSide.Listener())
	defer srv.Stop()
	// Three clients, three streams, one connection.
	for range 3 {
		cc, err := grpc.NewClient("passthrough:///streams",
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return clientSide.Open() }))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cc.Close()
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("call over a stream: %v %v", resp, err)
		}
	}
}
