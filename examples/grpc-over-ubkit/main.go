// Command grpc-over-ubkit runs an unchanged gRPC server and client over a
// ubkit transport: the server gets a transport listener, the client a
// ub:// target, and package ubgrpc the options that suit the bus. Between
// two processes on one host the bytes then move through shared memory.
// (Both ends are in this process here, for brevity.)
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/transport/ubgrpc"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpc-over-ubkit:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := fmt.Sprintf("ub:///health-example-%d", os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Server: a transport listener, and ubgrpc.NewServer for
	// grpc.NewServer.
	l, err := transport.Listen(ctx, addr)
	if err != nil {
		return err
	}
	srv := ubgrpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	defer srv.Stop()

	// Client: the ub:// address is the target, and ubgrpc.NewClient
	// stands for grpc.NewClient.
	cc, err := ubgrpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)

	start := time.Now()
	const calls = 1000
	for range calls {
		resp, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if resp.Status != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("status %v", resp.Status)
		}
	}
	fmt.Printf("%d gRPC health checks over %s: %v per call\n", calls, addr, (time.Since(start) / calls).Round(100*time.Nanosecond))
	return nil
}
