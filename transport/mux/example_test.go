package mux_test

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/ubkit-io/ubkit/transport/mux"
)

func Example() {
	a, b := net.Pipe() // any connection: a transport.Conn, a TCP conn...
	client, server := mux.Client(a, nil), mux.Server(b, nil)
	defer client.Close()
	defer server.Close()

	go func() {
		for {
			st, err := server.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				io.Copy(st, st) // echo each stream
			}()
		}
	}()
	for _, msg := range []string{"first stream", "second stream"} {
		st, _ := client.Open()
		st.Write([]byte(msg))
		st.CloseWrite()
		reply, _ := io.ReadAll(st)
		st.Close()
		fmt.Println(st.ID(), string(reply))
	}
	// Output:
	// 1 first stream
	// 3 second stream
}
