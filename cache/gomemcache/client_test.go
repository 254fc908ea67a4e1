package gomemcache

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ubkit-io/ubkit/cache"
	"github.com/ubkit-io/ubkit/cache/memcached"
	"github.com/ubkit-io/ubkit/internal/testenv"
)

func TestClient(t *testing.T) {
	name := fmt.Sprintf("mcclient-%d", os.Getpid())
	store, err := cache.Open(name, cache.Config{MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Remove(name)
	defer store.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := memcached.NewServer(store)
	go srv.Serve(l)
	defer srv.Close()
	remote, err := testenv.StartMemcached()
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()

	local := l.Addr().String()
	mc, err := New(store, local, local, remote.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.Close()
	plain := memcache.New(local) // an ordinary client of the local server
	direct := memcache.New(remote.Addr)

	var localKeys, remoteKeys []string
	for i := 0; len(localKeys) < 20 || len(remoteKeys) < 20; i++ {
		k := fmt.Sprintf("key-%d", i)
		if mc.isLocal(k) {
			localKeys = append(localKeys, k)
		} else {
			remoteKeys = append(remoteKeys, k)
		}
	}
	for _, k := range append(append([]string(nil), localKeys...), remoteKeys...) {
		if err := mc.Set(&memcache.Item{Key: k, Value: []byte("v-" + k), Flags: 3}); err != nil {
			t.Fatal(err)
		}
	}
	// Local keys landed in the store (and the local server serves them to
	// anyone); remote keys in the remote server.
	for _, k := range localKeys {
		if v, _, err := store.Get(t.Context(), []byte(k), nil); err != nil || string(v) != "v-"+k {
			t.Fatalf("%s not in the store: %v", k, err)
		}
		if it, err := plain.Get(k); err != nil || string(it.Value) != "v-"+k || it.Flags != 3 {
			t.Fatalf("%s through the local server: %+v %v", k, it, err)
		}
	}
	for _, k := range remoteKeys {
		if it, err := direct.Get(k); err != nil || string(it.Value) != "v-"+k {
			t.Fatalf("%s not on the remote server: %v", k, err)
		}
	}
	m, err := mc.GetMulti(append(append([]string{"nope"}, localKeys...), remoteKeys...))
	if err != nil || len(m) != len(localKeys)+len(remoteKeys) {
		t.Fatalf("get multi: %d items, %v", len(m), err)
	}

	k := localKeys[0]
	it, err := mc.Get(k)
	if err != nil {
		t.Fatal(err)
	}
	// A CAS token from the wrapper works through the server, and back.
	it.Value = []byte("swapped")
	if err := plain.CompareAndSwap(it); err != nil {
		t.Fatalf("cas through the server with the wrapper's token: %v", err)
	}
	it.Value = []byte("stale")
	if err := mc.CompareAndSwap(it); !errors.Is(err, memcache.ErrCASConflict) {
		t.Fatalf("stale cas: %v", err)
	}
	if err := mc.Add(&memcache.Item{Key: k, Value: []byte("x")}); !errors.Is(err, memcache.ErrNotStored) {
		t.Fatalf("add: %v", err)
	}
	if err := mc.Append(&memcache.Item{Key: k, Value: []byte("!")}); err != nil {
		t.Fatal(err)
	}
	if it, _ := plain.Get(k); it == nil || string(it.Value) != "swapped!" {
		t.Fatalf("after append: %+v", it)
	}
	mc.Set(&memcache.Item{Key: localKeys[1], Value: []byte("41")})
	if v, err := mc.Increment(localKeys[1], 1); err != nil || v != 42 {
		t.Fatalf("incr: %d %v", v, err)
	}
	if err := mc.Delete(k); err != nil {
		t.Fatal(err)
	}
	if _, err := mc.Get(k); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := mc.Get("bad key"); !errors.Is(err, memcache.ErrMalformedKey) {
		t.Fatalf("malformed key: %v", err)
	}

	// No round trip: with the local server gone, local keys still work.
	srv.Close()
	if it, err := mc.Get(localKeys[2]); err != nil || string(it.Value) != "v-"+localKeys[2] {
		t.Fatalf("local key with the server stopped: %v", err)
	}
	if err := mc.Set(&memcache.Item{Key: localKeys[3], Value: []byte("still")}); err != nil {
		t.Fatalf("local set with the server stopped: %v", err)
	}
}
