package mesh_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/credentials/insecure"

	"github.com/ubkit-io/ubkit/mesh"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// A control plane serves the services of a static registry over xDS, and
// an XDSRegistry (what a node proxy runs on) follows it as node n1 of the
// dev4 super node sees it. A change to the registry reaches the follower
// over the same stream.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	topo, err := topology.Example("dev4")
	if err != nil {
		panic(err)
	}
	reg, err := mesh.NewStaticRegistry([]mesh.Service{{Name: "greeter", Instances: []mesh.Instance{
		{Node: "n0", Address: "127.0.0.1:50051"},
		{Node: "n2", Address: "127.0.0.1:50052"},
	}}})
	if err != nil {
		panic(err)
	}
	cp := mesh.NewControlPlane(topo, reg)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go cp.Serve(l)
	defer cp.Close()

	xr, err := mesh.NewXDSRegistry(ctx, mesh.XDSConfig{SuperNode: topo.Name, Node: "n1", Server: l.Addr().String(),
		Credentials: insecure.NewCredentials()}) // insecure only because the control plane is on loopback
	if err != nil {
		panic(err)
	}
	defer xr.Close()
	select {
	case <-xr.Ready():
	case <-ctx.Done():
		panic("the control plane sent no endpoints")
	}
	printServices(ctx, xr)

	// A third instance starts, on n1 itself.
	err = reg.Set([]mesh.Service{{Name: "greeter", Instances: []mesh.Instance{
		{Node: "n0", Address: "127.0.0.1:50051"},
		{Node: "n1", Address: "127.0.0.1:50053"},
		{Node: "n2", Address: "127.0.0.1:50052"},
	}}})
	if err != nil {
		panic(err)
	}
	for endpoints(ctx, xr) != 3 {
		select {
		case <-xr.Changed():
		case <-ctx.Done():
			panic("the change did not arrive")
		}
	}
	fmt.Println("after the change:")
	printServices(ctx, xr)
	// Output:
	// greeter: n0 at 127.0.0.1:50051
	// greeter: n2 at 127.0.0.1:50052
	// after the change:
	// greeter: n0 at 127.0.0.1:50051
	// greeter: n1 at 127.0.0.1:50053
	// greeter: n2 at 127.0.0.1:50052
}

// printServices prints what reg holds, in a stable order.
func printServices(ctx context.Context, reg mesh.Registry) {
	services, err := reg.Services(ctx)
	if err != nil {
		panic(err)
	}
	slices.SortFunc(services, func(a, b mesh.Service) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range services {
		eps := slices.Clone(s.Instances)
		slices.SortFunc(eps, func(a, b mesh.Instance) int { return strings.Compare(a.Node, b.Node) })
		for _, ep := range eps {
			fmt.Printf("%s: %s at %s\n", s.Name, ep.Node, ep.Address)
		}
	}
}

// endpoints counts the endpoints reg holds.
func endpoints(ctx context.Context, reg mesh.Registry) int {
	services, _ := reg.Services(ctx)
	n := 0
	for _, s := range services {
		n += len(s.Instances)
	}
	return n
}
