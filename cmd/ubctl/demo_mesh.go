package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/ubkit-io/ubkit/internal/meshsim"
)

// demoMesh runs the mesh on three nodes of the simulated dev4: the control
// plane, a proxy per node configured from it, and an HTTP service on n2
// that an application on n0 reaches through its node's proxy.
func demoMesh(w io.Writer) error {
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello from n2") })
	m, err := meshsim.Start("dev4", []string{"n0", "n1", "n2"}, "hello", "n2", hello)
	if err != nil {
		return err
	}
	defer m.Close()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	get := func(url string) (time.Duration, string, error) {
		start := time.Now()
		resp, err := client.Get(url)
		if err != nil {
			return 0, "", err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return time.Since(start), string(b), err
	}
	var via, direct []time.Duration
	var answer string
	for range demoCalls {
		d, body, err := get("http://" + m.Local["n0"] + "/")
		if err != nil {
			return err
		}
		answer = body
		via = append(via, d)
		if d, _, err = get("http://" + m.Backend + "/"); err != nil {
			return err
		}
		direct = append(direct, d)
	}
	slices.Sort(via)
	slices.Sort(direct)
	fmt.Fprintf(w, "\nthe mesh on dev4 (control plane, a proxy per node over xDS, mutual TLS between proxies over the bus):\n")
	fmt.Fprintf(w, "  an application on n0 asks its node's proxy for \"hello\", served on n2: %q\n", answer)
	fmt.Fprintf(w, "  through n0's and n2's proxies  p50 %v   (two 20 µs simulated link crossings included)\n", via[len(via)/2].Round(time.Microsecond))
	fmt.Fprintf(w, "  straight to the backend (TCP)  p50 %v\n", direct[len(direct)/2].Round(time.Microsecond))
	return nil
}
