package transport_test

import (
	"context"
	"fmt"
	"io"
	"os"

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
