// Package brokers tests testenv's real message brokers (StartPulsar,
// StartRocketMQ) with the upstream Go clients, pulsar-client-go and
// rocketmq-client-go: messages round-trip through each, survive a restart
// on the same data, and a client pointed at no broker fails. It holds
// only tests; the mq package's tests start the same brokers.
package brokers
