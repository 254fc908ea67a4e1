// Package mq is ubkit's message-queue adapter. What exists today is
// [Log]: a topic of partitions, each an append-only log in shared-memory
// segments (package shm) that producers and consumers of many processes on
// one host share. A producer loans space in place ([Log.Loan]), fills it and
// commits it, or copies a payload in ([Log.Send]); a [Reader] with its own
// offset reads committed records in place.
//
// Every word mq reads from shared memory may have been written by a
// process that is buggy, hostile or dead: headers, lengths and offsets are
// validated and a bad one is an error wrapping shm.ErrCorrupt, never a
// panic. A producer killed while it holds a loan leaves a record that
// stays "writing"; a reader that meets it finds its writer dead, marks it
// aborted and skips it (Stats.Aborted counts them), so a dead producer
// never blocks a partition nor shows a torn record.
//
// Not here yet (issue 18, see docs/mq.md): file backing and durability,
// consumer groups with acks and redelivery, retention by age, the
// cross-node path over transport, and the Pulsar and RocketMQ drop-ins.
package mq
