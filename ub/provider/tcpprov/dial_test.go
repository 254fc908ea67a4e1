package tcpprov

import (
	"sync"
	"testing"
)

// TestOneConnectionPerPeer: jetties that reach a peer for the first time at
// the same moment share one connection; with two, a jetty's requests could
// overtake each other (a reliable connection keeps them in order).
func TestOneConnectionPerPeer(t *testing.T) {
	a, b := openContext(t), openContext(t)
	for round := range 20 {
		a.mu.Lock()
		for k, cn := range a.conns {
			cn.nc.Close()
			delete(a.conns, k)
		}
		a.mu.Unlock()
		got := make([]*conn, 8)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				cn, err := a.dial(b.addr)
				if err != nil {
					t.Error(err)
				}
				got[i] = cn
			})
		}
		wg.Wait()
		for _, cn := range got[1:] {
			if cn != got[0] {
				t.Fatalf("round %d: two connections to one peer", round)
			}
		}
	}
}
