package cachesuite

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/memcached"
	"github.com/ubkit-io/ubkit/internal/bench"
)

// mcServer: Goroutines gomemcache goroutines, 90% get / 10% set, against
// cache/memcached serving a pool from another process (ubkit) or against
// memcached; both GET every key once first.
func mcServer(e *Env, kind string, d time.Duration) (bench.Measurement, error) {
	var addr string
	if kind == "ubkit" {
		name := poolName()
		p, err := filledPool(name)
		if err != nil {
			return bench.Measurement{}, err
		}
		defer cache.Remove(name)
		defer p.Close()
		peer, err := bench.StartPeerPipe("cache-mcserver", peerArgs{Addr: name})
		if err != nil {
			return bench.Measurement{}, err
		}
		defer peer.Kill()
		line, err := bufio.NewReader(peer.Stdout()).ReadString('\n')
		if err != nil {
			return bench.Measurement{}, fmt.Errorf("cache-mcserver: %w", err)
		}
		addr = strings.TrimSpace(line)
	} else {
		s, err := e.Memcached()
		if err != nil {
			return bench.Measurement{}, err
		}
		addr = s.Addr
	}
	g := mcGetter(newMemcache(addr, Goroutines))
	defer g.close()
	if err := warmAll(g); err != nil {
		return bench.Measurement{}, err
	}
	v, err := mixedLoad(g, 3, 10, d)
	if err != nil {
		return bench.Measurement{}, err
	}
	if err := readYourWrites(g, 3, rywChecks); err != nil {
		return bench.Measurement{}, err
	}
	return bench.Measurement{Value: v}, nil
}

// mcServerPeer serves the pool named a.Addr with cache/memcached on a
// loopback port, which it prints.
func mcServerPeer(a peerArgs) error {
	p, err := cache.Open(a.Addr, cache.Config{MaxBytes: poolBytes})
	if err != nil {
		return err
	}
	defer p.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(l.Addr())
	return memcached.NewServer(p).Serve(l)
}
