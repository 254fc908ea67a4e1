// Package gomemcache is a drop-in for github.com/bradfitz/gomemcache's
// client: the same methods and types (*memcache.Item, memcache.ErrCacheMiss
// and the other errors), but keys that belong to a memcached server on
// this host backed by a cache.Store (package cache/memcached) are read and
// written in the store directly, with no network round trip. Keys of other
// servers go over the network as usual.
//
//	store, _ := cache.Open("sessions", cache.Config{})
//	mc, _ := gomemcache.New(store, "10.0.0.5:11211", "10.0.0.5:11211", "10.0.0.6:11211")
//	item, err := mc.Get("user:42") // served from shared memory if 10.0.0.5 is this host's server
//
// Because the server answers from the same store, both paths see the same
// entries, CAS tokens included.
package gomemcache

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/ubkit-io/ubkit/cache"
)

// Client is a gomemcache client that short-circuits the local server.
//
// gomemcache's methods take no context: a local one waits for a bucket of
// the store that a stopped writer holds at most the store's limit (5 s),
// then fails with an error wrapping cache.ErrBusy.
type Client struct {
	// Net is the network client for the other servers (and for the
	// settings gomemcache users tune: Timeout, MaxIdleConns).
	Net    *memcache.Client
	sl     *memcache.ServerList
	local  string
	shared *cache.Store
}

// New returns a client for servers; local, one of them, is the memcached
// server on this host that serves store.
func New(store *cache.Store, local string, servers ...string) (*Client, error) {
	sl := new(memcache.ServerList)
	if err := sl.SetServers(servers...); err != nil {
		return nil, err
	}
	la, err := resolve(local)
	if err != nil {
		return nil, err
	}
	return &Client{Net: memcache.NewFromSelector(sl), sl: sl, local: la, shared: store}, nil
}

func resolve(addr string) (string, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// isLocal says whether key belongs to the local server.
func (c *Client) isLocal(key string) bool {
	a, err := c.sl.PickServer(key)
	return err == nil && a.String() == c.local
}

func legalKey(key string) bool {
	if len(key) == 0 || len(key) > 250 {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] <= ' ' || key[i] == 0x7f {
			return false
		}
	}
	return true
}

// ttl turns an Item's Expiration into a TTL; negative means expired.
func ttl(exp int32) time.Duration { return cache.ExpTime(int64(exp)) }

func item(key string, v []byte, in cache.Info) *memcache.Item {
	it := &memcache.Item{Key: key, Value: v, Flags: in.Flags, CasID: in.Version}
	if !in.Expires.IsZero() {
		it.Expiration = int32(max(time.Until(in.Expires).Round(time.Second)/time.Second, 1))
	}
	return it
}

// Get gets the item for key; ErrCacheMiss if there is none.
func (c *Client) Get(key string) (*memcache.Item, error) {
	if !c.isLocal(key) {
		return c.Net.Get(key)
	}
	if !legalKey(key) {
		return nil, memcache.ErrMalformedKey
	}
	v, in, err := c.shared.Get(context.Background(), []byte(key), nil)
	if errors.Is(err, cache.ErrNotFound) {
		return nil, memcache.ErrCacheMiss
	}
	if err != nil {
		return nil, err
	}
	return item(key, v, in), nil
}

// GetMulti gets several keys; missing ones are absent from the map.
func (c *Client) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	out := map[string]*memcache.Item{}
	var remote []string
	for _, k := range keys {
		if !c.isLocal(k) {
			remote = append(remote, k)
			continue
		}
		it, err := c.Get(k)
		if errors.Is(err, memcache.ErrCacheMiss) {
			continue
		}
		if err != nil {
			return out, err
		}
		out[k] = it
	}
	if len(remote) > 0 {
		m, err := c.Net.GetMulti(remote)
		for k, it := range m {
			out[k] = it
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// store runs a storage operation on the store, with gomemcache's errors.
func (c *Client) store(it *memcache.Item, mode cache.Mode, version uint64) error {
	if !legalKey(it.Key) {
		return memcache.ErrMalformedKey
	}
	d := ttl(it.Expiration)
	if d < 0 {
		if mode == cache.Always {
			// A set that expires at once deletes, as memcached's does.
			_, err := c.shared.Delete(context.Background(), []byte(it.Key))
			return err
		}
		return nil
	}
	_, err := c.shared.Set(context.Background(), []byte(it.Key), it.Value, cache.SetOptions{Mode: mode, Version: version, TTL: d, Flags: it.Flags})
	return storeErr(err, mode)
}

func storeErr(err error, mode cache.Mode) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, cache.ErrExists) && mode == cache.IfVersion:
		return memcache.ErrCASConflict
	case errors.Is(err, cache.ErrExists), errors.Is(err, cache.ErrNotFound) && mode != cache.IfVersion:
		return memcache.ErrNotStored
	case errors.Is(err, cache.ErrNotFound):
		return memcache.ErrCacheMiss
	case errors.Is(err, cache.ErrTooLarge):
		return errors.New("memcache: unexpected response line from \"set\": \"SERVER_ERROR object too large for cache\\r\\n\"")
	}
	return err
}

