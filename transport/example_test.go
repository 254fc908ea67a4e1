package transport_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/transport"
)

func Example() {
	ctx := context.Background()
	addr := fmt.Sprintf("ub:///example-%d", os.Getpid())
	l, err := transport.Listen(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo
	}()

	c, err := transport.Dial(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	c.Write([]byte("over shared memory"))
	c.CloseWrite()
	reply, _ := io.ReadAll(c)
	fmt.Println(string(reply), c.Path())
	// Output: over shared memory shm
}

func ExampleConn_LoanContext() {
	ctx := context.Background()
	addr := fmt.Sprintf("ub:///example-loan-%d", os.Getpid())
	l, err := transport.Listen(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer l.Close()
	go func() {
		c, err := l.AcceptConn(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			m, err := c.Recv(ctx)
			if err != nil {
				return
			}
			m.Release() // each release frees a buffer a waiting loan takes
		}
	}()

	c, err := transport.Dial(ctx, addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	// More messages than the pool has buffers: a loan waits for the
	// receiver's releases, for at most a second.
	loanCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for i := range 200 {
		m, err := c.LoanContext(loanCtx, 1000)
		if err != nil {
			fmt.Println(err)
			return
		}
		m.Bytes()[0] = byte(i)
		c.Send(m)
	}
	fmt.Println("sent 200")
	// Output: sent 200
}
