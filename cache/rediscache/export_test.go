package rediscache

import "github.com/ubkit-io/ubkit/internal/testenv"

// StartTestCluster starts the tests' Redis Cluster (once; TestMain stops
// it) and returns its masters' addresses, for the examples.
func StartTestCluster() ([]string, error) {
	clusterOnce.Do(func() { clusterEnv, clusterErr = testenv.StartRedisCluster(3) })
	if clusterErr != nil {
		return nil, clusterErr
	}
	return clusterEnv.Addrs, nil
}
