package ubgrpc_test

import (
	"context"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/transport/ubgrpc"
)

func Example() {
	ctx := context.Background()
	addr := fmt.Sprintf("ub:///health-%d", os.Getpid())

	l, err := transport.Listen(ctx, addr)
	if err != nil {
		panic(err)
	}
	srv := ubgrpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(l)
	defer srv.Stop()

	cc, err := ubgrpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	var p peer.Peer
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		panic(err)
	}
	// The server's address says how the call's bytes traveled.
	fmt.Println(resp.Status, p.Addr.(transport.Addr).Path)
	// Output: SERVING shm
}