// Set writes an item unconditionally.
func (c *Client) Set(it *memcache.Item) error {
	if !c.isLocal(it.Key) {
		return c.Net.Set(it)
	}
	return c.store(it, cache.Always, 0)
}

// Add writes an item only if its key has none (ErrNotStored otherwise).
func (c *Client) Add(it *memcache.Item) error {
	if !c.isLocal(it.Key) {
		return c.Net.Add(it)
	}
	return c.store(it, cache.IfAbsent, 0)
}

// Replace writes an item only if its key has one (ErrNotStored otherwise).
func (c *Client) Replace(it *memcache.Item) error {
	if !c.isLocal(it.Key) {
		return c.Net.Replace(it)
	}
	return c.store(it, cache.IfPresent, 0)
}

// CompareAndSwap writes an item fetched by Get if it has not changed since
// (ErrCASConflict if it has, ErrCacheMiss if it is gone).
func (c *Client) CompareAndSwap(it *memcache.Item) error {
	if !c.isLocal(it.Key) {
		return c.Net.CompareAndSwap(it)
	}
	return c.store(it, cache.IfVersion, it.CasID)
}

// Append adds the item's value after the stored one (ErrNotStored if
// there is none).
func (c *Client) Append(it *memcache.Item) error {
	if !c.isLocal(it.Key) {
		return c.Net.Append(it)
	}
	return c.editLocal(it, c.shared.Append)
}

// Prepend adds the item's value before the stored one.
func (c *Client) Prepend(it *memcache.Item) error {
	if !c.isLocal(it.Key) {
		return c.Net.Prepend(it)
	}
	return c.editLocal(it, c.shared.Prepend)
}

// editLocal runs Append or Prepend on the store, with gomemcache's errors.
func (c *Client) editLocal(it *memcache.Item, edit func(ctx context.Context, key, data []byte) error) error {
	if !legalKey(it.Key) {
		return memcache.ErrMalformedKey
	}
	err := edit(context.Background(), []byte(it.Key), it.Value)
	if errors.Is(err, cache.ErrNotFound) {
		return memcache.ErrNotStored
	}
	return storeErr(err, cache.Always)
}

// Delete removes key (ErrCacheMiss if it was not there).
func (c *Client) Delete(key string) error {
	if !c.isLocal(key) {
		return c.Net.Delete(key)
	}
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	found, err := c.shared.Delete(context.Background(), []byte(key))
	if err == nil && !found {
		return memcache.ErrCacheMiss
	}
	return err
}

// Increment adds delta to a decimal value and returns the new value.
func (c *Client) Increment(key string, delta uint64) (uint64, error) {
	if !c.isLocal(key) {
		return c.Net.Increment(key, delta)
	}
	return c.addLocal(key, delta, c.shared.Incr)
}

// Decrement subtracts delta, stopping at 0.
func (c *Client) Decrement(key string, delta uint64) (uint64, error) {
	if !c.isLocal(key) {
		return c.Net.Decrement(key, delta)
	}
	return c.addLocal(key, delta, c.shared.Decr)
}

// addLocal runs Incr or Decr on the store, with gomemcache's errors.
func (c *Client) addLocal(key string, delta uint64, add func(ctx context.Context, key []byte, delta uint64) (uint64, error)) (uint64, error) {
	if !legalKey(key) {
		return 0, memcache.ErrMalformedKey
	}
	v, err := add(context.Background(), []byte(key), delta)
	switch {
	case errors.Is(err, cache.ErrNotFound):
		return 0, memcache.ErrCacheMiss
	case errors.Is(err, cache.ErrNotNumber):
		return 0, errors.New("memcache: client error: cannot increment or decrement non-numeric value")
	}
	return v, err
}

// Touch sets key's expiration (seconds, as Item.Expiration).
func (c *Client) Touch(key string, seconds int32) error {
	if !c.isLocal(key) {
		return c.Net.Touch(key, seconds)
	}
	if !legalKey(key) {
		return memcache.ErrMalformedKey
	}
	d := ttl(seconds)
	var err error
	if d < 0 {
		var found bool
		if found, err = c.shared.Delete(context.Background(), []byte(key)); err == nil && !found {
			err = cache.ErrNotFound
		}
	} else {
		err = c.shared.Touch(context.Background(), []byte(key), d)
	}
	if errors.Is(err, cache.ErrNotFound) {
		return memcache.ErrCacheMiss
	}
	return err
}

// GetAndTouch gets key and sets its expiration.
func (c *Client) GetAndTouch(key string, seconds int32) (*memcache.Item, error) {
	if !c.isLocal(key) {
		return c.Net.GetAndTouch(key, seconds)
	}
	if err := c.Touch(key, seconds); err != nil {
		return nil, err
	}
	return c.Get(key)
}

// FlushAll empties every server, the local store included.
func (c *Client) FlushAll() error {
	return errors.Join(c.shared.Flush(context.Background()), c.Net.FlushAll())
}

// DeleteAll is FlushAll.
func (c *Client) DeleteAll() error { return c.FlushAll() }

// Ping checks every server.
func (c *Client) Ping() error { return c.Net.Ping() }

// Close closes the network client's idle connections.
func (c *Client) Close() error { return c.Net.Close() }
