// Package testenv gives ubkit's tests the real parts they run against
// (DESIGN.md, "Tests use real parts"): today, two "hosts" made of network
// namespaces joined by a veth link (NewNetnsPair), for multi-host transport
// and CNI tests; and another user on the host (OtherUser), a throwaway
// unprivileged user to run the test binary as (User.Command), for tests of
// what other users can and cannot do to ubkit's files and sockets; and a
// fresh default runtime directory (IsolateRuntimeDir) for such tests; and
// real servers on free loopback ports for TestMain functions: redis-server
// (StartRedis), a Redis Cluster of masters joined by redis-cli
// (StartRedisCluster) and memcached (StartMemcached), each stopped by its
// Close.
//
// Every helper takes the test's testing.TB and registers t.Cleanup for what it
// makes, so a test leaves nothing behind; leftovers of a test process that was
// killed are swept by the next one. A missing prerequisite fails the test
// with a message that names it and says how to get it: nothing here skips.
// `make test` runs prereqs.sh first, which installs what it can.
//
// It is for tests only, not for ubkit's library code or programs.
package testenv
