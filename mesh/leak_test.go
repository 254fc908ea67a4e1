package mesh

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/internal/procstat"
)

// TestNodeProxyConnectCloseReturnsEverything: 100 connections through
// node proxies (n0's, then over the simulated bus to n1's and its
// backend), each made and closed, leave the proxies holding what they
// held after the first: descriptors, shared-memory mappings and
// goroutines come back, and resident memory stays within a bound (before
// the fixes of issue 15 each one left two descriptors and two 2 MiB
// mappings, and the proxies' memory grew by about 1 MiB).
func TestNodeProxyConnectCloseReturnsEverything(t *testing.T) {
	web, _, _, _ := proxies(t, nil, nil)
	once := func(i int) {
		t.Helper()
		c, err := net.DialTimeout("tcp", web["n0"], 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET /%d HTTP/1.0\r\n\r\n", i)
		b, err := io.ReadAll(c)
		if err != nil || !strings.Contains(string(b), fmt.Sprintf("n1 served GET /%d", i)) {
			t.Fatalf("connection %d: %q, %v", i, b, err)
		}
	}
	once(0) // the proxies' ub contexts open on first use
	// A goroutine of the first connection still ending would count in
	// before: the check is then a connection more lenient, never flaky.
	before, err := procstat.Compact()
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := 1; i <= n; i++ {
		once(i)
	}
	after, err := procstat.Returned(before, procstat.Usage{FDs: 2, Shared: 2, Goroutines: 2, RSS: procstat.RSSSlack(12 << 20)}, 10*time.Second)
	if err != nil {
		t.Fatalf("%d connections through the proxies: %v", n, err)
	}
	t.Logf("after the first connection: %v; after %d more: %v", before, n, after)
}
