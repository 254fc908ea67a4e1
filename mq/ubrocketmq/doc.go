// Package ubrocketmq is a drop-in for
// github.com/apache/rocketmq-client-go/v2: NewProducer and
// NewPushConsumer return a rocketmq.Producer and a rocketmq.PushConsumer
// with payload offload for the topics that opt in. A producer puts a body
// larger than Options.Threshold into the super node's shared memory (an
// mq/offload Store) and sends the broker a small reference with a
// checksum, marked by the message property PropertyOffload; a push
// consumer's callback gets the original body back (resolved in place on
// the producer's host, else from its fetch server over transport). A
// reference whose payload is gone is logged and its batch returned as
// ConsumeRetryLater, never delivered empty. Everything else (queues and
// their order, consumer groups, retries, the DLQ) is the broker's.
//
// It is not a local topic (the broker still carries every message) and
// not durable storage for bodies (docs/mq.md, "Payload offload").
package ubrocketmq
