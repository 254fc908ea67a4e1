// Package cache is a key-value cache in shared memory that every process on
// a host shares (Store), sharded across the nodes of a super node (Cluster),
// with drop-ins for go-redis and memcached clients built on it.
//
// A Store lives in one named shared-memory segment: a hash table of buckets
// (14 entries each) and an shm.Pool of records. Each bucket has an
// shm.SeqLock. Readers take no lock: a writer makes the lock's sequence
// number odd while it changes the bucket, and a reader that saw it change,
// or saw the record it read returned to the pool, reads again. Writers lock
// one bucket at a time; the lock names the holding process, and a lock
// whose holder died is taken over and the bucket repaired (every entry's
// record is checked against its checksum),
// so a writer killed in the middle of a write leaves neither a torn value
// nor a stuck lock. Values expire by TTL, are replaced by compare-and-swap
// on their version, and are evicted by CLOCK beyond a byte limit.
package cache
