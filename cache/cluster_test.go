package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ubkit-io/ubkit/transport"
	"github.com/ubkit-io/ubkit/ub/topology"
)

// dev4Cluster starts a member on each node of the simulated dev4 super
// node, in this process.
func dev4Cluster(t *testing.T, near time.Duration) (map[string]*Cluster, map[string]*Store) {
	t.Helper()
	topo, err := topology.Example("dev4")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	members, pools := map[string]*Cluster{}, map[string]*Store{}
	svc := fmt.Sprintf("cache-%d-%d", os.Getpid(), poolSeq.Add(1))
	for _, n := range []string{"n0", "n1", "n2", "n3"} {
		ep, err := transport.NewEndpoint(transport.Config{Node: n, Topology: topo, Provider: "sim", RuntimeDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := newStore(t, Config{MaxBytes: 8 << 20})
		c, err := NewCluster(context.Background(), ClusterConfig{Endpoint: ep, Store: p, Service: svc, NearTTL: near})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Close()
			ep.Close()
		})
		members[n], pools[n] = c, p
	}
	return members, pools
}

func TestClusterShardsAcrossNodes(t *testing.T) {
	members, pools := dev4Cluster(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 1000
	for i := range n {
		k := []byte("key-" + strconv.Itoa(i))
		if _, err := members["n0"].Set(ctx, k, value(uint64(i), 40), SetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	total := uint64(0)
	for node, p := range pools {
		items := p.Stats().Items
		if items == 0 {
			t.Errorf("node %s holds nothing: the keys did not spread", node)
		}
		total += items
	}
	if total != n {
		t.Fatalf("%d items over the nodes, want %d (each key on one node)", total, n)
	}
	for i := range n {
		k := []byte("key-" + strconv.Itoa(i))
		if members["n1"].Owner(k) != members["n3"].Owner(k) {
			t.Fatal("members disagree on an owner")
		}
		v, _, err := members["n2"].Get(ctx, k, nil)
		if err != nil || !intact(v) {
			t.Fatalf("%s from n2: %v", k, err)
		}
	}
	if _, _, err := members["n1"].Get(ctx, []byte("nope"), nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing key: %v", err)
	}
	k := []byte("key-1")
	if _, err := members["n3"].Set(ctx, k, []byte("x"), SetOptions{Mode: IfAbsent}); !errors.Is(err, ErrExists) {
		t.Fatalf("add of an existing key across nodes: %v", err)
	}
	if ok, err := members["n3"].Delete(ctx, k); !ok || err != nil {
		t.Fatalf("delete: %v %v", ok, err)
	}
	if _, _, err := members["n0"].Get(ctx, k, nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestClusterNearCopy(t *testing.T) {
	members, pools := dev4Cluster(t, time.Minute)
	ctx := context.Background()
	var k []byte
	for i := 0; ; i++ { // a key n1 does not own
		k = []byte("near-" + strconv.Itoa(i))
		if members["n1"].Owner(k) != "n1" {
			break
		}
	}
	owner := pools[members["n1"].Owner(k)]
	members["n0"].Set(ctx, k, []byte("v1"), SetOptions{})
	members["n1"].Get(ctx, k, nil)
	hits := owner.Stats().Hits
	for range 5 {
		if v, _, err := members["n1"].Get(ctx, k, nil); err != nil || string(v) != "v1" {
			t.Fatalf("near read: %q %v", v, err)
		}
	}
	if owner.Stats().Hits != hits {
		t.Errorf("repeated reads went to the owner (%d more hits there)", owner.Stats().Hits-hits)
	}
	// A write through n1 drops n1's copy.
	members["n1"].Set(ctx, k, []byte("v2"), SetOptions{})
	if v, _, _ := members["n1"].Get(ctx, k, nil); string(v) != "v2" {
		t.Fatalf("after a write through this node: %q", v)
	}
}

func TestClusterNodeDown(t *testing.T) {
	members, _ := dev4Cluster(t, 0)
	var k []byte
	for i := 0; ; i++ {
		k = []byte("down-" + strconv.Itoa(i))
		if members["n0"].Owner(k) == "n3" {
			break
		}
	}
	members["n3"].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, _, err := members["n0"].Get(ctx, k, nil); err == nil {
		t.Fatal("read a key of a node that is down")
	}
}
