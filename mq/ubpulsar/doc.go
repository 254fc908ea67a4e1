// Package ubpulsar is a drop-in for github.com/apache/pulsar-client-go:
// NewClient returns a pulsar.Client whose producers and consumers keep the
// upstream interfaces, with payload offload for the topics that opt in.
// A producer puts a payload larger than Options.Threshold into the super
// node's shared memory (an mq/offload Store) and sends the broker a small
// reference with a checksum, marked by the message property
// PropertyOffload; a consumer that receives a reference resolves it (in
// place from shared memory on the producer's host, else from its fetch
// server over transport) and hands the user a pulsar.Message whose
// Payload is the original. A reference whose payload is gone is logged
// and nacked, never delivered empty. Everything else (ordering,
// subscriptions, acknowledgements, redelivery, dead-letter topics) is
// the broker's.
//
// It is not a local topic (the broker still carries every message) and
// not durable storage for payloads: an offloaded payload lives as long
// as the store's retention keeps it (docs/mq.md, "Payload offload").
package ubpulsar
