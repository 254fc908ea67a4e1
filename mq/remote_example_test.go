package mq_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/ubkit-io/ubkit/mq"
	"github.com/ubkit-io/ubkit/ub"
	"github.com/ubkit-io/ubkit/ub/provider/simprov"
)

// A server streams a log's partition to a remote reader; here over
// loopback TCP (a transport listener, "ub://<node>/<service>", gives the
// shm or ub path instead).
func ExampleServe() {
	name := "example-remote-" + strconv.Itoa(os.Getpid())
	log, err := mq.Create(name, mq.Config{SegmentSize: 1 << 20, Segments: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mq.Remove(name)
	defer log.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log.Send(ctx, 0, []byte("result 1"))
	log.Send(ctx, 0, []byte("result 2"))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := mq.NewServer(log, mq.ServeConfig{})
	go srv.Serve(ln)
	defer srv.Close()

	d := mq.Dialer{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", addr)
	}}
	r, err := d.DialReader(ctx, ln.Addr().String(), name, 0, mq.Oldest)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer r.Close()
	for range 2 {
		rec, err := r.Next(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%d: %s\n", rec.Offset, rec.Payload)
	}
	// Output:
	// 0: result 1
	// 24: result 2
}

// A leader on node n0 of the simulated dev4 super node replicates its
// partition to a follower's log on n1 with one-sided ub writes; Send
// under AckFollower returns once n1 has the record, and a consumer on
// n1 reads it locally.
func ExampleReplicate() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := strconv.Itoa(os.Getpid())
	node := func(n string) ub.Context {
		c, err := ub.Open(ctx, simprov.Name, ub.Config{Options: map[string]string{
			simprov.OptTopology: "dev4", simprov.OptNode: n, simprov.OptFabric: "example-" + id}})
		if err != nil {
			panic(err)
		}
		return c
	}
	n0, n1 := node("n0"), node("n1")
	defer n0.Close()
	defer n1.Close()
	defer n1.(*simprov.Context).Fabric().Remove()
	leader, _ := mq.Create("example-leader-"+id, mq.Config{SegmentSize: 64 << 10})
	defer mq.Remove("example-leader-" + id)
	defer leader.Close()
	follower, _ := mq.Create("example-follower-"+id, mq.Config{SegmentSize: 64 << 10})
	defer mq.Remove("example-follower-" + id)
	defer follower.Close()

	// The control connection only carries the handshake.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	followed := make(chan *mq.Follower, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			followed <- nil
			return
		}
		f, err := mq.Follow(ctx, follower, n1, c, mq.FollowerConfig{})
		if err != nil {
			fmt.Println(err)
		}
		followed <- f
	}()
	c, _ := net.Dial("tcp", ln.Addr().String())
	rep, err := mq.Replicate(ctx, leader, 0, n0, c, mq.ReplicaConfig{Ack: mq.AckFollower})
	f := <-followed
	if err != nil || f == nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	defer rep.Close()

	off, err := rep.Send(ctx, []byte("inference result"))
	fmt.Println("acknowledged by n1:", err == nil, "at", off)
	r, _ := follower.NewReader(0, 0)
	defer r.Close()
	rec, _ := r.Next(ctx)
	fmt.Printf("n1 reads %q at %d\n", rec.Payload, rec.Offset)
	// Output:
	// acknowledged by n1: true at 0
	// n1 reads "inference result" at 0
}
