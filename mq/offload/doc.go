// Package offload keeps large message payloads out of a broker: a
// producer puts the payload into a shared-memory mq.Log (Store) and sends
// the broker a small reference (Ref) to it; a consumer resolves the
// reference (Resolver) in place from the log when the log is on its host,
// else over transport from the producer host's fetch Server. It is the
// core of the Pulsar and RocketMQ drop-ins (mq/ubpulsar, mq/ubrocketmq).
//
// A reference is only as durable as the log behind it: the store drops
// old payloads by size (mq.FullOverwrite), and a reference whose payload
// is gone resolves to ErrPayloadGone, never to an empty payload. The
// broker keeps its own semantics (ordering, acknowledgements,
// redelivery): offload changes what it carries, not how.
//
// It is not a durable object store (payloads live in shared memory, lost
// with the host), and not a way around the broker's access control: a
// consumer reads a payload only if it can open the log on its host (the
// same user) or reach the fetch server (transport's user and TLS checks).
package offload
