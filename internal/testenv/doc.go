// Package testenv gives ubkit's tests the real parts they run against
// (DESIGN.md, "Tests use real parts"): two "hosts" made of network
// namespaces joined by a veth link (NewNetnsPair), for multi-host transport
// and CNI tests; another user on the host (OtherUser), a throwaway
// unprivileged user to run the test binary as (User.Command), for tests of
// what other users can and cannot do to ubkit's files and sockets; a fresh
// default runtime directory (IsolateRuntimeDir) for such tests; and real
// servers on free loopback ports (StartRedis; StartRedisCluster, masters
// joined by redis-cli; StartMemcached), each stopped by its Close; and
// real message brokers from their Maven Central jars (StartPulsar, a
// Pulsar standalone; StartRocketMQ, a name server and a broker), stopped
// by t.Cleanup and restartable on the same data (Restart).
//
// It also runs every test package: Main is each package's TestMain, and
// fails the run on what the tests leaked (goroutines, child processes,
// descriptors, shared memory). Child, ChildTest and their namespace and
// user variants run the test binary again as a child process, in a role
// its package registered (RegisterChild) or running one test; WaitParked
// waits until goroutines sleep, for tests that act on sleepers;
// NewLogRecorder gives a component a logger whose lines a test can wait
// for (LogRecorder.WaitFor).
//
// Every helper takes the test's testing.TB and registers t.Cleanup for what it
// makes, so a test leaves nothing behind; leftovers of a test process that was
// killed are swept by the next one. A missing prerequisite fails the test
// with a message that names it and says how to get it: nothing here skips.
// `make test` runs prereqs.sh first, which installs what it can.
//
// It is for tests only, not for ubkit's library code or programs.
package testenv
