// Command mesh-proxy starts a 3-node simulated super node with ubkit's mesh
// in this process: the xDS control plane, a node proxy per node (configured
// from it, hops between them over the bus with mutual TLS) and an HTTP
// service on n2; then it sends an HTTP request to n0's proxy, as an
// application on n0 would, and prints the answer.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/ubkit-io/ubkit/internal/meshsim"
)

func main() {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the service on n2 (you asked for %s)\n", r.URL.Path)
	})
	m, err := meshsim.Start("dev4", []string{"n0", "n1", "n2"}, "hello", "n2", hello)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer m.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	url := "http://" + m.Local["n0"] + "/greeting"
	resp, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("GET %s (n0's proxy) -> %s", url, body)
}
